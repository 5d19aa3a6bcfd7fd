"""Soak: a ``tiny`` run killed with SIGKILL at random moments, resumed each time, must end with exactly the loss
curve of the same run left alone.

Half the kills land at a random step, half while a checkpoint is being written (as soon as its temporary folder
appears under ``checkpoints/``). After a kill the run resumes with ``--resume`` from its last complete checkpoint
(or starts over with ``--overwrite`` when it had none yet). The result file records every kill and the comparison.

    python benchmarks/soak_resume.py --steps 2000 --kills 10 --out benchmarks/results/soak_resume.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from _results import write

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ["argparse", "ast", "calendar", "csv", "dataclasses", "difflib", "fractions", "functools", "heapq"]


def train_command(run: Path, data: Path, *, steps: int, checkpoint_every: int, resume: bool) -> list[str]:
    flags = ["--steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--vocab-size", "512"]
    flags += ["--eval-every", str(steps), "--eval-blocks", "2", "--checkpoint-every", str(checkpoint_every)]
    flags += ["--data", str(data), "--out-dir", str(run), "--no-progress", "--no-tensorboard", "--seed", "3"]
    return [sys.executable, "-m", "tensorslim", "train", *flags, "--resume" if resume else "--overwrite"]


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def logged_steps(run: Path) -> int:
    try:
        return sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}"))
    except OSError:
        return 0


def checkpoint_moment(run: Path, known: set[str]) -> str | None:
    """What a checkpoint write shows now: a temporary folder not in ``known`` (``"during a checkpoint write"``; a
    killed write leaves its own behind until the next commit), or a step folder not in ``known`` (``"right after a
    checkpoint appeared"``: the rename is done, ``latest`` and the pruning may not be). The second cannot be
    missed: a new step folder stays."""
    folder = run / "checkpoints"
    if {path.name for path in folder.glob(".tmp-*")} - known:
        return "during a checkpoint write"
    if {path.name for path in folder.glob("step_*")} - known:
        return "right after a checkpoint appeared"
    return None


def kill_once(command: list[str], run: Path, *, mode: str, target: int, env: dict[str, str]) -> str:
    """Start ``command``; SIGKILL it at step ``target`` (``mode="step"``) or at the first checkpoint write from
    step ``target`` on (``mode="checkpoint"``). Returns what happened."""
    known = {path.name for path in (run / "checkpoints").glob("*")}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        at = logged_steps(run)
        if at < target:
            known = {path.name for path in (run / "checkpoints").glob("*")}
        moment = checkpoint_moment(run, known) if mode == "checkpoint" and at >= target else None
        if (mode == "step" and at >= target) or moment:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return f"killed at step {at}" + (f" {moment}" if moment else "")
        time.sleep(0.005)
    error = proc.stderr.read().decode()[-500:] if proc.stderr else ""
    return f"ended by itself with exit {proc.returncode} {error.strip()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="of the kill moments")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "corpus"
        data.mkdir()
        for name in CORPUS:
            shutil.copy(Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py", data / f"{name}.txt")
        reference, soaked = Path(tmp) / "reference", Path(tmp) / "soaked"
        subprocess.run(
            train_command(reference, data, steps=args.steps, checkpoint_every=args.checkpoint_every, resume=False),
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        events = []
        for i in range(args.kills):
            mode = "checkpoint" if i % 2 else "step"
            start = logged_steps(soaked)
            target = rng.randint(start + 1, start + (args.steps - start) // max(args.kills - i, 1))
            resume = (soaked / "checkpoints" / "latest").exists()
            command = train_command(
                soaked, data, steps=args.steps, checkpoint_every=args.checkpoint_every, resume=resume
            )
            events.append(
                f"start {'--resume' if resume else '--overwrite'}: "
                + kill_once(command, soaked, mode=mode, target=target, env=env)
            )
            print(events[-1], flush=True)
        resume = (soaked / "checkpoints" / "latest").exists()
        final = subprocess.run(
            train_command(soaked, data, steps=args.steps, checkpoint_every=args.checkpoint_every, resume=resume),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        expected, got = losses(reference), losses(soaked)
    kills = sum("killed" in event for event in events)
    same = final.returncode == 0 and got == expected
    notes = [
        f"run: `tiny`, batch 2 x 16 tokens, {args.steps} steps, a checkpoint every {args.checkpoint_every} steps; "
        f"{time.monotonic() - started:.0f} s in all",
        f"result: **{kills} of {args.kills} kills resumed; final loss {got[-1] if got else None!r} vs "
        f"{expected[-1]!r} uninterrupted; every one of the {len(expected)} step losses identical: {same}**",
    ]
    body = [
        *[f"{n}. {event}" for n, event in enumerate(events, 1)],
        f"{len(events) + 1}. final resume: exit {final.returncode}",
    ]
    write(args.out, "Soak: SIGKILL at random moments, resume, compare with the uninterrupted run", body, notes=notes)
    sys.exit(0 if same and kills == args.kills else 1)


if __name__ == "__main__":
    main()
