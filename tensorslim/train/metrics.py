"""Training metrics: JSONL (always), TensorBoard (when installed), a summary table and a loss-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends one JSON object per record to ``metrics.jsonl``; mirrors scalars to TensorBoard when available.

    On resume the log is first cut back to the checkpoint's step, so an interrupted and resumed run leaves the
    same records as an uninterrupted one.
    """

    def __init__(self, run_dir: Path, *, resume_step: int | None = None, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [line for line in self.records() if line["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._writer = _tensorboard_writer(run_dir / "tensorboard") if tensorboard else None

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _tensorboard_writer(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(path))


def plot_loss_curve(records: list[dict[str, Any]], path: Path, *, title: str) -> None:
    """Training loss per step and validation loss at each evaluation, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``; bytes below 1 KiB are shown as whole bytes."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"
