"""``tensorslim export --run R --out DIR``: a run's model as a folder to ship.

``DIR`` gets the :func:`tensorslim.save_pretrained` folder (what :func:`tensorslim.load_pretrained` and
:func:`tensorslim.predict.predictor` read). With ``--merge-lora`` the LoRA updates are folded into their weights
first (exact). When the model is then a plain Hugging Face model (no tensorslim layer left), ``DIR/hf`` also gets
``save_pretrained`` files and the tokenizer, which ``transformers.AutoModel*.from_pretrained`` loads. So does our
own BERT masked LM when no layer of it is converted: its post-LN blocks and MLM head are BERT's, so its weights are
renamed into a ``transformers.BertForMaskedLM`` with an untied decoder (:func:`hf_bert_mlm`).

``--format gguf`` instead writes ``DIR/model-<type>.gguf`` for llama.cpp (:func:`tensorslim.export.to_gguf`): our
LLaMA with its byte-level BPE, in ``--gguf-type`` F16, Q8_0, Q4_0 or F32.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

HELP = "write a run's model as a folder to ship (tensorslim format, and Hugging Face format where it is plain)"
HF_FOLDER = "hf"
FORMATS = ("tensorslim", "gguf")
GGUF_TYPES = ("f16", "q8_0", "q4_0", "f32")  # as tensorslim.export.GGUF_TYPES, without importing torch for --help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", dest="run_dir", required=True, metavar="DIR", help="run folder, model/ or checkpoint")
    parser.add_argument("--out", required=True, help="the folder to write (must not exist or be empty)")
    parser.add_argument("--merge-lora", action="store_true", help="fold LoRA updates into their weights (exact)")
    parser.add_argument(
        "--format", default="tensorslim", choices=FORMATS, help="tensorslim folder, or GGUF (llama.cpp)"
    )
    parser.add_argument("--gguf-type", default="f16", choices=GGUF_TYPES, help="weight type of --format gguf")


def is_plain_hf(model: object) -> bool:
    """Whether ``model`` is a transformers model made only of transformers' and torch's own modules."""
    from tensorslim.pretrained import _is_hf

    return _is_hf(model) and all(type(m).__module__.startswith(("transformers.", "torch.nn.")) for m in model.modules())


def is_plain_bert_mlm(model: object) -> bool:
    """Whether ``model`` is our BERT masked LM (:mod:`tensorslim.models.bert`) with no layer converted."""
    from tensorslim.models.bert import BertForMaskedLM

    own = ("tensorslim.models.bert", "tensorslim.functional.dropout")
    return isinstance(model, BertForMaskedLM) and all(
        type(m).__module__ in own or type(m).__module__.startswith("torch.nn.") for m in model.modules()
    )


def hf_bert_mlm(model: object) -> object:
    """Our plain BERT masked LM as a ``transformers.BertForMaskedLM`` with the same weights (eval mode): the same
    blocks under Hugging Face's names, GELU (erf) activations and an untied decoder."""
    import transformers

    from tensorslim.models.hf_bert import hf_config

    encoder = model.encoder
    config = hf_config(encoder.config)
    config.tie_word_embeddings = False
    names = {
        "encoder.embeddings.word": "bert.embeddings.word_embeddings",
        "encoder.embeddings.position": "bert.embeddings.position_embeddings",
        "encoder.embeddings.token_type": "bert.embeddings.token_type_embeddings",
        "encoder.embeddings.norm": "bert.embeddings.LayerNorm",
        "transform": "cls.predictions.transform.dense",
        "transform_norm": "cls.predictions.transform.LayerNorm",
        "lm_head": "cls.predictions.decoder",
    }
    blocks = {
        "attn.q": "attention.self.query",
        "attn.k": "attention.self.key",
        "attn.v": "attention.self.value",
        "attn.o": "attention.output.dense",
        "norm1": "attention.output.LayerNorm",
        "ffn.fc1": "intermediate.dense",
        "ffn.fc2": "output.dense",
        "norm2": "output.LayerNorm",
    }
    for i in range(len(encoder.layers)):
        names |= {f"encoder.layers.{i}.{ours}": f"bert.encoder.layer.{i}.{theirs}" for ours, theirs in blocks.items()}
    state = {}
    for key, tensor in model.state_dict().items():
        module, _, field = key.rpartition(".")
        state[f"{names[module]}.{field}"] = tensor
    state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]
    hf = transformers.BertForMaskedLM(config)
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def export(run_dir: str, out: str, *, merge_lora: bool = False) -> list[Path]:
    """Write the run's model to ``out``; the folders written (``out``, and ``out/hf`` for a plain HF model)."""
    from tensorslim.layers.adapters.equip import merge_lora_
    from tensorslim.predict import predictor
    from tensorslim.pretrained import locate_model, save_pretrained

    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"out={out!r} is not empty; allowed: a new or empty folder")
    manifest, folder, _, _ = locate_model(run_dir)  # a bad run fails before anything is written
    model = predictor(run_dir)
    if merge_lora:
        merge_lora_(model.model)
        save_pretrained(model.model, target, base=_registered_base(manifest["base"]), run=manifest.get("run"))
        if manifest.get("run", {}).get("tokenizer"):
            _copy_tokenizer(Path(folder), target)
    else:
        shutil.copytree(folder, target, dirs_exist_ok=True)
    written = [target]
    twin = hf_bert_mlm(model.model) if is_plain_bert_mlm(model.model) else model.model
    if is_plain_hf(twin):
        hf = target / HF_FOLDER
        twin.save_pretrained(hf)
        if model.tokenizer is not None:
            _copy_tokenizer(Path(folder), hf)
        written.append(hf)
    return written


def export_gguf(run_dir: str, out: str, *, dtype: str = "f16") -> list[Path]:
    """Write the run's LLaMA and tokenizer to ``out/model-<dtype>.gguf``; a refused export leaves no folder behind."""
    from tensorslim.export import to_gguf
    from tensorslim.predict import predictor
    from tensorslim.pretrained import locate_model

    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"out={out!r} is not empty; allowed: a new or empty folder")
    locate_model(run_dir)  # a bad run fails before anything is written
    model = predictor(run_dir)
    if model.tokenizer is None:
        raise ValueError(f"run {run_dir!r} has no tokenizer; GGUF export needs the run's byte-level BPE")
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        path = Path(
            to_gguf(model.model, target / f"model-{dtype}.gguf", tokenizer=model.tokenizer, dtype=dtype)["path"]
        )
    except Exception:
        if created:
            target.rmdir()
        raise
    return [path]


def _registered_base(record: dict) -> object:
    """The registered model a merged model is described against (None: a Hugging Face base, described as itself)."""
    from tensorslim.pretrained import RegisteredBase

    if record.get("kind") != "method":
        return None
    overrides = {k: v for k, v in record["overrides"].items() if k in ("vocab_size", "max_seq_len", "n_classes")}
    return RegisteredBase(name=record["name"], task=record["task"], **overrides)


def _copy_tokenizer(source: Path, target: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)


def run(args: argparse.Namespace) -> int:
    if args.format == "gguf":
        written = export_gguf(args.run_dir, args.out, dtype=args.gguf_type)
    else:
        written = export(args.run_dir, args.out, merge_lora=args.merge_lora)
    for folder in written:
        print(f"wrote {folder}")
    return 0
