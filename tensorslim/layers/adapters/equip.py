"""One verb puts parameter-efficient modules on a model; the rest reads, saves, loads and merges them.

:func:`equip_` freezes the model and adds what a :class:`PELTConfig` asks for: gated LoRA on the named linears,
gated prefixes in each self-attention, a gated bottleneck adapter after each feed-forward block, a soft prompt before
the input embeddings (UniPELT, arXiv 2110.07577 §3; prompt layer, arXiv 2405.05493). :func:`save_adapters` writes
only the trained tensors (``adapters.safetensors``) and the config (``adapters.json``); :func:`load_adapters` puts
them onto a fresh base of the same shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.layers.adapters.config import QUERY_VALUE, PELTConfig
from tensorslim.layers.adapters.modules import (
    BottleneckNorm,
    Gate,
    GatedLoRALinear,
    PrefixAttention,
    PrefixEncoder,
    PrefixNativeAttention,
    PrefixSelfAttention,
    PromptEmbedding,
    linear_weight,
    merge_lora,
)
from tensorslim.layers.lora import LoRALinear, check_rank
from tensorslim.models import bert
from tensorslim.registry import ConversionReport, LayerReport, Transform, register_transform, set_submodule
from tensorslim.tensor_files import load_tensors, save_tensors

CONFIG_FILE, WEIGHTS_FILE = "adapters.json", "adapters.safetensors"
_LAYER = re.compile(r"\.(\d+)(?:\.|$)")


def _layer_of(name: str) -> int | None:
    """The block index in a qualified name (``bert.encoder.layer.3.attention.self`` → 3), or None."""
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def _self_attentions(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The self-attention modules, block order: Hugging Face BERT-family ones (``query``/``key``/``value`` and a
    config) and our BERT's (:class:`tensorslim.models.bert.SelfAttention`)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, bert.SelfAttention)
        or all(hasattr(m, a) for a in ("query", "key", "value", "attention_head_size", "config"))
        and "Cross" not in type(m).__name__
        and not isinstance(m, PrefixAttention)
    ]


def _ffn_norms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The LayerNorm that closes each post-LN feed-forward block: a Hugging Face BERT-family ``output.LayerNorm``
    (``output`` with ``dense`` beside an ``intermediate``) or our BERT's ``norm2``."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, bert.EncoderLayer):
            found.append((f"{name}.norm2", m.norm2))
            continue
        parent_name, _, child = name.rpartition(".")
        is_output = child == "output" and hasattr(m, "dense") and isinstance(getattr(m, "LayerNorm", None), nn.Module)
        if is_output and hasattr(model.get_submodule(parent_name), "intermediate"):
            found.append((f"{name}.LayerNorm", m.LayerNorm))
    return found


def _keep(name: str, from_layer: int) -> bool:
    layer = _layer_of(name)
    return from_layer == 0 or (layer is not None and layer >= from_layer)


# The tokenizer of the equip_ call in progress: a prompt initialized from text is built with it.
_ENCODE: ContextVar[Callable[[str], list[int]] | None] = ContextVar("encode", default=None)
PROMPT, PREFIX = "pelt_prompt", "pelt_prefix"  # where the model keeps its prompt and its shared prefix encoder


def equip_(model: nn.Module, config: PELTConfig, *, encode: Callable[[str], list[int]] | None = None) -> dict:
    """Freeze ``model`` and add the modules of ``config`` in place.

    The adapters are a family of :mod:`tensorslim.registry`: this is ``convert_(model, config)`` with ``encode`` for
    the prompt (``plan`` previews it, ``save_pretrained`` records it), reported by kind.

    Args:
        model: a Hugging Face BERT-family model or one of our BERTs (every module), our LLaMA (LoRA, prompt), or
            any model with the LoRA target linears (LoRA).
        config: what to add.
        encode: text → token ids, needed when the prompt is initialized from text.

    Returns:
        :func:`trainable_parameters` of the equipped model, plus ``"layers"``: the adapted module names per kind.

    Raises:
        ValueError: a target that matches no linear, a model without the layers a module needs, a prompt that does
            not fit the position table, a model equipped already, ``train_pooler`` on a model without a pooler.
    """
    from tensorslim.convert import convert_

    if not isinstance(config, PELTConfig):
        raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: PELTConfig (e.g. unipelt())")
    token = _ENCODE.set(encode)
    try:
        kinds = {name: _kind_of(name, module) for name, module in _select(model, config)}
        report = convert_(model, config)
    finally:
        _ENCODE.reset(token)
    layers: dict[str, list[str]] = {}
    for row in report.layers:
        if row.name != PREFIX:
            layers.setdefault(kinds[row.name], []).append(row.name)
    return {**trainable_parameters(model), "layers": layers}


def _kind_of(name: str, module: nn.Module) -> str:
    """Which module goes at ``name`` (see :func:`_select`)."""
    if name in (PROMPT, PREFIX):
        return name.removeprefix("pelt_")
    if _is_attention(module):
        return "prefix"
    return "lora" if isinstance(module, nn.Linear) else "bottleneck"


def _select(model: nn.Module, config: PELTConfig) -> list[tuple[str, nn.Module]]:
    """Every layer the config changes, in the order they are built: the prompt (at the word embedding), the LoRA
    linears, the prefix encoder (on ``meta``: its books), the self-attentions, the feed-forward norms.

    Raises:
        ValueError: a model equipped already, ``train_pooler`` without a pooler, or a module without its layers.
    """
    if getattr(model, "pelt_config", None) is not None:
        raise ValueError(f"{type(model).__name__} is equipped already; allowed: equip_ a fresh base model once")
    if config.train_pooler and _pooler_of(model) is None:
        raise ValueError(f"train_pooler=True needs a base model with a pooler; {type(model).__name__} has none")
    chosen = [(PROMPT, _prompt_site(model, config)[0])] if config.prompt is not None else []
    chosen += _lora_targets(model, config) if config.lora is not None else []
    if config.prefix is not None:
        attentions = _prefix_targets(model, config)
        with torch.device("meta"):
            chosen.append((PREFIX, _prefix_encoder(model, config, attentions)))
        chosen += attentions
    return chosen + (_bottleneck_targets(model, config) if config.bottleneck is not None else [])


def _plan_module(name: str, module: nn.Module, config: PELTConfig) -> LayerReport:
    """The books of one module: what it adds to the layer it wraps (the prompt and the prefix encoder are new)."""
    before = 0 if name in (PROMPT, PREFIX) else sum(p.numel() for p in module.parameters())
    d_in, d_out = _widths(name, module)
    if name == PROMPT:
        added, shape = config.prompt.length * d_out, f"{config.prompt.length} prompt tokens"
    elif name == PREFIX:
        added, shape = sum(p.numel() for p in module.parameters()), f"{module.length} prefixes x {module.n_layers}"
    elif isinstance(module, nn.Linear) and config.lora is not None and not _is_attention(module):
        rank = config.lora.rank
        added, shape = rank * (d_in + d_out) + _gate(d_in, config.lora.gate), f"+ {d_in}->{rank}->{d_out}"
    elif _is_attention(module):
        added, shape = _gate(d_in, config.prefix.gate), "+ prefix"
    else:
        hidden = max(1, d_in // config.bottleneck.reduction)
        added = 2 * hidden * d_in + hidden + d_in + _gate(d_in, config.bottleneck.gate)
        shape = f"+ {d_in}->{hidden}->{d_in}"
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(d_in, d_out),
        new_shape=shape,
        rank=config.lora.rank if config.lora is not None and isinstance(module, nn.Linear) else 0,
        params_before=before,
        params_after=before + added,
    )


def _gate(dim: int, gated: bool) -> int:
    return dim + 1 if gated else 0  # Gate: Linear(dim, 1)


def _is_attention(module: nn.Module) -> bool:
    return isinstance(module, bert.SelfAttention) or hasattr(module, "attention_head_size")


def _widths(name: str, module: nn.Module) -> tuple[int, int]:
    if name == PROMPT:
        return tuple(module.weight.shape)  # (V, d)
    if name == PREFIX:
        return module.dim, module.n_layers * 2 * module.dim
    if _is_attention(module):
        width = linear_weight(module.q if isinstance(module, bert.SelfAttention) else module.query).shape[1]
        return width, width
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.weight.shape[0]  # a LayerNorm


def _build_module(model: nn.Module, name: str, module: nn.Module, config: PELTConfig) -> nn.Module:
    """The module at ``name``; built in :func:`_select`'s order, so the prefix encoder precedes the attentions and
    each attention's index is the number of prefix attentions built before it."""
    if name == PROMPT:
        return _build_prompt(model, config)
    if name == PREFIX:
        return _prefix_encoder(model, config, _prefix_targets(model, config))
    if _is_attention(module):
        wrapper = PrefixNativeAttention if isinstance(module, bert.SelfAttention) else PrefixSelfAttention
        index = sum(isinstance(m, PrefixAttention) for m in model.modules())
        return wrapper(module, model.get_submodule(PREFIX), index, gate=config.prefix.gate)
    if isinstance(module, nn.Linear):
        lora = config.lora
        return GatedLoRALinear(module, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, gate=lora.gate)
    return BottleneckNorm(module, reduction=config.bottleneck.reduction, gate=config.bottleneck.gate)


