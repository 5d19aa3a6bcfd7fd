"""Training metrics: JSONL (always), TensorBoard (when installed), a summary table and a loss-curve PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Field that names a record's non-finite top-level values, which the JSON itself holds as null.
NONFINITE_KEY = "nonfinite"


class MetricsLog:
    """Appends one JSON object per record to ``metrics.jsonl``; mirrors scalars to TensorBoard when available.

    Every line is strict JSON (RFC 8259 has no NaN or Infinity): a non-finite float is written as ``null``, and a
    top-level one is also named in the record's ``"nonfinite"`` object (``{"loss": "nan"}``), which
    :meth:`records` uses to give back the logged floats. On resume the log is first cut back to the checkpoint's
    step, so an interrupted and resumed run leaves the same records as an uninterrupted one.
    """

    def __init__(self, run_dir: Path, *, resume_step: int | None = None, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [line for line in self.records() if line["step"] <= resume_step]
            self.path.write_text("".join(json_line(r) for r in kept))
        self._writer = _tensorboard_writer(run_dir / "tensorboard") if tensorboard else None

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [_restore(json.loads(line)) for line in self.path.read_text().splitlines() if line.strip()]

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json_line(record))
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of strict JSON: non-finite floats become null, the top-level ones named.

    Args:
        record: A flat metrics record; nested lists and dicts are allowed (their non-finite floats become null).

    Returns:
        The JSON text and a newline.
    """
    nonfinite = {key: _name(value) for key, value in record.items() if _is_nonfinite(value)}
    strict = {key: strict_json(value) for key, value in record.items()}
    if nonfinite:
        strict[NONFINITE_KEY] = nonfinite
    return json.dumps(strict, allow_nan=False) + "\n"


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth of lists/tuples/dicts, replaced by None."""
    if _is_nonfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value


def _is_nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _name(value: float) -> str:
    """``"nan"``, ``"inf"`` or ``"-inf"``: what ``float()`` parses back."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _restore(record: dict[str, Any]) -> dict[str, Any]:
    """A record read from the log with its named non-finite values put back as floats."""
    for key, name in record.pop(NONFINITE_KEY, {}).items():
        record[key] = float(name)
    return record


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
