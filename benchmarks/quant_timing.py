"""Solver time per layer, GPTQ vs COMQ, on MiniLM's three layer shapes with real calibration Gram matrices.

Runs are interleaved (gptq, comq, gptq, comq, ...) and the minimum of ``--reps`` is kept, because the shared CPU's
load changes within seconds. Gram collection is excluded (it is shared by both methods).

Usage:
    python benchmarks/quant_timing.py --out benchmarks/results/quant_timing
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _results import table, write

from tensorslim.quant import COMQConfig, GPTQConfig, comq_quantize, gptq_quantize
from tensorslim.quant.calibration import collect_grams, weight_matrix

SOLVERS = {
    "gptq": (gptq_quantize, GPTQConfig(bits=4)),
    "comq-greedy1": (comq_quantize, COMQConfig(init="float", order="greedy", bits=4)),
    "comq-cyclic1": (comq_quantize, COMQConfig(init="float", bits=4, order="cyclic")),
}
LAYERS = ("encoder.layer.0.attention.self.query", "encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import load_corpus
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    model = BertModel.from_pretrained(model_folder("minilm")).eval()
    tok = AutoTokenizer.from_pretrained(model_folder("minilm"))
    batches = calibration_batches(tok, load_corpus("bbcnews").train[:32], seq_len=128)
    layers = {n: model.get_submodule(n) for n in LAYERS}
    grams = collect_grams(model, layers, batches)
    rows = []
    for name in LAYERS:
        w, h = weight_matrix(layers[name]), grams[name].gram
        times = {m: [] for m in SOLVERS}
        for _ in range(args.reps):
            for method, (solver, config) in SOLVERS.items():
                start = time.perf_counter()
                solver(w, h, config)
                times[method].append(time.perf_counter() - start)
        rows.append(
            {"layer": name, "shape": list(w.shape), **{f"{m}_min_s": min(t) for m, t in times.items()}, "all": times}
        )
        print(json.dumps(rows[-1]), flush=True)
    cells = [
        [r["layer"], tuple(r["shape"]), *(f"{r[f'{m}_min_s']:.3f}" for m in SOLVERS)]
        + [f"{r['comq-greedy1_min_s'] / r['gptq_min_s']:.2f}"]
        for r in rows
    ]
    lines = table(
        ["layer", "shape (out, in)", "GPTQ s", "COMQ greedy ×1 s", "COMQ cyclic ×1 s", "greedy / GPTQ"], cells
    )
    print("\n".join(lines))
    note = f"{args.threads} thread(s); interleaved, min of {args.reps} reps; Gram collection excluded"
    write(Path(args.out), "Solver time per layer, GPTQ vs COMQ (MiniLM)", lines, data=rows, notes=[note])


if __name__ == "__main__":
    main()