def _freeze(model: nn.Module, config: PELTConfig) -> None:
    """The base is frozen before the modules are built (they train)."""
    del config
    model.requires_grad_(False)


def _finish(model: nn.Module, config: PELTConfig, report: ConversionReport) -> None:
    """The head (and pooler) train, the model keeps its config, and the new modules follow the model's mode."""
    del report
    for param in _kept_trainable(model, config):
        param.requires_grad_(True)
    model.pelt_config = config
    model.train(model.training)  # an eval model keeps the new modules' dropout off


def _kept_trainable(model: nn.Module, config: PELTConfig) -> list[nn.Parameter]:
    head = _head_parameters(model) if config.train_head else []
    pooler = _pooler_of(model) if config.train_pooler else None
    return head + (list(pooler.parameters()) if pooler is not None else [])


def _describe_module(model: nn.Module, name: str, layer: nn.Module) -> tuple[PELTConfig, dict[str, Any]]:
    """The model's config, one for all its modules (one call rebuilds them). Where the prompt started does not
    matter once it is trained (the weights replace it), so the record needs no tokenizer."""
    del name, layer
    config = model.pelt_config
    if config.prompt is not None:
        config = replace(config, prompt=replace(config.prompt, init_text=None, init_vocab=None))
    return config, {}


def _lora_targets(model: nn.Module, config: PELTConfig) -> list[tuple[str, nn.Linear]]:
    """The linears gated LoRA adapts; each checked against the rank."""
    lora = config.lora
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, LoRALinear)]
    names = {n.rsplit(".", 1)[-1] for n, _ in linears}
    wanted = lora.targets or next((pair for pair in QUERY_VALUE if set(pair) <= names), None)
    targets = [(n, m) for n, m in linears if n.rsplit(".", 1)[-1] in (wanted or ()) and _keep(n, config.from_layer)]
    if not targets:
        what = f"targets={lora.targets!r}" if lora.targets else f"targets=None (the first of {list(QUERY_VALUE)})"
        raise ValueError(
            f"{what} match no nn.Linear of {type(model).__name__} from layer {config.from_layer}; "
            f"allowed here: {sorted(names)}"
        )
    for name, module in targets:
        check_rank(name, lora.rank, module.in_features, module.out_features)
    return targets


