"""Our LLaMA as a GGUF file that llama.cpp runs: weights in F32/F16/Q8_0/Q4_0 and the byte-level BPE tokenizer.

The layout follows llama.cpp's own converter for Hugging Face LLaMA checkpoints (``convert_hf_to_gguf.py``, the
``llama`` architecture): the same tensor names (``token_embd``, ``blk.N.attn_q`` …, ``output``), the same
metadata keys, and ``W_q``/``W_k`` rows permuted from the rotate-half order of our (and Hugging Face's) RoPE to the
interleaved pairs llama.cpp rotates. The tokenizer goes in as llama.cpp's ``gpt2`` model (tokens, merges, token
types) with the GPT-2 pre-tokenizer, which is what our byte-level BPE uses, so llama.cpp splits text into the same
ids.

Quantized types are llama.cpp's block formats (``Q8_0``: 32 weights share one fp16 scale; ``Q4_0``: the same at 4
bits), written by the ``gguf`` package's reference quantizer. Every 2-D weight is stored in the chosen type when its
rows are a whole number of 32-blocks (else F16, as llama.cpp's converter does); norms stay F32.

A converted model is merged back to dense first: a low-rank layer with an identity σ (SVD, or CoLA without its
nonlinearity) is exactly ``B·A``; CoLA's ``B σ(A x)`` with a nonlinear σ has no dense equivalent and is refused. A
quantized layer is dequantized (the file then re-quantizes the dequantized weights in llama.cpp's format).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.data.cache import atomic_path

GGUF_TYPES = ("f32", "f16", "q8_0", "q4_0")
_BLOCK = 32  # weights per Q8_0/Q4_0 block
_LINEARS = {  # our LLaMA's submodule → llama.cpp's tensor name in block N
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def to_gguf(
    model: nn.Module, path: str | os.PathLike, *, tokenizer: Any, dtype: str = "f16", overwrite: bool = False
) -> dict[str, Any]:
    """Write ``model`` (our :class:`~tensorslim.models.llama.LlamaForCausalLM`, dense, low rank with identity σ, or
    quantized) and ``tokenizer`` to ``path`` as GGUF.

    Args:
        model: the model to export; it is not changed.
        path: the ``.gguf`` file to write; its folder must exist.
        tokenizer: the :class:`~tensorslim.data.tokenizer.TextTokenizer` of a byte-level BPE the model was trained
            with (the default tokenizer of ``tensorslim train``).
        dtype: ``"f32"``, ``"f16"``, ``"q8_0"`` or ``"q4_0"``: the type of the 2-D weights.
        overwrite: replace an existing file.

    Returns:
        ``{"path", "bytes", "types"}``: the file, its size and how many tensors each GGUF type holds.

    Raises:
        ValueError: an unknown ``dtype``, a model or tokenizer that cannot be exported, a layer with no dense
            equivalent, an existing file without ``overwrite``, or a missing folder.
        ImportError: the ``gguf`` package is missing (``pip install tensorslim[deploy]``).
    """
    path = Path(path)
    if dtype not in GGUF_TYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {GGUF_TYPES}")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists; pass overwrite=True to replace it")
    if not path.parent.is_dir():
        raise ValueError(f"folder {path.parent} does not exist")
    config = _llama_config(model)
    vocab = _vocabulary(tokenizer, config.vocab_size)
    tensors = _tensors(model, config)  # every layer checked before the file is touched
    try:
        import gguf
    except ImportError as error:
        raise ImportError("writing GGUF needs the gguf package: pip install 'tensorslim[deploy]'") from error
    with atomic_path(path) as tmp:  # a failed write leaves no partial file (and an old one untouched)
        types = _write(gguf, tmp, config, vocab, tensors, dtype)
    return {"path": str(path), "bytes": path.stat().st_size, "types": types}


def _llama_config(model: nn.Module) -> Any:
    from tensorslim.models.llama import LlamaForCausalLM

    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"model of type {type(model).__name__} cannot be exported; allowed: our LlamaForCausalLM")
    return model.config


# --- weights -----------------------------------------------------------------------------------------------------


def dense_weight(module: nn.Module, name: str) -> torch.Tensor:
    """The ``(d_out, d_in)`` float weight of a linear site, merging a factored or quantized layer back to dense.

    Raises:
        ValueError: the layer has no exact dense equivalent (a nonlinear σ, a TT layer, a bias llama.cpp's LLaMA
            has no place for).
    """
    from tensorslim.layers.lowrank import LowRankLinear
    from tensorslim.quant.qlinear import QuantLinear, QuantLowRankLinear

    if getattr(module, "bias", None) is not None:
        raise ValueError(f"layer {name!r} has a bias; llama.cpp's LLaMA layers have none")
    if type(module) is nn.Linear or type(module) is QuantLinear:
        weight = module.weight if type(module) is nn.Linear else module.to_dense()
    elif type(module) is LowRankLinear:
        weight = module.to_dense().weight  # ValueError for a nonlinear σ
    elif type(module) is QuantLowRankLinear and module.activation == "identity":
        weight = module.b.to_dense() @ module.a.to_dense()  # (d_out, r) @ (r, d_in)
    else:
        raise ValueError(
            f"layer {name!r} of type {type(module).__name__} has no dense equivalent to export; allowed: nn.Linear, "
            "LowRankLinear or QuantLowRankLinear with activation='identity', QuantLinear"
        )
    return weight.detach().float()


def _embedding(module: nn.Module) -> torch.Tensor:
    from tensorslim.quant.qlinear import QuantEmbedding

    if type(module) is nn.Embedding:
        return module.weight.detach().float()
    if type(module) is QuantEmbedding:
        return module.to_dense().float()
    raise ValueError(f"token embedding of type {type(module).__name__} cannot be exported; allowed: nn.Embedding")


def rope_interleave(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of ``W_q``/``W_k`` from rotate-half order (pairs ``i, i + hd/2``) to interleaved pairs (``2i, 2i + 1``),
    as llama.cpp's converter permutes Hugging Face LLaMA."""
    d_out = weight.shape[0]
    return weight.reshape(n_heads, 2, d_out // n_heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _tensors(model: nn.Module, config: Any) -> dict[str, torch.Tensor]:
    """llama.cpp's tensor name → float tensor, in its order."""
    tensors = {"token_embd.weight": _embedding(model.embed_tokens)}
    for n, block in enumerate(model.layers):
        tensors[f"blk.{n}.attn_norm.weight"] = block.input_layernorm.weight.detach().float()
        for site, gguf_name in _LINEARS.items():
            weight = dense_weight(block.get_submodule(site), f"layers.{n}.{site}")
            if gguf_name in ("attn_q", "attn_k"):
                weight = rope_interleave(weight, config.n_heads)
            tensors[f"blk.{n}.{gguf_name}.weight"] = weight
        tensors[f"blk.{n}.ffn_norm.weight"] = block.post_attention_layernorm.weight.detach().float()
    tensors["output_norm.weight"] = model.norm.weight.detach().float()
    tensors["output.weight"] = dense_weight(model.lm_head, "lm_head")
    return tensors


# --- tokenizer ---------------------------------------------------------------------------------------------------


def _vocabulary(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """Tokens (by id), token types, merges and the end-of-text id of a byte-level BPE, padded to the model's rows.

    Raises:
        ValueError: not a byte-level BPE, or more tokens than the model has embedding rows.
    """
    backend = getattr(tokenizer, "backend", None)
    spec = json.loads(backend.to_str()) if hasattr(backend, "to_str") else {}
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or pre.get("add_prefix_space"):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r} cannot be exported; allowed: a byte-level BPE "
            "without prefix space (the default tokenizer of tensorslim train)"
        )
    ids = dict(model["vocab"])
    special = {added["content"]: added["id"] for added in spec.get("added_tokens", [])}
    ids.update(special)
    if max(ids.values()) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(ids.values())}; the model has {vocab_size} rows")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [5] * vocab_size  # llama.cpp's token types: 1 normal, 3 control, 5 unused
    for token, i in ids.items():
        tokens[i], types[i] = token, 3 if token in special else 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges, "eos": tokenizer.eos_id}


# --- file --------------------------------------------------------------------------------------------------------


def _write(gguf: Any, path: Path, config: Any, vocab: dict, tensors: dict, dtype: str) -> dict[str, int]:
    quant = gguf.GGMLQuantizationType
    wanted = {"f32": quant.F32, "f16": quant.F16, "q8_0": quant.Q8_0, "q4_0": quant.Q4_0}[dtype]
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[dtype]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tensorslim-llama")
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_bos_token_id(vocab["eos"])
    writer.add_add_bos_token(False)
    types: dict[str, int] = {}
    for name, tensor in tensors.items():
        kind = wanted if tensor.dim() == 2 and tensor.shape[1] % _BLOCK == 0 else quant.F16
        kind = quant.F32 if tensor.dim() == 1 or dtype == "f32" else kind
        data = tensor.numpy()
        if kind == quant.F16:
            writer.add_tensor(name, data.astype("float16"))
        elif kind == quant.F32:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        types[kind.name] = types.get(kind.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types
