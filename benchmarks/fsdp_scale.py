"""FSDP2 × BOOST TP benchmark: per-process state memory (DDP vs FSDP2), bytes per collective, step time, and a
paper-scale communication projection built on the measured byte counts.

Run (CPU, gloo, 4 processes, one thread each):

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/fsdp_scale.py --preset 60m --batch 8 --seq 128 \
        --steps 3 --out bench-out/fsdp_scale_60m

At 350m, four real copies of DDP's state do not fit on this machine; the state of every layout is counted on the
meta device instead, and only what fits trains:

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/fsdp_scale.py --preset 350m --batch 4 --seq 64 \
        --steps 2 --layouts tp4 --meta-init --adamw-per-tensor \
        --count-layouts 'ddp dp4,fsdp dp4,tp4,ddp dp2×tp2,fsdp dp2×tp2' --out bench-out/fsdp_scale_350m_tp4

Every layout trains the same CoLA model (BTP blocks, AdamW, clipping at 0.5) on the same global batches:

- ``ddp dp4`` / ``fsdp dp4``: data parallelism alone (TP = 1), replicas vs FSDP2 shards;
- ``tp4``: BOOST TP over all four processes;
- ``ddp dp2×tp2`` / ``fsdp dp2×tp2``: the 2-D mesh.

State memory is the bytes of the tensors each process holds (parameters, gradients right after backward, AdamW's
two moments), summed from the local shards, largest over the ranks: a count, not an RSS reading. Bytes are the
logical payload of each collective of the last step on rank 0 (``tensorslim.distributed.comm``; FSDP2's all-gathers
and reduce-scatters are logged through its custom-collective hooks). Step time is the slowest rank's, median of the
measured steps after one warm-up step, on a shared 2-core machine: indicative only. "In TP collectives" is the wall
time the slowest rank spent blocked inside BOOST's TP collectives in the last step (gloo runs them synchronously):
the most that overlapping them with computation could hide.

The projection at the end is a model, not a measurement (see ``project``).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _results import table, write

from tensorslim.distributed import build_mesh, parallelize
from tensorslim.distributed.fsdp import local
from tensorslim.distributed.layout import TensorParallel
from tensorslim.methods import build_for_method
from tensorslim.methods.recipes import recipe_for
from tensorslim.models.registry import model_config
from tensorslim.tasks.lm import CausalLM

# label -> (tp, FSDP2 on dp)
LAYOUTS = {
    "ddp dp4": (1, False),
    "fsdp dp4": (1, True),
    "tp4": (4, False),
    "ddp dp2×tp2": (2, False),
    "fsdp dp2×tp2": (2, True),
}
CATEGORIES = {"layers.": "TP latents (layers)", "head.": "TP head", "dp.": "data parallel", "optim.": "grad norm"}

# The projection's assumptions (a model: bandwidths are not measured here).
NVLINK_GBPS = 119.0  # BOOST README, 7B TP4: 0.22 GB per layer-forward all-reduced in ~1.85 ms
INTER_NODE_GBPS = 25.0  # one 200 Gb/s NIC per GPU across nodes (assumed)
GPUS_PER_NODE = 8
PAPER_RUNS = {  # BOOST README configs: seq 4096, micro-batch 1 × 4 accumulation per TP group
    "1b": {"rank": 512, "tp": 4, "tokens": 4 * 4096},
    "7b": {"rank": 1024, "tp": 4, "tokens": 4 * 4096},
}


class _Stream:
    def __init__(self, data: list[torch.Tensor]) -> None:
        self.data, self.position = data, 0

    def next_batch(self) -> torch.Tensor:
        self.position += 1
        return self.data[self.position - 1]


def _max(value: float) -> float:
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def _build(args: argparse.Namespace) -> torch.nn.Module:
    """The TP=1 CoLA model, the same weights on every rank (seed 0)."""
    torch.manual_seed(0)
    return build_for_method(args.preset, "cola", max_seq_len=args.seq)[0]


def _meta_init(layout: TensorParallel, args: argparse.Namespace) -> torch.nn.Module:
    """Shard the model on the meta device, then give each rank's shards random values (normal, std 0.02; norm
    gains 1): no rank ever holds the TP=1 model, so the layouts start from different weights and their losses
    are not comparable. Not for DDP, whose wrapper broadcasts real weights."""
    if not layout.fsdp and layout.dp_size > 1:
        raise SystemExit("--meta-init needs FSDP2 or tp = 4 (DDP broadcasts the weights it wraps)")
    torch.manual_seed(0)
    model = layout.shard(build_for_method(args.preset, "cola", device="meta", max_seq_len=args.seq)[0])
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                local(param).fill_(1.0)
            else:
                local(param).normal_(0.0, 0.02)
    return model


def _release() -> None:
    """Hand freed heap memory back to the OS (glibc keeps it otherwise, and the next rank's build adds to RSS)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _in_turn(fn: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``fn()`` on each rank in turn: building a model passes through the dense weights before the CoLA factors,
    and sharding it copies the TP-local slices, so four ranks doing it at once would need four times that
    transient memory (the figures do not depend on it)."""
    out = None
    for turn in range(dist.get_world_size()):
        if dist.get_rank() == turn:
            out = fn()
            _release()
        dist.barrier()
    return out


def bench_layout(label: str, args: argparse.Namespace, data: list[torch.Tensor]) -> dict:
    tp, shard = LAYOUTS[label]
    layout = TensorParallel(
        build_mesh(tp, world_size=dist.get_world_size()), style="btp", device=torch.device("cpu"), dp_shard=shard
    )
    if args.meta_init:
        model = _meta_init(layout, args)
    elif shard or layout.dp_size == 1:  # FSDP2's fully_shard and TP slicing are local: build and shard in turn
        model = _in_turn(lambda: layout.shard(_build(args)))
    else:  # wrapping in DDP broadcasts: all ranks at once
        model = layout.shard(_in_turn(lambda: _build(args)))
        _release()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=not args.adamw_per_tensor)
    task, stream = CausalLM(), _Stream(data)
    times, losses, grads = [], [], 0
    for step in range(len(data)):
        dist.barrier()
        start = time.perf_counter()
        for batch, sync in layout.micro_batches(stream, 1):
            with sync:
                loss = layout.loss(task, model, batch)
                loss.backward()
        grads = sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters())
        layout.clip_grad_norm(model, 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(layout.mean(loss.item()))
        elapsed = _max(time.perf_counter() - start)
        if step > 0:
            times.append(elapsed)
    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    moments = sum(
        local(t).numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step"
    )
    log = layout.log
    by_kind: dict[str, dict[str, float]] = {}
    for row in log.as_rows():
        category = next(name for prefix, name in CATEGORIES.items() if row["tag"].startswith(prefix))
        entry = by_kind.setdefault(f"{category}: {row['op']}", {"bytes": 0, "count": 0})
        entry["bytes"] += row["bytes"]
        entry["count"] += row["count"]
    config = model_config(args.preset)
    tokens = args.batch * args.seq // layout.dp_size  # per TP group
    return {
        "layout": label,
        "tp": tp,
        "dp": layout.dp_size,
        "fsdp": shard,
        "state_bytes_max_rank": {
            "params": _max(params),
            "grads": _max(grads),
            "moments": _max(moments),
            "total": _max(params + grads + moments),
        },
        "step_time_s_median": statistics.median(times),
        "step_times_s": times,
        "losses": losses,
        "bytes_by_collective": by_kind,
        "bytes_total": log.total().bytes,
        "tp_layer_elements_per_token_layer": log.total(prefix="layers.").elements / max(tokens * config.n_layers, 1),
        "tp_blocked_s": _max(log.total(prefix="layers.").seconds + log.total(prefix="head.").seconds),
        "dp_gather_bytes": log.total(prefix="dp.params").bytes,
        "dp_reduce_bytes": log.total(prefix="dp.grads").bytes,
        "tp_local_param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }


def count_layout(label: str, args: argparse.Namespace) -> dict:
    """The per-process state of ``label`` counted on the meta device: no memory, no training.

    The model is built and sharded as in :func:`bench_layout` (FSDP2's ``fully_shard`` runs on meta tensors), every
    parameter gets a zero gradient of its own (local) shape and AdamW takes one step, which creates its moments;
    then the local tensors are summed. DDP is counted on the unwrapped TP model: DDP keeps each TP-local tensor
    whole on every rank (its gradient buckets, one more gradient-sized buffer, are not counted, as in
    :func:`bench_layout`).
    """
    tp, shard = LAYOUTS[label]
    mesh = build_mesh(tp, world_size=dist.get_world_size())
    full, _, _ = build_for_method(args.preset, "cola", device="meta", max_seq_len=args.seq)
    model = parallelize(full, mesh, "btp", dp_shard=shard)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    grads = sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(
        local(t).numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step"
    )
    return {
        "layout": label,
        "tp": tp,
        "dp": dist.get_world_size() // tp,
        "fsdp": shard,
        "counted_on": "meta",
        "state_bytes_max_rank": {
            "params": _max(params),
            "grads": _max(grads),
            "moments": _max(moments),
            "total": _max(params + grads + moments),
        },
        "state_bytes_min_rank_total": -_max(-(params + grads + moments)),
        "model_params": sum(p.numel() for p in full.parameters()),
    }


def project(results: list[dict], preset: str) -> list[dict]:
    """A communication-time model at paper scale (BOOST README's 1B/7B configs), not a measurement.

    Bytes per step and GPU scale the measured ones: BTP's latent traffic per token and layer, measured here in units
    of r (``7r + 2`` elements each way, §3.1), and FSDP2's traffic per step, measured here as a multiple of the
    TP-local parameter bytes (one all-gather in forward, one in backward for the blocks, one reduce-scatter). Times
    follow a ring all-reduce / all-gather / reduce-scatter model, ``bytes · (n−1)/n`` per rank per direction (×2
    for an all-reduce), at ``NVLINK_GBPS`` inside a node (TP) and ``INTER_NODE_GBPS`` across nodes (FSDP2), in bf16
    (2 bytes) with fp32 gradient reduction.
    """
    rank = recipe_for(preset).cola_rank
    tp_run = next(r for r in results if r["layout"] == "tp4")
    fsdp_run = next(r for r in results if r["layout"] == "fsdp dp2×tp2")
    per_token_layer = tp_run["tp_layer_elements_per_token_layer"] / rank  # ≈ 2 (fwd + bwd) × (7 + 2/r)
    # FSDP2's logical payload per byte of TP-local (fp32) parameters: gathers (forward + the blocks' backward) and
    # the gradients' reduce-scatter
    gathers = fsdp_run["dp_gather_bytes"] / fsdp_run["tp_local_param_bytes"]
    reduces = fsdp_run["dp_reduce_bytes"] / fsdp_run["tp_local_param_bytes"]
    rows = []
    for name, run in PAPER_RUNS.items():
        config = model_config(name)
        torch.manual_seed(0)
        meta, _, _ = build_for_method(name, "cola", device="meta")
        params = sum(p.numel() for p in meta.parameters())
        for gpus in (8, 16, 32, 64):
            tp, dp = run["tp"], gpus // run["tp"]
            tp_bytes = per_token_layer * run["rank"] * run["tokens"] * config.n_layers * 2  # bf16
            tp_time = 2 * tp_bytes * (tp - 1) / tp / (NVLINK_GBPS * 1e9)
            dp_bytes = params / tp * (gathers * 2 + reduces * 4)  # bf16 gathers, fp32 reduce-scatter
            dp_bw = NVLINK_GBPS if tp * dp <= GPUS_PER_NODE else INTER_NODE_GBPS
            dp_time = dp_bytes * (dp - 1) / dp / (dp_bw * 1e9)
            rows.append(
                {
                    "model": name,
                    "gpus": gpus,
                    "tp": tp,
                    "dp": dp,
                    "params": params,
                    "tp_gb_per_step": tp_bytes / 1e9,
                    "tp_time_s": tp_time,
                    "fsdp_gb_per_step": dp_bytes / 1e9,
                    "fsdp_time_s": dp_time,
                    "state_gb_per_gpu_fsdp": params / (tp * dp) * 16 / 1e9,  # fp32 weights+grads+2 moments
                    "state_gb_per_gpu_ddp": params / tp * 16 / 1e9,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--batch", type=int, default=8, help="global sequences per step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="measured steps (plus one warm-up)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="layouts trained (comma list; '' for none)")
    parser.add_argument(
        "--meta-init",
        action="store_true",
        help="initialise each rank's shards directly instead of slicing a TP=1 model (losses then differ)",
    )
    parser.add_argument(
        "--adamw-per-tensor",
        action="store_true",
        help="AdamW with foreach=False: no temporaries the size of all parameters at each step (less peak RSS)",
    )
    parser.add_argument(
        "--count-layouts", default="", help="layouts whose state is only counted, on the meta device (comma list)"
    )
    parser.add_argument("--out", default="bench-out/fsdp_scale_60m", help="output stem (.md and .json)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1200))
    if dist.get_world_size() != 4:
        raise SystemExit("run under torchrun --nproc-per-node 4")
    vocab = model_config(args.preset).vocab_size
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (args.batch, args.seq), generator=generator) for _ in range(args.steps + 1)]
    before = [round(x, 2) for x in os.getloadavg()]
    counts = [count_layout(label, args) for label in args.count_layouts.split(",") if label]
    results = [bench_layout(label, args, data) for label in args.layouts.split(",") if label]
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
    rss = torch.tensor([peak_rss], dtype=torch.float64)
    rss_all = [torch.zeros_like(rss) for _ in range(dist.get_world_size())]
    dist.all_gather(rss_all, rss)
    if dist.get_rank() == 0:
        layouts = {r["layout"] for r in results}
        report = {
            "peak_rss_bytes_per_process": [t.item() for t in rss_all],
            "counted": counts,
            "results": results,
            "projection": project(results, args.preset) if {"tp4", "fsdp dp2×tp2"} <= layouts else [],
        }
        notes = [
            "gloo, 1 thread per process; a shared machine: times are indicative",
            f"load average before: {before}",
            f"peak RSS per process (MB): {', '.join(_mb(x) for x in report['peak_rss_bytes_per_process'])}",
        ]
        title = "FSDP2 × BOOST TP, 4 processes"
        print(write(Path(args.out), title, markdown(report), data=report, notes=notes).read_text())
    dist.destroy_process_group()


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f}"


def _ratio_to_ddp(row: dict, rows: list[dict]) -> str:
    twin = next((x for x in rows if x["tp"] == row["tp"] and not x["fsdp"]), None)
    return f"{row['state_bytes_max_rank']['total'] / twin['state_bytes_max_rank']['total']:.3f}" if twin else "–"


def markdown(report: dict) -> list[str]:
    results, counts = report["results"], report["counted"]
    lines: list[str] = []
    if counts:
        lines += [
            "## Per-process state counted on the meta device (largest rank; MB; no training)",
            "",
            f"Model: {counts[0]['model_params'] / 1e6:.1f} M parameters (fp32). Each layout built and sharded on "
            "meta tensors, a zero gradient per parameter, one AdamW step to create its moments, local tensors summed.",
            "",
        ]
        rows = []
        for r in counts:
            state = r["state_bytes_max_rank"]
            rows.append(
                [r["layout"], *(_mb(state[k]) for k in ("params", "grads", "moments", "total"))]
                + [_mb(r["state_bytes_min_rank_total"]), _ratio_to_ddp(r, counts)]
            )
        columns = ["layout", "params", "grads", "AdamW moments", "total", "smallest rank total", "vs DDP same tp"]
        lines += table(columns, rows)
    if not results:
        return lines
    lines += ["## Per-process state (largest rank; bytes of the local tensors, MB)", ""]
    rows = []
    for r in results:
        state = r["state_bytes_max_rank"]
        rows.append(
            [r["layout"], *(_mb(state[k]) for k in ("params", "grads", "moments", "total")), _ratio_to_ddp(r, results)]
            + [f"{r['step_time_s_median']:.2f}", f"{r['tp_blocked_s']:.2f}", f"{r['losses'][-1]:.5f}"]
        )
    columns = ["layout", "params", "grads", "AdamW moments", "total", "vs DDP same tp", "step time (s)"]
    lines += table([*columns, "in TP collectives (s)", "final loss"], rows)
    lines += ["## Bytes per step by collective (rank 0, logical payload, MB; count in brackets)", ""]
    kinds = sorted({k for r in results for k in r["bytes_by_collective"]})
    rows = []
    for r in results:
        cells = [
            f"{_mb(r['bytes_by_collective'][k]['bytes'])} ({r['bytes_by_collective'][k]['count']})"
            if k in r["bytes_by_collective"]
            else "–"
            for k in kinds
        ]
        rows.append([r["layout"], *cells, _mb(r["bytes_total"])])
    lines += table(["layout", *kinds, "total"], rows)
    if report["projection"]:
        lines += [
            "## Paper-scale projection — a MODEL, not a measurement",
            "",
            f"Bytes scale the measured ones (BTP latent elements per token and layer per unit of r; FSDP2 bytes per "
            f"byte of TP-local parameters); times use a ring model at {NVLINK_GBPS:g} GB/s inside a node (implied by "
            f"BOOST's README: 0.22 GB per 7B layer-forward in ~1.85 ms) and an assumed {INTER_NODE_GBPS:g} GB/s per "
            f"GPU across nodes, {GPUS_PER_NODE} GPUs per node, bf16 traffic with fp32 gradient reduction, BOOST's "
            "configs (TP 4, 4 × 4096 tokens per TP group and step). State = fp32 weights, grads and two moments.",
            "",
        ]
        rows = [
            [p["model"], f"{p['params'] / 1e9:.2f} B", p["gpus"], f"{p['tp']} × {p['dp']}"]
            + [f"{p['tp_gb_per_step']:.2f}", f"{p['tp_time_s']:.3f}", f"{p['fsdp_gb_per_step']:.2f}"]
            + [f"{p['fsdp_time_s']:.3f}", f"{p['state_gb_per_gpu_fsdp']:.2f}", f"{p['state_gb_per_gpu_ddp']:.2f}"]
            for p in report["projection"]
        ]
        columns = ["model", "params", "GPUs", "tp × dp", "TP GB/step", "TP comm s", "FSDP2 GB/step", "FSDP2 comm s"]
        lines += table([*columns, "state GB/GPU FSDP2", "state GB/GPU DDP"], rows)
    return lines


if __name__ == "__main__":
    main()