def _no_layers(model: nn.Module, what: str) -> ValueError:
    return ValueError(
        f"{what} needs BERT-family layers (a Hugging Face self-attention with query/key/value and BertOutput, or "
        f"tensorslim's BERT); {type(model).__name__} has none it recognizes"
    )


def _prefix_targets(model: nn.Module, config: PELTConfig) -> list[tuple[str, nn.Module]]:
    attentions = [(n, m) for n, m in _self_attentions(model) if _keep(n, config.from_layer)]
    if not attentions:
        raise _no_layers(model, "prefix tuning")
    return attentions


def _prefix_encoder(model: nn.Module, config: PELTConfig, attentions: list[tuple[str, nn.Module]]) -> PrefixEncoder:
    """The encoder of every adapted layer's prefixes, on the device of the attentions' weights (or the current
    default device when they are on ``meta``... as :func:`_select` builds its books)."""
    del model
    first = attentions[0][1]
    native = isinstance(first, bert.SelfAttention)
    weight = linear_weight(first.k if native else first.key)
    return PrefixEncoder(
        length=config.prefix.length,
        dim=weight.shape[1],
        n_layers=len(attentions),
        n_heads=first.n_heads if native else first.num_attention_heads,
        mlp_dim=config.prefix.mlp_dim,
        device=None if torch.get_default_device().type == "meta" else weight.device,
        dtype=weight.dtype,
    )


