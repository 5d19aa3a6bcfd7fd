"""BOOST TP with synchronous vs overlapped latent all-reduces: step time and time blocked in TP collectives.

Run (CPU, gloo, 4 processes, one thread each):

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/boost_overlap.py --preset 60m --batch 8 --seq 128 \
        --steps 6 --out bench-out/boost_overlap_60m

For each mesh (``dp2×tp2`` with DDP on dp, ``tp4``) one CoLA model per overlap mode of
:func:`tensorslim.distributed.parallelize.parallelize` (``none``, ``backward``, ``full``) is built from the same
weights and trained on the same global batches. The modes take turns step by step (none, backward, full, none, …),
so a change in the machine's load hits all of them alike. Step time is the slowest rank's (forward, backward,
clipping, AdamW), median over the measured steps after one warm-up step each. "Blocked" is the wall time the slowest
rank spent waiting inside BOOST's TP collectives (latents and head) per step, forward and backward apart: the whole
call for a blocking collective, only the ``wait`` for an overlapped one. Losses of the modes must agree (same math).
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

from tensorslim.distributed import build_mesh
from tensorslim.distributed.layout import TensorParallel
from tensorslim.distributed.parallelize import OVERLAPS
from tensorslim.methods import build_for_method
from tensorslim.tasks.lm import CausalLM

MESHES = {"dp2×tp2": 2, "tp4": 4}  # label -> tp (the rest of the 4 processes is DDP)


class _Stream:
    def __init__(self, data: list[torch.Tensor]) -> None:
        self.data, self.position = data, 0

    def next_batch(self) -> torch.Tensor:
        self.position += 1
        return self.data[self.position - 1]


def _max(*values: float) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class Run:
    """One overlap mode on one mesh: its layout, model, optimizer and measurements."""

    def __init__(self, mesh_label: str, overlap: str, args: argparse.Namespace, data: list[torch.Tensor]) -> None:
        self.mesh_label, self.overlap = mesh_label, overlap
        mesh = build_mesh(MESHES[mesh_label], world_size=dist.get_world_size())
        self.layout = TensorParallel(mesh, style="btp", device=torch.device("cpu"), overlap=overlap)
        torch.manual_seed(0)
        full, _, _ = build_for_method(args.preset, "cola", max_seq_len=args.seq)
        self.model = self.layout.shard(full)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.stream, self.task = _Stream(data), CausalLM()
        self.rows: list[dict[str, float]] = []
        self.losses: list[float] = []

    def step(self) -> None:
        dist.barrier()
        start = time.perf_counter()
        for batch, sync in self.layout.micro_batches(self.stream, 1):
            with sync:
                loss = self.layout.loss(self.task, self.model, batch)
                loss.backward()
        self.layout.clip_grad_norm(self.model, 0.5)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        self.losses.append(self.layout.mean(loss.item()))
        log = self.layout.log
        blocked = [sum(log.total(prefix=p, phase=ph).seconds for p in ("layers.", "head.")) for ph in ("fwd", "bwd")]
        step_s, fwd_s, bwd_s = _max(elapsed, *blocked)
        self.rows.append(
            {
                "step_s": step_s,
                "blocked_fwd_s": fwd_s,
                "blocked_bwd_s": bwd_s,
                "tp_collectives": log.total(prefix="layers.").count + log.total(prefix="head.").count,
                "tp_bytes": log.total(prefix="layers.").bytes + log.total(prefix="head.").bytes,
            }
        )

    def summary(self) -> dict:
        measured = self.rows[1:]  # the first step warms up
        med = {key: statistics.median(row[key] for row in measured) for key in ("step_s", "blocked_fwd_s")}
        med["blocked_bwd_s"] = statistics.median(row["blocked_bwd_s"] for row in measured)
        return {
            "mesh": self.mesh_label,
            "overlap": self.overlap,
            **{f"{key}_median": value for key, value in med.items()},
            "tp_collectives_per_step": self.rows[-1]["tp_collectives"],
            "tp_bytes_per_step": self.rows[-1]["tp_bytes"],
            "steps": self.rows,
            "losses": self.losses,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--batch", type=int, default=8, help="global sequences per step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per mode (plus one warm-up)")
    parser.add_argument("--meshes", default=",".join(MESHES))
    parser.add_argument("--out", default="bench-out/boost_overlap_60m", help="output stem (.md and .json)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1200))
    if dist.get_world_size() != 4:
        raise SystemExit("run under torchrun --nproc-per-node 4")
    vocab = build_for_method(args.preset, "cola", device="meta")[0].config.vocab_size
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (args.batch, args.seq), generator=generator) for _ in range(args.steps + 1)]
    before = [round(x, 2) for x in os.getloadavg()]
    results = []
    for mesh_label in args.meshes.split(","):
        runs = [Run(mesh_label, overlap, args, data) for overlap in OVERLAPS]
        for _ in range(len(data)):
            for run in runs:  # the modes take turns
                run.step()
        results += [run.summary() for run in runs]
        del runs
    if dist.get_rank() == 0:
        notes = [
            "gloo, 1 thread per process (4 processes on the machine's cores, shared with other jobs); the modes take "
            "turns step by step; times are medians of the slowest rank",
            f"load average before: {before}",
        ]
        title = "BOOST TP latent all-reduces: synchronous vs overlapped, 4 processes"
        print(write(Path(args.out), title, markdown(results), data=results, notes=notes).read_text())
    dist.destroy_process_group()


def markdown(results: list[dict]) -> list[str]:
    rows = []
    for r in results:
        base = next(x for x in results if x["mesh"] == r["mesh"] and x["overlap"] == "none")
        gap = max(abs(a - b) for a, b in zip(r["losses"], base["losses"], strict=True))
        rows.append(
            [
                r["mesh"],
                r["overlap"],
                f"{r['step_s_median']:.3f}",
                f"{r['step_s_median'] / base['step_s_median']:.3f}",
                f"{r['blocked_fwd_s_median']:.3f}",
                f"{r['blocked_bwd_s_median']:.3f}",
                r["tp_collectives_per_step"],
                f"{r['tp_bytes_per_step'] / 1e6:.2f}",
                f"{gap:.1e}",
            ]
        )
    columns = ["mesh", "overlap", "step (s)", "vs none", "blocked in TP collectives fwd (s)", "bwd (s)"]
    return table([*columns, "TP collectives per step", "TP MB per step", "max loss gap to none"], rows)


if __name__ == "__main__":
    main()
