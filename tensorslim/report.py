"""The human-readable end-of-run summary of ``tensorslim train``."""

from __future__ import annotations

from tensorslim.train.config import TrainConfig
from tensorslim.train.metrics import format_bytes
from tensorslim.train.trainer import TrainResult


def summary_lines(result: TrainResult) -> list[str]:
    """The run's truths in one line each: trainable parameters (as peft prints them), the precision used, the
    method's target reached or missed, and where the model is."""
    share = 100 * result.params_trainable / result.params_total if result.params_total else 0.0
    lines = [
        f"trainable params: {result.params_trainable:,d} || all params: {result.params_total:,d} || "
        f"trainable%: {share:.4f}"
    ]
    precision = result.precision or {}
    if precision:
        probe = precision.get("probe")
        why = f" ({probe['reason']})" if probe else ""
        lines.append(f"precision: {precision['used']} (requested {precision['requested']}){why}")
    if result.target is not None:
        target = result.target
        if target["ok"]:
            reached = f"reached {target['reached']:,.0f}"
            lines.append(f"target {target['what']} = {target['target']:,.0f}: {reached} (within 5 %)")
        else:
            lines.append(f"target {target['what']}: {target['note']}")
    if result.model_dir is not None:
        lines.append(f"model: {result.model_dir} (tensorslim predict --run {result.run_dir})")
    elif result.model_note is not None:
        lines.append(f"model: not saved ({result.model_note})")
    return lines


def print_train_summary(config: TrainConfig, result: TrainResult) -> None:
    """The end-of-run table: books against the dense baseline, speed, memory, validation."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tensorslim train: {config.preset} / {config.task} / {config.method} ({result.steps} steps)")
    table.add_column("metric")
    table.add_column(config.method, justify="right")
    table.add_column("dense", justify="right")
    table.add_column("ratio", justify="right")
    for label, ours, dense in (
        ("params (total)", result.params_total, result.dense_params_total),
        ("params (non-embedding)", result.params_non_embedding, result.dense_params_non_embedding),
        ("fwd FLOPs / token", result.flops_per_token, result.dense_flops_per_token),
    ):
        table.add_row(label, f"{ours:,.0f}", f"{dense:,.0f}", f"{ours / dense:.3f}")
    table.add_row("tokens / s (median step)", f"{result.tokens_per_s:,.0f}", "", "")
    table.add_row("peak train memory (params+grads+optim+activations)", format_bytes(result.memory["total"]), "", "")
    for name, value in result.val_metrics.items():
        table.add_row(name.replace("val_", "validation ").replace("_", " "), f"{value:.4f}", "", "")
    if result.skipped_steps:
        table.add_row("steps skipped (non-finite)", str(result.skipped_steps), "", "")
    console = Console()
    console.print(table)
    for line in summary_lines(result):
        console.print(line, highlight=False, soft_wrap=True)  # one line each, however narrow the terminal
    console.print(f"metrics: {result.run_dir}/metrics.jsonl, loss curve: {result.run_dir}/loss.png")
    console.print("dense speed and memory side by side: tensorslim bench --preset " + config.preset)