def _bottleneck_targets(model: nn.Module, config: PELTConfig) -> list[tuple[str, nn.Module]]:
    norms = [(n, m) for n, m in _ffn_norms(model) if _keep(n, config.from_layer)]
    if not norms:
        raise _no_layers(model, "the bottleneck adapter")
    return norms


def _encoder_of(model: nn.Module) -> nn.Module:
    """The Hugging Face base model (``model.bert`` of a classifier) that takes ``inputs_embeds``."""
    base = getattr(model, "base_model", None)
    if base is None or not hasattr(base, "get_input_embeddings") or not hasattr(base, "embeddings"):
        raise _no_layers(model, "prompt tuning")
    return base


def _our_bert_encoder(model: nn.Module) -> bert.BertEncoder | None:
    """The encoder of one of our BERTs (:mod:`tensorslim.models.bert`, either head), or None."""
    encoder = getattr(model, "encoder", None)
    return encoder if isinstance(encoder, bert.BertEncoder) else None


def _native_prompt_site(model: nn.Module) -> tuple[nn.Module, nn.Module, int, str] | None:
    """Where a soft prompt goes in one of our own models: the module whose forward starts from token ids, its word
    embedding, its position limit and how the limit is named; None for any other model.

    Our LLaMA (:mod:`tensorslim.models.llama`): the model itself and ``embed_tokens``. Our BERT
    (:mod:`tensorslim.models.bert`, either head): its encoder and ``encoder.embeddings.word``.
    """
    encoder = _our_bert_encoder(model)
    if encoder is not None:
        limit = encoder.config.max_seq_len
        return encoder, encoder.embeddings.word, limit, f"the {limit}-position table"
    if hasattr(model, "embed_tokens") and hasattr(getattr(model, "config", None), "max_seq_len"):
        return model, model.embed_tokens, model.config.max_seq_len, f"max_seq_len={model.config.max_seq_len}"
    return None


