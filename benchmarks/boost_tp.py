"""BOOST TP benchmark: step time and bytes communicated for btp vs vanilla low-rank TP vs Megatron full-rank TP.

Run (CPU, gloo, one thread per process):

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/boost_tp.py --preset 60m --batch 4 --seq 128 --steps 5 \
        --out /tmp/boost_tp2_60m

Saved activations of BTP with and without latent checkpointing (one process, TP=1; no torchrun):

    python benchmarks/boost_tp.py --memory --preset 60m --batch 2 --seq 256 --out /tmp/boost_tp2_60m

Results go to ``--out`` (default ``bench-out/boost_tp2_60m``, ignored by git); the committed figures under
``benchmarks/results/`` are copied there by hand.

Each style trains the same preset on the same synthetic token batches with AdamW: ``btp`` and ``vanilla`` shard the
CoLA model (r = d/4), ``megatron`` shards the dense model. Step time is the slowest rank's, median over the measured
steps (one warm-up step first). Bytes are the logical payload of every collective of one step on rank 0 (see
``tensorslim.distributed.comm``), next to BOOST's per-layer formula (§3.1).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _results import table, write

from tensorslim.distributed import build_mesh, parallelize
from tensorslim.distributed.layout import clip_grad_norm_tp
from tensorslim.methods import build_for_method
from tensorslim.methods.recipes import recipe_for
from tensorslim.models.registry import model_config

# row label -> (method, parallelize style, recompute)
STYLES = {
    "megatron": ("dense", "megatron", "none"),
    "vanilla": ("cola", "vanilla", "none"),
    "btp": ("cola", "btp", "none"),
    "btp+latent-recompute": ("cola", "btp", "latent"),
    "btp+layer-recompute": ("cola", "btp", "layer"),
}


def layer_formula(style: str, *, d: int, f: int, r: int) -> tuple[int, int]:
    """Elements per token and layer, (forward, backward), as the implementation sends them."""
    if style == "megatron":
        return 2 * d, 2 * d
    if style == "vanilla":
        return 5 * d + 2 * f, 3 * d + f
    return 7 * r + 2, 7 * r + 2


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One step of the tensor-parallel model as the Trainer runs it with one data-parallel rank (clip at 0.5)."""
    loss = model.loss(batch)
    loss.backward()
    clip_grad_norm_tp(model, 0.5)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def bench_style(style: str, args: argparse.Namespace, mesh, data: list[torch.Tensor]) -> dict:
    method, tp_style, recompute = STYLES[style]
    torch.manual_seed(0)
    full, _, _ = build_for_method(args.preset, method, max_seq_len=args.seq)
    model = parallelize(full, mesh, tp_style, recompute=recompute)
    del full
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for i, batch in enumerate(data):
        model.tp.log.reset()
        dist.barrier()
        start = time.perf_counter()
        loss = train_step(model, optimizer, batch)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i > 0:  # the first step pays for lazy initialization
            times.append(elapsed.item())
        losses.append(loss)
    log = model.tp.log
    config = model_config(args.preset)
    rank = recipe_for(args.preset).cola_rank
    tokens = args.batch * args.seq
    fwd, bwd = layer_formula(tp_style, d=config.d_model, f=config.d_ff, r=rank)
    if recompute == "layer":
        fwd *= 2  # the recomputed forward runs its collectives again
    return {
        "style": style,
        "method": method,
        "step_time_s_median": statistics.median(times),
        "step_times_s": times,
        "bytes_per_step_total": log.total().bytes,
        "bytes_per_step_layers": log.total(prefix="layers.").bytes,
        "bytes_per_step_head": log.total(prefix="head.").bytes,
        "collectives_per_step": log.total().count,
        "formula_bytes_layers": (fwd + bwd) * tokens * config.n_layers * 4,
        "layer0_fwd_elements_per_token": log.total(prefix="layers.0.", phase="fwd").elements / tokens,
        "layer0_bwd_elements_per_token": log.total(prefix="layers.0.", phase="bwd").elements / tokens,
        "losses": losses,
        "rows": log.as_rows(),
    }


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one loss computation."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(ids).backward()
    return sum(seen.values())


def memory(args: argparse.Namespace) -> None:
    vocab = model_config(args.preset).vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    rows = []
    for recompute in ("none", "latent", "layer"):
        torch.manual_seed(0)
        full, _, _ = build_for_method(args.preset, "cola", max_seq_len=args.seq)
        rows.append([recompute, saved_bytes(parallelize(full, None, "btp", recompute=recompute), ids)])
    lines = table(["recompute", "saved bytes (whole model incl. head and CE)"], rows)
    print("\n".join(lines))
    title = "BTP latent checkpointing: saved activations, one process (TP=1)"
    write(Path(args.out + "_memory"), title, lines, data=dict(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="measured steps (plus one warm-up)")
    parser.add_argument("--styles", default=",".join(STYLES))
    parser.add_argument("--out", default="bench-out/boost_tp2_60m", help="output stem (--memory: <out>_memory.md)")
    parser.add_argument("--memory", action="store_true", help="measure saved activations on one process instead")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.memory:
        return memory(args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    mesh = build_mesh(dist.get_world_size(), world_size=dist.get_world_size())
    vocab = model_config(args.preset).vocab_size
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (args.batch, args.seq), generator=generator) for _ in range(args.steps + 1)]
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = [bench_style(style, args, mesh, data) for style in args.styles.split(",")]
    if dist.get_rank() == 0:
        notes = [
            f"TP={dist.get_world_size()}, gloo, 1 thread per process; the slowest rank's median step",
            f"load average before: {load_before}",
        ]
        lines = markdown(results)
        print("\n".join(lines))
        write(Path(args.out), "BOOST TP: step time and bytes sent per style", lines, data=results, notes=notes)
    dist.destroy_process_group()


def markdown(results: list[dict]) -> list[str]:
    rows = [
        [r["style"], f"{r['step_time_s_median']:.3f}", f"{r['bytes_per_step_total'] / 1e6:.2f}"]
        + [f"{r['bytes_per_step_layers'] / 1e6:.2f}", f"{r['formula_bytes_layers'] / 1e6:.2f}"]
        + [r["collectives_per_step"], f"{r['layer0_fwd_elements_per_token']:g}"]
        + [f"{r['layer0_bwd_elements_per_token']:g}"]
        for r in results
    ]
    columns = ["style", "step time (median, s)", "MB/step (all)", "MB/step (layers)", "formula MB (layers)"]
    return table([*columns, "collectives/step", "layer fwd elem/token", "layer bwd elem/token"], rows)


if __name__ == "__main__":
    main()
