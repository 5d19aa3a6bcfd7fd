"""COMQ's defaults against GPTQ on MiniLM: end-to-end output error on held-out text, and solver time per layer.

All 36 encoder linear layers are quantized from the float model's calibration Gram matrices (128 BBC train
articles, 128 tokens each); the quantized model's last hidden state is compared with the float model's on two
held-out sets of BBC articles: ``validation`` (111 articles, on which the new default was chosen) and ``fresh``
(the last 128 training articles, never used for calibration or for choosing). End-to-end error is
``‖Y_q − Y‖_F / ‖Y‖_F`` over all non-padding tokens. Solver time per layer is measured on one layer of each shape,
interleaved (gptq, comq, ... per repetition), minimum of ``--reps``, Gram collection excluded.

Usage:
    OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python experiments/quant_comq_defaults.py \
        --out experiments/results/quant_comq_defaults.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

import torch
from torch import nn

from tensorslim.quant import COMQConfig, GPTQConfig, comq_quantize, gptq_quantize
from tensorslim.quant.calibration import collect_grams, relative_output_error, weight_matrix

VARIANTS = {
    "gptq": (gptq_quantize, lambda b: GPTQConfig(bits=b)),
    "comq-release": (
        comq_quantize,
        lambda b: COMQConfig(bits=b, init="float", order="greedy", update_scale=False),
    ),
    "comq-old-default": (comq_quantize, lambda b: COMQConfig(bits=b, init="float", order="greedy")),
    "comq-gptq-greedy1": (comq_quantize, lambda b: COMQConfig(bits=b, order="greedy")),
    "comq-default": (comq_quantize, lambda b: COMQConfig(bits=b)),
}
TIMED = ("encoder.layer.0.attention.self.query", "encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense")


def last_hidden(model: nn.Module, batches: list[dict]) -> torch.Tensor:
    """``(tokens, 384)`` last hidden states of the non-padding tokens."""
    with torch.no_grad():
        return torch.cat([model(**b).last_hidden_state[b["attention_mask"].bool()] for b in batches])


def timing(weights: dict, grams: dict, bits: int, reps: int, variants: list[str]) -> list[dict]:
    rows = []
    for name in TIMED:
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(reps):
            for v in variants:
                solver, make = VARIANTS[v]
                start = time.perf_counter()
                solver(weights[name], grams[name], make(bits))
                times[v].append(time.perf_counter() - start)
        rows.append(
            {
                "bits": bits,
                "layer": name,
                "shape": list(weights[name].shape),
                "min_s": {v: min(t) for v, t in times.items()},
                "all_s": times,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 3])
    parser.add_argument(
        "--variants", nargs="*", default=["gptq", "comq-default", "comq-old-default"], help="none: timing only"
    )
    parser.add_argument("--timed", nargs="+", default=["gptq", "comq-default", "comq-old-default"])
    parser.add_argument("--reps", type=int, default=3, help="0: no timing")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import load_corpus
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    model = BertModel.from_pretrained(model_folder("minilm")).eval()
    tok = AutoTokenizer.from_pretrained(model_folder("minilm"))
    corpus = load_corpus("bbcnews")
    calib = calibration_batches(tok, corpus.train[:128], seq_len=128)
    held = {
        "validation": calibration_batches(tok, corpus.validation[:111], seq_len=128),
        "fresh": calibration_batches(tok, corpus.train[-128:], seq_len=128),
    }
    layers = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and "pooler" not in n}
    if not args.variants:  # timing only: the Gram matrices of the timed layers suffice
        layers = {n: layers[n] for n in TIMED}
    grams = {n: s.gram for n, s in collect_grams(model, layers, calib).items()}
    weights = {n: weight_matrix(m).clone() for n, m in layers.items()}
    reference = {k: last_hidden(model, b) for k, b in held.items()} if args.variants else {}
    result = {"summary": [], "timing": []}
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; 2-core VM shared with other jobs",
    }
    for bits in args.bits:
        for variant in args.variants:
            solver, make = VARIANTS[variant]
            seconds, calib_err = 0.0, []
            for name, layer in layers.items():
                start = time.perf_counter()
                q = solver(weights[name], grams[name], make(bits)).dequantize(dtype=torch.float64)
                seconds += time.perf_counter() - start
                calib_err.append(relative_output_error(weights[name], q, grams[name]))
                layer.weight.data = q.to(torch.float32)
            row = {"bits": bits, "variant": variant, "config": repr(make(bits)), "solver_s_all_layers": seconds}
            row["mean_layer_err_calib"] = sum(calib_err) / len(calib_err)
            for split, batches in held.items():
                out, ref = last_hidden(model, batches), reference[split]
                row[f"e2e_err_{split}"] = float((out - ref).norm() / ref.norm())
            for name, layer in layers.items():
                layer.weight.data = weights[name].clone()
            result["summary"].append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, **result}, f, indent=1)
    for bits in args.bits if args.reps else []:
        result["timing"] += timing(weights, grams, bits, args.reps, args.timed)
    meta["loadavg_at_end"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump({"meta": meta, **result}, f, indent=1)


if __name__ == "__main__":
    main()