def _prompt_site(model: nn.Module, config: PELTConfig) -> tuple[nn.Module, tuple | None, int]:
    """The word embedding the prompt reads its width (and init) from, where it goes (see
    :func:`_native_prompt_site`; None: a Hugging Face encoder) and the position limit; every check of the prompt.

    Raises:
        ValueError: no weight table, a prompt that leaves no position, an init that cannot be made.
    """
    spec = config.prompt
    native = _native_prompt_site(model)
    if native is not None:
        _, embedding, positions, _ = native
        if not isinstance(getattr(embedding, "weight", None), torch.Tensor):  # a TT embedding keeps no table
            raise ValueError(
                f"prompt tuning needs a token embedding with a weight table; {type(model).__name__}'s is a "
                f"{type(embedding).__name__}; allowed: nn.Embedding"
            )
    else:
        encoder = _encoder_of(model)
        embedding = encoder.get_input_embeddings()
        positions = encoder.embeddings.position_embeddings.num_embeddings
    if spec.length >= positions:
        raise ValueError(
            f"prompt length={spec.length} leaves no position for the input; allowed: < {positions} (the position table)"
        )
    vocab = embedding.weight.shape[0]
    if spec.init_vocab is not None and spec.init_vocab[1] > vocab:
        raise ValueError(
            f"prompt init_vocab={spec.init_vocab!r} reaches past the {vocab}-token vocabulary; allowed: stop <= {vocab}"
        )
    if spec.init_text is not None and _ENCODE.get() is None:
        raise ValueError("prompt init_text needs a tokenizer; allowed: equip_(..., encode=text → token ids)")
    return embedding, native, positions


def _build_prompt(model: nn.Module, config: PELTConfig) -> PromptEmbedding:
    """The initialized soft prompt, its hooks on the model in place (the model keeps it as ``pelt_prompt``)."""
    spec = config.prompt
    embedding, native, positions = _prompt_site(model, config)
    words = embedding.weight  # (V, d)
    after_first = spec.combine == "prefix_after_bos"
    prompt = PromptEmbedding(
        spec.length, words.shape[1], after_first=after_first, device=words.device, dtype=words.dtype
    )
    if words.device.type != "meta":
        _init_prompt(prompt, spec, words, _ENCODE.get())
    if native is not None:
        _hook_native_prompt(*native, prompt)
    else:
        _encoder_of(model).register_forward_pre_hook(_prompt_hook(prompt, positions), with_kwargs=True)
    return prompt


