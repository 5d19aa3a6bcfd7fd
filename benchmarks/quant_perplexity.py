"""Held-out perplexity of a trained LM run before and after weight-only quantization (round to nearest, the arms of
``benchmarks/inference.py``): float, W8 and W4 with the token embeddings and head quantized too, and W4 with them
kept in float. The quantized models run on the packed CPU kernels, as they decode.

Usage:
    python benchmarks/quant_perplexity.py --run RUN_OR_CHECKPOINT --vocab-size 4096 --seq-len 128 --out STEM
"""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import torch
from _results import table, write

from tensorslim.data import build_lm_data
from tensorslim.predict import load_pretrained  # knows the bases of training runs
from tensorslim.quant import RTNConfig, quantize_
from tensorslim.tasks.lm import lm_loss

ARMS = {"float": None, "w8": (8, True), "w4": (4, True), "w4-float-embeddings": (4, False)}


@torch.no_grad()
def perplexity(model: torch.nn.Module, blocks: torch.Tensor, *, batch_size: int = 8) -> float:
    """exp of the mean next-token cross-entropy over every predicted token of ``blocks`` ``(N, T)``."""
    total = sum(
        lm_loss(model, blocks[i : i + batch_size], reduction="sum").item() for i in range(0, len(blocks), batch_size)
    )
    return math.exp(total / (blocks.shape[0] * (blocks.shape[1] - 1)))


def _load(args: argparse.Namespace) -> torch.nn.Module:
    if args.run is not None:
        return load_pretrained(args.run)
    from safetensors.torch import load_model

    from tensorslim.methods import build_for_method

    model, _, _ = build_for_method(args.preset, args.method, max_seq_len=args.seq_len, vocab_size=args.vocab_size)
    load_model(model, args.weights)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="a run folder, its model/ or a checkpoint")
    parser.add_argument("--weights", default=None, help="instead of --run: a model.safetensors of --preset/--method")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--method", default="cola")
    parser.add_argument("--data", default="stdlib")
    parser.add_argument("--tokenizer", default=None, help="as the run was trained with (default: the corpus BPE)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--eval-blocks", type=int, default=16)
    parser.add_argument("--out", default=None, help="output stem for .md/.json")
    args = parser.parse_args()
    data = build_lm_data(
        args.data,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        max_val_blocks=args.eval_blocks,
    )
    base = _load(args).eval()
    rows = {}
    for arm, setting in ARMS.items():
        model = copy.deepcopy(base)
        if setting is not None:
            quantize_(model, RTNConfig(bits=setting[0], embeddings=setting[1]), None)
        rows[arm] = perplexity(model, data.validation)
    result = {
        "validation_tokens": int(data.validation.numel()),
        "perplexity": rows,
        "vs_float": {arm: ppl / rows["float"] for arm, ppl in rows.items()},
    }
    lines = table(
        ["arm", "perplexity", "×float"], [[a, f"{p:.2f}", f"{result['vs_float'][a]:.4f}"] for a, p in rows.items()]
    )
    print("\n".join(lines))
    if args.out:
        note = f"{result['validation_tokens']} validation tokens"
        write(Path(args.out), "Held-out perplexity after quantization", lines, data=result, notes=[note])


if __name__ == "__main__":
    main()
