"""Figures of a segmentation experiment (matplotlib, Agg): overlays on held-out cases, Dice vs training cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_overlays(
    images: np.ndarray, targets: np.ndarray, predictions: dict[str, np.ndarray], path: Path, *, title: str
) -> None:
    """One row per case ``images`` ``(N, H, W)``: the target (green) and each named prediction (red) outlined on the
    (test, intensity-shifted) image; one column per prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(predictions)
    fig, axes = plt.subplots(len(images), len(names), figsize=(2.2 * len(names), 2.2 * len(images)), squeeze=False)
    for row, (image, target) in enumerate(zip(images, targets, strict=True)):
        for col, name in enumerate(names):
            ax = axes[row, col]
            ax.imshow(image, cmap="gray")
            ax.contour(target, levels=[0.5], colors="lime", linewidths=0.8)
            if predictions[name][row].any():
                ax.contour(predictions[name][row], levels=[0.5], colors="red", linewidths=0.8)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(name, fontsize=8)
    fig.suptitle(f"{title} (green: truth, red: prediction)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_dice_curves(rows: list[dict], path: Path, *, title: str) -> None:
    """Mean ± std test Dice against training cases, one line per input mode (``rows``: one dict per run with
    ``inputs``, ``train_cases`` and ``dice``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    for mode in dict.fromkeys(row["inputs"] for row in rows):
        sizes = sorted({row["train_cases"] for row in rows if row["inputs"] == mode})
        values = [[row["dice"] for row in rows if row["inputs"] == mode and row["train_cases"] == n] for n in sizes]
        mean, std = np.array([np.mean(v) for v in values]), np.array([np.std(v) for v in values])
        ax.errorbar(sizes, mean, yerr=std, marker="o", capsize=3, label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training cases")
    ax.set_ylabel("test Dice (intensity-shifted)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