def _hook_native_prompt(site: nn.Module, embedding: nn.Module, limit: int, table: str, prompt: PromptEmbedding):
    """Prompt tuning on our own models: in a forward of ``site`` that starts a sequence (no KV cache or an empty
    one: every forward of an encoder), the prompt goes into the word embeddings, the attention mask and token types
    get its columns, and ``site``'s output rows at its positions are dropped, so it still returns one row per input
    token (a classifier pools, and an MLM head predicts, the input's own rows). A KV cache keeps the prompt's keys
    and values, so the tokens that follow attend to it too."""
    starts = [False]  # whether the current forward starts a sequence (set before it, read by the two hooks)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        cache = kwargs.get("cache")
        starts[0] = cache is None or cache.length == 0
        ids = args[0] if args else kwargs.get("input_ids", kwargs.get("ids"))
        if starts[0]:
            _check_prompt_fits(prompt, ids.shape[1], limit, table)
            _extend_masks(kwargs, prompt, ids.shape[0], ids.device)
        return args, kwargs

    def embedded(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return prompt.insert(output) if starts[0] else output  # (B, n + T, d)

    def after(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        return prompt.remove(output) if starts[0] else output  # (B, T, ...)

    site.register_forward_pre_hook(before, with_kwargs=True)
    embedding.register_forward_hook(embedded)
    site.register_forward_hook(after, with_kwargs=True)


def _check_prompt_fits(prompt: PromptEmbedding, length: int, limit: int, table: str) -> None:
    if prompt.length + length > limit:
        raise ValueError(
            f"prompt length {prompt.length} + sequence length {length} exceeds {table}; "
            f"allowed: sequences of at most {limit - prompt.length} tokens"
        )


def _extend_masks(kwargs: dict, prompt: PromptEmbedding, batch: int, device: torch.device) -> None:
    """The prompt's columns in the forward's ``attention_mask`` (visible) and ``token_type_ids`` (type 0), in place;
    an absent mask means every position is seen, the prompt's too."""
    ones = torch.ones(batch, prompt.length, dtype=torch.long, device=device)
    for key, fill in (("attention_mask", ones), ("token_type_ids", torch.zeros_like(ones))):
        if kwargs.get(key) is not None:
            kwargs[key] = prompt.around(kwargs[key], fill.to(kwargs[key].dtype))


def _init_prompt(prompt: PromptEmbedding, spec: Any, words: torch.Tensor, encode: Callable | None) -> None:
    with torch.no_grad():
        if spec.init_vocab is not None:
            start, stop = spec.init_vocab
            ids = torch.randint(start, stop, (spec.length,), dtype=torch.long)  # peft's SAMPLE_VOCAB draw
            prompt.weight.copy_(words[ids.to(words.device)])
            return
        if spec.init_text is None:
            prompt.weight.uniform_(-spec.init_scale, spec.init_scale)
            return
        ids = list(encode(spec.init_text))
        ids = (ids * -(-spec.length // len(ids)))[: spec.length]  # repeated, then cut: peft's TEXT init
        prompt.weight.copy_(words[torch.tensor(ids, device=words.device)])


def _prompt_hook(prompt: PromptEmbedding, positions: int) -> Callable:
    """A forward pre-hook on the base model: embeds the ids, puts the prompt in, extends the masks."""
    table = f"the {positions}-position table"

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ids = args[0] if args else kwargs.get("input_ids")
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            embeds = module.get_input_embeddings()(ids)  # (B, T, d)
        batch, length = embeds.shape[:2]
        _check_prompt_fits(prompt, length, positions, table)
        kwargs.update(input_ids=None, inputs_embeds=prompt.insert(embeds))
        _extend_masks(kwargs, prompt, batch, embeds.device)
        kwargs["position_ids"] = None  # positions 0..n+T-1 over prompt and input, as peft
        return (), kwargs

    return hook


def _pooler_of(model: nn.Module) -> nn.Module | None:
    """The base model's pooler (``model.bert.pooler`` of a BERT classifier), or None."""
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    return pooler if isinstance(pooler, nn.Module) else None


def _head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The task head: a Hugging Face model's parameters outside its base model (``classifier`` …), or those of our
    BERT outside its encoder (``classifier``, or the MLM head)."""
    if _our_bert_encoder(model) is not None:
        prefix = "encoder"
    else:
        base = getattr(model, "base_model", None)
        prefix = getattr(model, "base_model_prefix", "")
        if base is None or base is model or not prefix:
            return []
    return [p for name, p in model.named_parameters() if not name.startswith(prefix + ".")]


def trainable_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable parameters per kind (``lora``, ``prefix``, ``bottleneck``, ``prompt``, ``pooler`` when trained,
    ``other``: the head or anything unfrozen), their ``trainable`` sum and the model's ``total`` (peft's
    ``print_trainable_parameters``)."""
    kinds = {"lora": 0, "prefix": 0, "bottleneck": 0, "prompt": 0, "pooler": 0, "other": 0}
    seen: set[int] = set()

    def count(kind: str, params: Any) -> None:
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                kinds[kind] += p.numel()

    for module in model.modules():
        if isinstance(module, LoRALinear):
            count("lora", [p for n, p in module.named_parameters() if not n.startswith("base.")])
        elif isinstance(module, PrefixEncoder):
            count("prefix", module.parameters())
        elif isinstance(module, PrefixAttention) and module.prefix_gate is not None:
            count("prefix", module.prefix_gate.parameters())
        elif isinstance(module, BottleneckNorm):
            count("bottleneck", [p for n, p in module.named_parameters() if not n.startswith("inner.")])
        elif isinstance(module, PromptEmbedding):
            count("prompt", module.parameters())
    pooler = _pooler_of(model)
    if pooler is not None:
        count("pooler", pooler.parameters())
    count("other", model.parameters())
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {**kinds, "trainable": sum(kinds.values()), "total": total}


def gate_values(model: nn.Module, inputs: torch.Tensor) -> dict[str, float]:
    """Mean gate per module of one forward on ``inputs`` (the model's first argument), for inspection."""
    values: dict[str, list[float]] = {}
    handles = [
        m.register_forward_hook(
            lambda _module, _a, out, name=name: values.setdefault(name, []).append(out.mean().item())
        )
        for name, m in model.named_modules()
        if isinstance(m, Gate)
    ]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return {name: sum(v) / len(v) for name, v in values.items()}


def merge_lora_(model: nn.Module) -> list[str]:
    """Fold every ungated LoRA update into its base weight in place (exact: ``W ← W + (α/r)·B·A``); the names.

    Raises:
        ValueError: a gated LoRA (its update depends on the input) or a LaX crossing.
    """
    adapters = [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    for _, module in adapters:  # every check before any weight changes
        if isinstance(module, GatedLoRALinear) and module.lora_gate is not None:
            raise ValueError("a gated LoRA update depends on the input (g(x)·B·A·x); allowed: merge ungated LoRA only")
        if module.crossing:
            raise ValueError("a LaX-LoRA latent crossing depends on another layer; allowed: merge plain LoRA only")
    for name, module in adapters:
        set_submodule(model, name, merge_lora(module))
    return [name for name, _ in adapters]


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors only (adapters, gates, prompt, head), by qualified name."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def save_adapters(model: nn.Module, folder: str | Path) -> Path:
    """Write the trainable tensors (``adapters.safetensors``) and the config (``adapters.json``) to ``folder``."""
    config = getattr(model, "pelt_config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no adapters; allowed: a model equipped by equip_")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: t.contiguous().cpu() for name, t in adapter_state_dict(model).items()}
    save_tensors(state, folder / WEIGHTS_FILE)
    record = {"config": config.to_dict(), "base": type(model).__name__}
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return folder


def load_adapters(model: nn.Module, folder: str | Path) -> dict:
    """Equip a fresh base ``model`` as the adapters in ``folder`` were and load their tensors; the equip report.

    Raises:
        ValueError: the folder's tensors do not fit this base (another hidden size, layer count or head), or the
            weights file is damaged (:func:`tensorslim.tensor_files.load_tensors`).
    """
    folder = Path(folder)
    record = json.loads((folder / CONFIG_FILE).read_text())
    state = load_tensors(folder / WEIGHTS_FILE)
    config = PELTConfig.from_dict(record["config"])
    # Where the prompt started does not matter (its trained tensor replaces it), so a prompt from text needs no
    # tokenizer here; the model keeps the saved config.
    start = replace(config, prompt=replace(config.prompt, init_text=None, init_vocab=None)) if config.prompt else config
    report = equip_(model, start)
    model.pelt_config = config
    mine = dict(model.named_parameters())
    for name, tensor in state.items():
        here = mine.get(name)
        if here is None or here.shape != tensor.shape:
            shape = "absent" if here is None else tuple(here.shape)
            raise ValueError(
                f"adapters in {folder} were trained on a base of another shape: {name} is {tuple(tensor.shape)} "
                f"there, {shape} here; allowed: a base of the same architecture and size"
            )
    missing = sorted(set(adapter_state_dict(model)) - set(state))
    if missing:
        raise ValueError(f"adapters in {folder} lack {missing[0]} (and {len(missing) - 1} more) this base needs")
    with torch.no_grad():
        for name, tensor in state.items():
            mine[name].copy_(tensor)
    return report


register_transform(
    PELTConfig,
    Transform(
        accepts=lambda module: False,  # the config names its layers (select)
        plan_layer=_plan_module,
        build=None,
        build_in=_build_module,
        finalize=_finish,
        layer_type=(GatedLoRALinear, PrefixAttention, BottleneckNorm, PromptEmbedding, PrefixEncoder),
        describe=_describe_module,
        select=_select,
        grows=True,
        freezes=True,
        keeps_trainable=_kept_trainable,
        prepare=_freeze,
        wraps=("base", "inner"),
    ),
)
