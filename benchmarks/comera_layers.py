"""CoMERA layer benchmarks on CPU, measured side by side in one process (alternating repeats, median).

1. TT 768×768 linear (CoMERA shapes [12,8,8 ‖ 8,8,12], r=30) forward+backward vs dense ``nn.Linear``, 32×128 tokens.
2. TTM embedding lookup (30,522 × 768, [16,20,10,10]×[4,4,8,6], r=32) forward+backward: our half-table lookup with
   unique ids vs rebuilding the whole table and indexing it; dense ``nn.Embedding`` and the per-id chain for context.

Usage: ``.venv/bin/python benchmarks/comera_layers.py --repeats 15 --out /tmp/comera_layers``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from _results import table, write
from torch import nn

from tensorslim.bench.timing import alternate, summarize_ms
from tensorslim.functional.tt import contract_ttm
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding


def _fwd_bwd(fn: Callable[[], torch.Tensor], params: list[torch.Tensor]) -> Callable[[], None]:
    # A dense, contiguous output gradient (as from a real next layer); ``.sum().backward()`` would hand the layer a
    # stride-0 expanded gradient that every GEMM must first copy.
    grad = torch.randn_like(fn().detach())

    def step() -> None:
        for p in params:
            p.grad = None
        fn().backward(grad)

    return step


def linear_cases(tokens: int) -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    dense = nn.Linear(768, 768)
    tt = TTLinear.from_dense(dense, TTConfig(rank=30, init="random"))
    x = torch.randn(tokens, 768, requires_grad=True)
    return {
        "dense_linear": _fwd_bwd(lambda: dense(x), [x, *dense.parameters()]),
        "tt_linear": _fwd_bwd(lambda: tt(x), [x, *tt.parameters()]),
    }


def embedding_cases(batch: int, seq: int) -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    vocab = 30522
    emb = TTEmbedding(vocab, (16, 20, 10, 10), (4, 4, 8, 6), (1, 32, 32, 32, 1))
    chain = TTEmbedding(vocab, (16, 20, 10, 10), (4, 4, 8, 6), (1, 32, 32, 32, 1), lookup="chain")
    chain.load_state_dict(emb.state_dict())
    dense = nn.Embedding(vocab, 768)
    ids = torch.randint(0, vocab, (batch, seq))
    cores = list(emb.cores)

    def rebuild() -> torch.Tensor:
        table = contract_ttm(cores)[0, :, :, 0]  # (32000, 768), planned contraction order
        return table[ids]

    return {
        "tt_embedding_halves_unique": _fwd_bwd(lambda: emb(ids), cores),
        "rebuild_table": _fwd_bwd(rebuild, cores),
        "tt_embedding_chain_unique": _fwd_bwd(lambda: chain(ids), list(chain.cores)),
        "dense_embedding": _fwd_bwd(lambda: dense(ids), list(dense.parameters())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json and <out>.md")
    parser.add_argument("--linear-only", action="store_true", help="skip the embedding cases")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq
    linear = summarize_ms(alternate(linear_cases(tokens), repeats=args.repeats))
    embedding = (
        {} if args.linear_only else summarize_ms(alternate(embedding_cases(args.batch, args.seq), repeats=args.repeats))
    )
    result = {
        "tokens": tokens,
        "linear_768x768_fwd_bwd": linear,
        "embedding_30522x768_fwd_bwd": embedding,
        "ratios": {"dense_over_tt_linear": linear["dense_linear"]["median_ms"] / linear["tt_linear"]["median_ms"]},
    }
    if embedding:
        halves = embedding["tt_embedding_halves_unique"]["median_ms"]
        result["ratios"]["rebuild_over_tt_embedding"] = embedding["rebuild_table"]["median_ms"] / halves
        result["ratios"]["chain_over_tt_embedding"] = embedding["tt_embedding_chain_unique"]["median_ms"] / halves
    print(json.dumps(result, indent=2))
    if args.out is not None:
        write(args.out, "CoMERA layer benchmarks (CPU, fp32, forward+backward)", _markdown(result), data=result)


def _markdown(result: dict) -> list[str]:
    """The tables of one run: each case's times, then the ratios of the medians."""
    rows = [
        [name, f"{row['median_ms']:.1f}", f"{row['min_ms']:.1f}", f"{row['max_ms']:.1f}"]
        for section in ("linear_768x768_fwd_bwd", "embedding_30522x768_fwd_bwd")
        for name, row in result[section].items()
    ]
    return [
        f"Tokens per step: {result['tokens']}; cases alternate within each repeat; medians reported.",
        "",
        *table(["case", "median ms", "min ms", "max ms"], rows),
        *table(["ratio (medians)", "value"], [[name, f"{value:.2f}x"] for name, value in result["ratios"].items()]),
    ]


if __name__ == "__main__":
    main()
