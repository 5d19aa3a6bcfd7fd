"""CoLA-M memory and step time vs dense, dense + whole-layer checkpointing, CoLA, CoLA + whole-layer checkpointing.

Every arm runs in its own subprocess (a 350M dense model with AdamW state does not fit beside four others), in
alternating order over rounds so that drift of the shared machine hits all arms alike. Per arm: saved-activation
bytes of one forward (``saved_tensors_hooks``, exact), the accounting peak (params + grads + AdamW state + saved
activations), the process's peak RSS, and the median train-step time (forward, backward, AdamW).

    .venv/bin/python benchmarks/cola_m_memory.py --preset 60m --batch-size 8 --seq-len 256 \
        --out /tmp/cola_m_60m

The default ``--out`` is ``bench-out/cola_m_<preset>`` (ignored by git), never the committed results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import table, write

ARMS = ("dense", "dense+gc", "cola", "cola+gc", "cola-m")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args: argparse.Namespace) -> dict:
    """Build one arm, run ``warmup + steps`` train steps, return its figures."""
    import torch

    from tensorslim.layers.cola_m import checkpoint_
    from tensorslim.methods import build_for_method
    from tensorslim.models.registry import get_model
    from tensorslim.tasks.lm import causal_lm_loss
    from tensorslim.train.memory import count_saved_tensors, training_memory
    from tensorslim.train.optim import build_optimizer

    torch.manual_seed(0)
    method = {"dense+gc": "dense", "cola+gc": "cola"}.get(args.arm, args.arm)
    model, _, _ = build_for_method(args.preset, method, max_seq_len=args.seq_len)
    if args.arm.endswith("+gc"):
        checkpoint_(model, policy="layer")
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    vocab = get_model(args.preset).config.vocab_size
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    rss_before = _rss_bytes()
    times, saved = [], 0
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        with count_saved_tensors(model) as tally:
            loss = causal_lm_loss(model(batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        saved = max(saved, tally.bytes)
    memory = training_memory(model, optimizer, saved)
    return {
        "arm": args.arm,
        "saved_bytes": saved,
        "accounting_peak_bytes": memory.total,
        "params_bytes": memory.params,
        "rss_before_steps_bytes": rss_before,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_times_s": times,
        "torch_threads": torch.get_num_threads(),
    }


def formula(preset_name: str, tokens: int) -> dict[str, int]:
    """Values per token and layer that checkpointed blocks save: CoLA-M ``d + 7r`` (ours), paper ``2d + 7r``."""
    from tensorslim.methods.recipes import recipe_for
    from tensorslim.models.registry import get_model

    config = get_model(preset_name).config
    d, r, layers = config.d_model, recipe_for(preset_name).cola_rank, config.n_layers
    return {
        "d": d,
        "r": r,
        "n_layers": layers,
        "cola_m_bytes_per_layer": (d + 7 * r) * tokens * 4,
        "paper_bytes_per_layer": (2 * d + 7 * r) * tokens * 4,
        "gc_bytes_per_layer": d * tokens * 4,
    }


def results_table(result: dict) -> list[str]:
    rows = {row["arm"]: row for row in result["rows"]}
    cola = rows.get("cola")
    cells = []
    for arm in ARMS:
        if arm not in rows:
            continue
        row = rows[arm]
        step = statistics.median(row["step_times_s"])
        ratio_saved = row["saved_bytes"] / cola["saved_bytes"] if cola else float("nan")
        ratio_step = step / statistics.median(cola["step_times_s"]) if cola else float("nan")
        cells.append(
            [
                arm,
                f"{row['saved_bytes'] / 2**20:,.1f}",
                f"{ratio_saved:.3f}",
                f"{row['accounting_peak_bytes'] / 2**20:,.0f}",
                f"{row['peak_rss_bytes'] / 2**20:,.0f}",
                f"{(row['peak_rss_bytes'] - row['rss_before_steps_bytes']) / 2**20:,.0f}",
                f"{step:.3f}",
                f"{ratio_step:.2f}",
            ]
        )
    columns = ["arm", "saved activations (MiB)", "× CoLA", "accounting peak (MiB)", "peak RSS (MiB)"]
    columns += ["RSS growth in steps (MiB)", "step (s, median)", "× CoLA step"]
    return table(columns, cells)


def _merge(merged: dict[str, dict], row: dict) -> None:
    arm = row["arm"]
    if arm in merged:
        merged[arm]["step_times_s"] += row["step_times_s"]
        merged[arm]["peak_rss_bytes"] = max(merged[arm]["peak_rss_bytes"], row["peak_rss_bytes"])
    else:
        merged[arm] = dict(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="arm order alternates between rounds")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--assemble", action="store_true", help="build the table from the rows file of finished arms")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    stem = Path(args.out or f"bench-out/cola_m_{args.preset}")
    rows_path = stem.with_suffix(".rows.jsonl")
    stem.parent.mkdir(parents=True, exist_ok=True)
    if args.worker:
        row = worker(args)
        print(json.dumps(row))
        with rows_path.open("a") as f:  # so that an interrupted sweep keeps its finished arms
            f.write(json.dumps({**row, "preset": args.preset, "batch_size": args.batch_size}) + "\n")
        return
    arms = [a for a in args.arms.split(",") if a]
    loads: list = [os.getloadavg()]
    merged: dict[str, dict] = {}
    if args.assemble:  # an interrupted sweep: the arms its workers finished
        for line in rows_path.read_text().splitlines():
            row = json.loads(line)
            if row["preset"] == args.preset and row["batch_size"] == args.batch_size:
                _merge(merged, row)
        arms = [a for a in arms if a in merged]
    for round_index in range(0 if args.assemble else args.rounds):
        for arm in arms if round_index % 2 == 0 else arms[::-1]:
            cmd = [sys.executable, __file__, "--worker", "--arm", arm, "--preset", args.preset]
            cmd += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
            cmd += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--out", str(stem)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(f"round {round_index} {arm}: {row['step_times_s']}", flush=True)
            _merge(merged, row)
            loads.append(os.getloadavg())
    tokens = args.batch_size * args.seq_len
    result = {
        "preset": args.preset,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tokens": tokens,
        "load_averages": loads,
        "formula": formula(args.preset, tokens),
        "rows": [merged[a] for a in arms],
    }
    lines = results_table(result)
    print("\n".join(lines))
    if args.out:
        write_markdown(result, Path(args.out))


def write_markdown(result: dict, stem: Path) -> None:
    """``<stem>.md`` (load averages, the formula check and the table) and ``<stem>.json`` through ``_results``."""
    f, rows = result["formula"], {row["arm"]: row for row in result["rows"]}
    notes = [
        f"torch threads per arm: {sorted({r['torch_threads'] for r in result['rows']})}",
        f"1-minute load averages before/after each arm: {[round(load[0], 1) for load in result['load_averages']]}",
    ]
    if "cola-m" in rows and "cola+gc" in rows:
        latents = (rows["cola-m"]["saved_bytes"] - rows["cola+gc"]["saved_bytes"]) / f["n_layers"]
        notes.append(
            f"formula check: (CoLA-M − CoLA+GC saved bytes) / layers = {latents:,.0f} B = 7r·tokens·4 = "
            f"{7 * f['r'] * result['tokens'] * 4:,} B; CoLA-M per layer (d + 7r)·tokens·4 = "
            f"{f['cola_m_bytes_per_layer']:,} B (paper's 2d + 7r: {f['paper_bytes_per_layer']:,} B)"
        )
    title = f"CoLA-M memory and step time: `{result['preset']}`, batch {result['batch_size']} × {result['seq_len']}"
    write(stem, title, results_table(result), data=result, notes=notes)


if __name__ == "__main__":
    main()
