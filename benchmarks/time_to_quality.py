"""Time to quality: validation loss against wall-clock time and against tokens, one training run per method.

Every arm is one ``tensorslim train`` run with the defaults a user gets (the method's recipe: learning rate, warm-up,
rank), on the same data (the built-in corpus and its held-out split), the same batches and the same number of tokens.
``ARM@LR`` (e.g. ``cola@3e-3``) is the same arm at another peak learning rate, and ``ARM:R`` (e.g. ``cola+head:256``) an
arm that factors the vocabulary at rank R instead of ``--vocab-rank``; each has its own folder. An arm's
folder under ``--runs`` is reused: a finished arm is read back, an interrupted one resumes from its last checkpoint
(``tensorslim train --resume``), so the arms can run one at a time (``--arms dense``) and the report, which reads back
every arm under ``--runs``, be written once all are there (``--report-only``). An arm stopped before its last step is
reported up to its last evaluation, marked as stopped.

Wall time is the sum of the arm's train-step times (forward, backward and optimizer, as ``metrics.jsonl`` records them
through ``tokens_per_s``); validation passes and checkpoints are left out, so every arm pays the same for them. The
time an arm needs to reach the dense run's final validation loss is interpolated linearly between the two evaluations
that straddle it; a dense run at another learning rate (``dense@LR``) is a second target (its last evaluated loss when
it was stopped), reported in a table of its own, which also gives the other way round: the time each arm needs to
reach its own final loss beside the time that dense run needs to reach the same loss. Arms run one after the other
on a machine others may be loading: the load average before and after each arm is recorded beside its figures.

Where other jobs shared the machine while the arms trained, their recorded step times are not comparable. With
``--step-repeats N`` the report instead times every reported arm's train step side by side in one process (its model
and optimizer as ``tensorslim train`` builds them, one warm-up step, then ``N`` steps per arm, arms taking turns, as
``vocab_step.py`` does; arms that differ only in learning rate share one timing) and puts each evaluation at
``step × median step time``: the curves and the time to dense's loss then rest on one side-by-side measurement taken
when the machine is quiet.

Usage::

    python benchmarks/time_to_quality.py --preset tiny --steps 200 --out benchmarks/results
    python benchmarks/time_to_quality.py --preset 60m --steps 300 --batch-size 4 --seq-len 256 --arms dense,cola@3e-3
    python benchmarks/time_to_quality.py --preset 60m --steps 300 --batch-size 4 --seq-len 256 --report-only \
        --step-repeats 10
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results, when loaded by path (tests)
from _results import table, write  # noqa: E402

from tensorslim.methods.recipes import recipe_for  # noqa: E402


@dataclass(frozen=True)
class Arm:
    """One training run: a method, optionally with a factored LM head (``factor_vocab``) and token embedding
    (``factor_embedding``) at rank ``vocab_rank`` (None: ``--vocab-rank``), AdamW's moments in bf16 and a peak
    learning rate other than the recipe's (``lr``; None: the recipe's)."""

    name: str
    method: str
    factor_vocab: bool = False
    factor_embedding: bool = False
    optimizer_state: str = "fp32"
    vocab_rank: int | None = None
    lr: float | None = None

    @property
    def step_kind(self) -> tuple[str, bool, bool, str, int | None]:
        """What its train step computes: arms that differ only in learning rate step alike."""
        return self.method, self.factor_vocab, self.factor_embedding, self.optimizer_state, self.vocab_rank

    @property
    def base(self) -> str:
        """The name in :data:`ARMS` it derives from."""
        return self.name.partition("@")[0].partition(":")[0]


ARMS = {
    arm.name: arm
    for arm in (
        Arm("dense", "dense"),
        Arm("cola", "cola"),
        Arm("cola-m", "cola-m"),
        Arm("galore", "galore"),
        Arm("comera", "comera"),
        Arm("cola+head", "cola", factor_vocab=True),
        Arm("cola+vocab", "cola", factor_vocab=True, factor_embedding=True),
        Arm("cola+bf16-state", "cola", optimizer_state="bf16"),
    )
}


def parse_arm(spec: str) -> Arm:
    """``NAME``, ``NAME:R`` (the rank of a factored vocabulary) and either with ``@LR`` (a peak learning rate > 0) as
    an :class:`Arm` named ``spec``; ValueError otherwise."""
    head, at, lr_text = spec.partition("@")
    name, colon, rank_text = head.partition(":")
    if name not in ARMS:
        raise ValueError(
            f"arm {spec!r} is unknown; allowed: one of {', '.join(ARMS)}, optionally :R and @LR (e.g. cola@3e-3)"
        )
    arm = replace(ARMS[name], name=spec)
    if colon:
        if not arm.factor_vocab or not rank_text.isdigit() or int(rank_text) < 1:
            raise ValueError(
                f"arm {spec!r} has an invalid rank {rank_text!r}; allowed: an integer >= 1 after an arm that factors "
                "the vocabulary (cola+head:256)"
            )
        arm = replace(arm, vocab_rank=int(rank_text))
    if not at:
        return arm
    try:
        lr = float(lr_text)
    except ValueError:
        lr = math.nan
    if not 0 < lr < math.inf:
        raise ValueError(f"arm {spec!r} has an invalid learning rate {lr_text!r}; allowed: a number > 0 (cola@3e-3)")
    return replace(arm, lr=lr)


def reported_arms(runs: Path) -> list[Arm]:
    """Every arm under ``runs`` with at least one evaluation (a folder named as :func:`parse_arm` reads it, finished or
    stopped), in the order of :data:`ARMS`, each method's recipe run first and then by falling learning rate, then by
    rank."""
    found = []
    for run_dir in runs.iterdir() if runs.is_dir() else ():
        try:
            arm = parse_arm(run_dir.name)
        except ValueError:
            continue
        if (run_dir / "metrics.jsonl").exists() and evaluations(run_dir, tokens_per_step=1):
            found.append(arm)
    order = list(ARMS)
    return sorted(found, key=lambda arm: (order.index(arm.base), -(arm.lr or math.inf), arm.vocab_rank or 0))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="LLaMA preset (default: tiny)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per arm (default: 200)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: train's 16)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: train's 128)")
    parser.add_argument("--eval-every", type=int, default=25, help="steps between validation passes (default: 25)")
    parser.add_argument("--eval-blocks", type=int, default=64, help="held-out sequences (default: train's 64)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", default="fp32", help="train's --dtype: fp32, bf16 or auto (default: fp32)")
    parser.add_argument(
        "--vocab-rank", type=int, default=None, help="rank of the factored head and embedding (default: the CoLA rank)"
    )
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated arms to run, each NAME, NAME:R for an arm that factors the vocabulary at rank R, and "
        f"either with @LR to override the recipe's peak learning rate (default: all of {', '.join(ARMS)})",
    )
    parser.add_argument("--runs", default=None, help="folder of the arms' runs (default: runs/ttq-<preset>)")
    parser.add_argument("--out", default="benchmarks/results", help="where the dated result files go")
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--report-only", action="store_true", help="train nothing; report the arms found")
    parser.add_argument(
        "--step-repeats",
        type=int,
        default=0,
        help="time N train steps per arm side by side and place the curves at step × median step time (default: "
        "0, the step times recorded while training)",
    )
    args = parser.parse_args(argv)
    try:
        args.arm_list = [parse_arm(spec) for spec in args.arms.split(",")]
    except ValueError as error:
        parser.error(f"--arms: {error}")
    if args.step_repeats < 0:
        parser.error(f"--step-repeats {args.step_repeats} is invalid; allowed: an integer >= 0")
    for name in ("steps", "batch_size", "seq_len", "eval_every", "eval_blocks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; allowed: an integer >= 1")
    return args


def vocab_rank(args: argparse.Namespace, arm: Arm) -> int:
    """The rank of ``arm``'s factored vocabulary: its own, else ``--vocab-rank``, else the preset's CoLA rank."""
    return arm.vocab_rank or args.vocab_rank or recipe_for(args.preset).cola_rank or 64


def train_command(arm: Arm, args: argparse.Namespace, run_dir: Path, *, resume: bool) -> list[str]:
    command = [sys.executable, "-m", "tensorslim", "train", "--preset", args.preset, "--method", arm.method]
    command += ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    command += ["--eval-every", str(args.eval_every), "--eval-blocks", str(args.eval_blocks)]
    command += ["--checkpoint-every", str(args.eval_every), "--out-dir", str(run_dir), "--no-progress"]
    command += ["--no-tensorboard", "--device", args.device, "--dtype", args.dtype]
    if arm.lr is not None:
        command += ["--lr", repr(arm.lr)]
    if arm.factor_vocab:
        command += ["--factor-vocab", str(vocab_rank(args, arm))]
    if arm.factor_embedding:
        command += ["--factor-embedding"]
    if arm.optimizer_state != "fp32":
        command += ["--optimizer-state", arm.optimizer_state]
    return command + (["--resume"] if resume else [])


def run_arm(arm: Arm, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Train ``arm`` into ``run_dir`` (resuming a started run); the load average around it."""
    if (run_dir / "summary.json").exists():
        return json.loads((run_dir / "arm.json").read_text()) if (run_dir / "arm.json").exists() else {}
    resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    command = train_command(arm, args, run_dir, resume=resume)
    if run_dir.exists() and not resume:  # stopped before its first checkpoint: nothing to keep
        command.append("--overwrite")
    print(f"[{arm.name}] {shlex.join(command[1:])}", flush=True)
    before = os.getloadavg()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    info = {"command": shlex.join(["python", *command[1:]]), "load_before": before, "load_after": os.getloadavg()}
    (run_dir / "arm.json").write_text(json.dumps(info) + "\n")
    return info


