"""FSDP2 × BOOST TP benchmark: per-process state memory (DDP vs FSDP2), bytes per collective, step time, and a
paper-scale communication projection built on the measured byte counts.

Run (CPU, gloo, 4 processes, one thread each):

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/fsdp_scale.py --preset 60m --batch 8 --seq 128 \
        --steps 3 --out bench-out/fsdp_scale_60m

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
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tensorslim.distributed import build_mesh
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


def bench_layout(label: str, args: argparse.Namespace, data: list[torch.Tensor]) -> dict:
    tp, shard = LAYOUTS[label]
    layout = TensorParallel(
        build_mesh(tp, world_size=dist.get_world_size()), style="btp", device=torch.device("cpu"), dp_shard=shard
    )
    torch.manual_seed(0)
    full, _, _ = build_for_method(args.preset, "cola", max_seq_len=args.seq)
    model = layout.shard(full)
    del full
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
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
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", default="bench-out/fsdp_scale_60m", help="output stem (.md and .json)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1200))
    if dist.get_world_size() != 4:
        raise SystemExit("run under torchrun --nproc-per-node 4")
    vocab = model_config(args.preset).vocab_size
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (args.batch, args.seq), generator=generator) for _ in range(args.steps + 1)]
    before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = [bench_layout(label, args, data) for label in args.layouts.split(",")]
    if dist.get_rank() == 0:
        layouts = {r["layout"] for r in results}
        report = {
            "command": "OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/fsdp_scale.py "
            + " ".join(f"--{k} {v!r}" if " " in str(v) else f"--{k} {v}" for k, v in vars(args).items()),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": f"{platform.node()}, {os.cpu_count()} cores",
            "torch": torch.__version__,
            "loadavg_before": before,
            "loadavg_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "results": results,
            "projection": project(results, args.preset) if {"tp4", "fsdp dp2×tp2"} <= layouts else [],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
        text = markdown(report)
        Path(args.out + ".md").write_text(text)
        print(text)
    dist.destroy_process_group()


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f}"


def markdown(report: dict) -> str:
    results = report["results"]
    lines = [
        f"# FSDP2 × BOOST TP, 4 processes ({report['date']})",
        "",
        f"Command: `{report['command']}`",
        f"Machine: {report['machine']}; torch {report['torch']}; gloo, 1 thread per process. Load average before: "
        f"{report['loadavg_before']}, after: {report['loadavg_after']} (a shared machine: times are indicative).",
        "",
        "## Per-process state (largest rank; bytes of the local tensors, MB)",
        "",
        "| layout | params | grads | AdamW moments | total | vs DDP same tp | step time (s) | in TP collectives (s) "
        "| final loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        state = r["state_bytes_max_rank"]
        twin = next((x for x in results if x["tp"] == r["tp"] and not x["fsdp"]), None)
        ratio = f"{state['total'] / twin['state_bytes_max_rank']['total']:.3f}" if twin else "–"
        lines.append(
            f"| {r['layout']} | {_mb(state['params'])} | {_mb(state['grads'])} | {_mb(state['moments'])} "
            f"| {_mb(state['total'])} | {ratio} | {r['step_time_s_median']:.2f} | {r['tp_blocked_s']:.2f} "
            f"| {r['losses'][-1]:.5f} |"
        )
    lines += ["", "## Bytes per step by collective (rank 0, logical payload, MB; count in brackets)", ""]
    kinds = sorted({k for r in results for k in r["bytes_by_collective"]})
    lines += ["| layout | " + " | ".join(kinds) + " | total |", "|---" * (len(kinds) + 2) + "|"]
    for r in results:
        cells = [
            f"{_mb(r['bytes_by_collective'][k]['bytes'])} ({r['bytes_by_collective'][k]['count']})"
            if k in r["bytes_by_collective"]
            else "–"
            for k in kinds
        ]
        lines.append(f"| {r['layout']} | " + " | ".join(cells) + f" | {_mb(r['bytes_total'])} |")
    if report["projection"]:
        lines += [
            "",
            "## Paper-scale projection — a MODEL, not a measurement",
            "",
            f"Bytes scale the measured ones (BTP latent elements per token and layer per unit of r; FSDP2 bytes per "
            f"byte of TP-local parameters); times use a ring model at {NVLINK_GBPS:g} GB/s inside a node (implied by "
            f"BOOST's README: 0.22 GB per 7B layer-forward in ~1.85 ms) and an assumed {INTER_NODE_GBPS:g} GB/s per "
            f"GPU across nodes, {GPUS_PER_NODE} GPUs per node, bf16 traffic with fp32 gradient reduction, BOOST's "
            "configs (TP 4, 4 × 4096 tokens per TP group and step). State = fp32 weights, grads and two moments.",
            "",
            "| model | params | GPUs | tp × dp | TP GB/step | TP comm s | FSDP2 GB/step | FSDP2 comm s "
            "| state GB/GPU FSDP2 | state GB/GPU DDP |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in report["projection"]:
            lines.append(
                f"| {p['model']} | {p['params'] / 1e9:.2f} B | {p['gpus']} | {p['tp']} × {p['dp']} "
                f"| {p['tp_gb_per_step']:.2f} | {p['tp_time_s']:.3f} | {p['fsdp_gb_per_step']:.2f} "
                f"| {p['fsdp_time_s']:.3f} | {p['state_gb_per_gpu_fsdp']:.2f} | {p['state_gb_per_gpu_ddp']:.2f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