def peak_lr(run_dir: Path) -> float:
    """The highest learning rate the run's steps used, as ``metrics.jsonl`` records them."""
    return max(json.loads(line)["lr"] for line in (run_dir / "metrics.jsonl").read_text().splitlines())


def evaluations(run_dir: Path, tokens_per_step: int) -> list[dict[str, float]]:
    """``[{step, tokens, seconds, val_loss}]`` at each evaluation; seconds is the summed train-step time so far."""
    points, seconds = [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        seconds += tokens_per_step / record["tokens_per_s"]
        if record.get("val_loss") is not None:
            points.append(
                {"step": record["step"], "tokens": record["tokens"], "seconds": seconds, "val_loss": record["val_loss"]}
            )
    return points


def reach(points: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """Seconds and tokens at which the validation loss first reaches ``target`` (linear between evaluations)."""
    previous = None
    for point in points:
        if point["val_loss"] <= target:
            if previous is None:
                return {"seconds": point["seconds"], "tokens": point["tokens"]}
            share = (previous["val_loss"] - target) / (previous["val_loss"] - point["val_loss"])
            return {key: previous[key] + share * (point[key] - previous[key]) for key in ("seconds", "tokens")}
        previous = point
    return None


def time_to_loss(arm: dict[str, Any], dense: dict[str, Any], tokens_per_arm: int) -> dict[str, float] | None:
    """Seconds and tokens ``arm`` needs to reach the ``dense`` run's final loss, also as shares of dense's time and of
    the tokens of a run; None if it never does."""
    reached = reach(arm["evaluations"], dense["final_val_loss"])
    return reached and {
        **reached,
        "time_vs_dense": reached["seconds"] / dense["train_seconds"],
        "tokens_vs_dense": reached["tokens"] / tokens_per_arm,
    }


def time_to_own_loss(arm: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float] | None:
    """The seconds ``arm`` needs to reach its own final loss beside the seconds the ``baseline`` run needs to reach
    the same loss, and their ratio: how much sooner the arm reaches the quality it ends at. None if the baseline never
    reaches it."""
    theirs = reach(baseline["evaluations"], arm["final_val_loss"])
    if theirs is None:
        return None
    own = reach(arm["evaluations"], arm["final_val_loss"])
    return {
        "seconds": own["seconds"],
        "baseline_seconds": theirs["seconds"],
        "time_vs_baseline": own["seconds"] / theirs["seconds"],
    }


def step_seconds(arms: list[Arm], args: argparse.Namespace) -> dict[str, float]:
    """The median train-step seconds of each of ``arms`` by name, timed side by side in this process: one warm-up
    step, then ``args.step_repeats`` steps per kind of step, kinds taking turns so that the machine's noise hits them
    alike; arms that differ only in learning rate share their kind's timing."""
    import torch
    from vocab_step import Arm as Stepped
    from vocab_step import Model

    from tensorslim.bench.harness import BenchConfig, synthetic_batch
    from tensorslim.train.execution import resolve_dtype

    dtype = resolve_dtype(args.dtype, args.device)[0]
    stepped = {}
    for arm in arms:
        if arm.step_kind not in stepped:
            rank = vocab_rank(args, arm) if arm.factor_vocab else 0
            model = Model(
                args.preset,
                arm.method,
                rank,
                args.seq_len,
                args.device,
                factor_embedding=arm.factor_embedding,
                optimizer_state=arm.optimizer_state,
            )
            stepped[arm.step_kind] = Stepped(model, dtype)
    config = BenchConfig(preset=args.preset, task="lm", batch_size=args.batch_size, seq_len=args.seq_len)
    batch = synthetic_batch(config).to(torch.device(args.device))
    for index in range(1 + args.step_repeats):
        for kind in stepped.values():
            kind.step(batch, timed=index >= 1)
    return {arm.name: statistics.median(stepped[arm.step_kind].times) for arm in arms}


def summarize(args: argparse.Namespace, runs: Path, infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tokens_per_step = args.batch_size * args.seq_len
    arms: dict[str, Any] = {}
    found = reported_arms(runs)
    for arm in found:
        run_dir = runs / arm.name
        finished = (run_dir / "summary.json").exists()
        summary = json.loads((run_dir / "summary.json").read_text()) if finished else {}
        points = evaluations(run_dir, tokens_per_step)
        arms[arm.name] = {
            "method": arm.method,
            "factor_vocab": vocab_rank(args, arm) if arm.factor_vocab else 0,
            "factor_embedding": arm.factor_embedding,
            "optimizer_state": arm.optimizer_state,
            "peak_lr": peak_lr(run_dir),
            "params": summary.get("params_total"),
            "flops_per_token": summary.get("flops_per_token"),
            "stopped": not finished,
            "steps": points[-1]["step"],  # of the last evaluation: the run's last step unless it was stopped
            "final_val_loss": points[-1]["val_loss"],
            "train_seconds": points[-1]["seconds"],
            "median_tokens_per_s": summary.get("tokens_per_s"),
            "evaluations": points,
            **infos.get(arm.name, {}),
        }
    if args.step_repeats:
        for name, seconds in step_seconds(found, args).items():
            arm = arms[name]
            arm["recorded_train_seconds"], arm["step_seconds"] = arm["train_seconds"], seconds
            for point in arm["evaluations"]:
                point["seconds"] = point["step"] * seconds
            arm["train_seconds"] = arm["steps"] * seconds
    dense = arms.get("dense")
    if dense is not None:
        for arm in arms.values():
            arm["to_dense_loss"] = time_to_loss(arm, dense, args.steps * tokens_per_step)
            arm["step_speedup_vs_dense"] = (dense["train_seconds"] / dense["steps"]) / (
                arm["train_seconds"] / arm["steps"]
            )
    # A dense run at another learning rate is a second target: its final loss (its last evaluated one if it was
    # stopped), reached in what share of its time to there; and, the other way round, its time to each arm's final
    # loss.
    other_targets = {name: arm["final_val_loss"] for name, arm in arms.items() if name.startswith("dense@")}
    for name in other_targets:
        for arm in arms.values():
            arm.setdefault("to_loss_of", {})[name] = time_to_loss(arm, arms[name], args.steps * tokens_per_step)
            arm.setdefault("own_loss_vs", {})[name] = time_to_own_loss(arm, arms[name])
    return {
        "config": {
            "preset": args.preset,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "tokens_per_arm": args.steps * tokens_per_step,
            "eval_every": args.eval_every,
            "eval_blocks": args.eval_blocks,
            "device": args.device,
            "dtype": args.dtype,
            "step_repeats": args.step_repeats,
            "data": "stdlib (built-in corpus), held-out split",
        },
        "target": dense and dense["final_val_loss"],
        "other_targets": other_targets,
        "arms": arms,
    }


def title(result: dict[str, Any]) -> str:
    config = result["config"]
    steps = f"{config['steps']} steps of {config['batch_size']} × {config['seq_len']} tokens"
    return f"Time to quality: {config['preset']}, {steps}"


def notes(result: dict[str, Any]) -> list[str]:
    """The run's settings, under the shared header (command, date, CPU kind, load when reported)."""
    config = result["config"]
    return [
        "each arm's load average before and after it is in the JSON",
        f"data: {config['data']}; {config['tokens_per_arm']:,} tokens per arm; validation on {config['eval_blocks']} "
        f"held-out sequences every {config['eval_every']} steps",
        f"device: {config['device']}, --dtype {config['dtype']}; every other setting the method's default, except the "
        "peak learning rate of an arm named NAME@LR",
        (
            f"wall time: steps × each arm's median train step, timed side by side ({config['step_repeats']} steps per "
            "arm, arms taking turns; the step times recorded while training are in the JSON)"
            if config["step_repeats"]
            else "wall time: summed train-step time (forward, backward, optimizer), validation and checkpoints excluded"
        ),
    ]


def markdown(result: dict[str, Any]) -> list[str]:
    """The target and the table: every arm's final loss, time and the time and tokens it needs to reach dense's;
    one more table per dense run at another learning rate, with the time and tokens to reach its loss and that run's
    time to each arm's final loss."""
    lines = []
    target = result["target"]
    if target is not None:
        lines += [f"Target: the dense run's final validation loss, **{target:.4f}**.", ""]
    rows = []
    for name, arm in result["arms"].items():
        reached = arm.get("to_dense_loss")
        rows.append(
            [name, "—" if arm["params"] is None else f"{arm['params']:,}", f"{arm['peak_lr']:.1e}"]
            + [f"{arm['final_val_loss']:.4f}" + (f" (stopped at step {arm['steps']})" if arm["stopped"] else "")]
            + [f"{arm['train_seconds']:.1f}"]
            + [f"{arm.get('step_speedup_vs_dense', float('nan')):.2f}"]
            + (
                [f"{reached['seconds']:.1f}", f"{reached['time_vs_dense']:.2f}", f"{reached['tokens']:,.0f}"]
                if reached
                else ["not reached", "—", "—"]
            )
        )
    columns = ["arm", "params", "peak lr", "final val loss", "train time (s)", "step speed × dense"]
    columns.append("time to dense's loss (s)")
    lines += table([*columns, "× dense time", "tokens to dense's loss"], rows)
    for target_name, target in result.get("other_targets", {}).items():
        baseline = result["arms"][target_name]
        which = f"validation loss at step {baseline['steps']}, where it was stopped" if baseline["stopped"] else ""
        lines += ["", f"Target: the {target_name} run's {which or 'final validation loss'}, **{target:.4f}**.", ""]
        rows = []
        for name, arm in result["arms"].items():
            reached, own = arm["to_loss_of"][target_name], arm["own_loss_vs"][target_name]
            cells = (
                [f"{reached['seconds']:.1f}", f"{reached['time_vs_dense']:.2f}", f"{reached['tokens']:,.0f}"]
                if reached
                else ["not reached", "—", "—"]
            )
            cells += (
                [f"{own['seconds']:.1f}", f"{own['baseline_seconds']:.1f}", f"{own['time_vs_baseline']:.2f}"]
                if own
                else ["—", f"{target_name} does not reach it", "—"]
            )
            rows.append([name, *cells])
        columns = [f"time to {target_name}'s loss (s)", f"× {target_name}'s time", f"tokens to {target_name}'s loss"]
        columns += ["time to its final loss (s)", f"{target_name}'s time to that loss (s)", f"× {target_name}'s"]
        lines += table(["arm", *columns], rows)
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, arm in result["arms"].items():
        points = arm["evaluations"]
        losses = [p["val_loss"] for p in points]
        by_time.plot([p["seconds"] for p in points], losses, marker=".", label=name)
        by_tokens.plot([p["tokens"] for p in points], losses, marker=".", label=name)
    for axis in (by_time, by_tokens):
        for target in [result["target"], *result.get("other_targets", {}).values()]:
            if target is not None:
                axis.axhline(target, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    by_time.set_xlabel("train-step wall time (s)")
    by_tokens.set_xlabel("tokens")
    by_time.set_ylabel("validation loss")
    by_time.legend()
    config = result["config"]
    fig.suptitle(f"time to quality: {config['preset']}, {config['batch_size']} × {config['seq_len']} per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = Path(args.runs or f"runs/ttq-{args.preset}")
    infos = {}
    if not args.report_only:
        for arm in args.arm_list:
            infos[arm.name] = run_arm(arm, args, runs / arm.name)
    for arm in reported_arms(runs):
        if arm.name not in infos and (runs / arm.name / "arm.json").exists():
            infos[arm.name] = json.loads((runs / arm.name / "arm.json").read_text())
    result = summarize(args, runs, infos)
    if not result["arms"]:
        print(f"no arm with an evaluation under {runs}", file=sys.stderr)
        return 2
    out = Path(args.out)
    stem = f"time_to_quality_{args.preset}_{datetime.datetime.now(datetime.UTC):%Y-%m-%d}{args.tag}"
    figure = f"![validation loss against time and tokens]({stem}.png)"
    write(out / stem, title(result), [*markdown(result), figure], data=result, notes=notes(result))
    plot(result, out / f"{stem}.png")
    print("\n".join(markdown(result)))
    print(f"wrote {out / stem}.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
