"""The two offline segmentation data sets, their splits, the test-time intensity shift and the network inputs.

``brain`` (warped MNI152 slices, target: lateral ventricles; :mod:`tensorslim.data.segment.brain`) and ``heart`` (thorax
phantoms, target: heart; :mod:`tensorslim.data.segment.phantoms`). The training pools have the paper's training-set
sizes (arXiv 2205.09107, §3: brain 26 and heart 12 training cases); validation and test sets are ours (synthetic
cases cost nothing, so the test sets are larger than the paper's 10 and 5, for steadier means). Case ``i`` of a split
is drawn from its own seed, so it is the same in every run; the test cases carry an intensity shift (gamma, bias
field, noise) that the image feels and the global mask does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tensorslim._checks import require_int
from tensorslim.data.segment.brain import brain_case
from tensorslim.data.segment.masks import global_mask, prior_mask
from tensorslim.data.segment.phantoms import heart_case
from tensorslim.data.segment.warps import WarpRange

# The brain cases' spread: ±10° rotation, ×0.9-1.1 scale, ±4 px shift and a 0.6 px elastic field (1.25 mm at 96 px).
BRAIN_WARP = WarpRange(elastic_px=0.6)
INPUT_MODES = ("mask", "image", "image+mask", "prior", "image+prior")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Cases:
    """A stack of cases of one size: images ``(N, H, W)`` float32, targets ``(N, H, W)`` bool, pixel mm."""

    images: np.ndarray
    targets: np.ndarray
    spacing: tuple[float, float]

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, index: np.ndarray | list[int]) -> Cases:
        return Cases(self.images[index], self.targets[index], self.spacing)


@dataclass(frozen=True, kw_only=True)
class IntensityShift:
    """The test-time intensity change: ``(image ** gamma) * bias + noise``.

    Attributes:
        gamma: two ranges; each case draws from one of them (darker or brighter contrast, never about 1).
        bias: amplitude of the smooth multiplicative bias field (a random plane plus a bump), ``1 ± bias``.
        noise: standard deviation of the additive Gaussian noise (on the 0..1 scale).
    """

    gamma: tuple[tuple[float, float], ...] = ((0.6, 0.8), (1.3, 1.6))
    bias: float = 0.2
    noise: float = 0.03

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        low, high = self.gamma[int(rng.integers(len(self.gamma)))]
        shifted = np.power(image, rng.uniform(low, high)) * self.bias_field(image.shape, rng)
        return (shifted + rng.normal(0, self.noise, image.shape)).astype(np.float32)

    def bias_field(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        rows, cols = np.meshgrid(np.linspace(-1, 1, shape[0]), np.linspace(-1, 1, shape[1]), indexing="ij")
        field = rng.uniform(-1, 1) * rows + rng.uniform(-1, 1) * cols
        center = rng.uniform(-0.5, 0.5, 2)
        field = field + np.exp(-((rows - center[0]) ** 2 + (cols - center[1]) ** 2) / 0.5) * rng.choice((-1, 1))
        return 1.0 + self.bias * field / max(float(np.abs(field).max()), 1e-12)


@dataclass(frozen=True)
class DatasetSpec:
    """One data set: how to draw a case and its split sizes."""

    draw: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray, float]]
    sizes: dict[str, int]
    key: int  # part of every case's seed, so the data sets draw independent cases


DATASETS: dict[str, DatasetSpec] = {
    "brain": DatasetSpec(
        lambda rng, size: brain_case(rng, size=size, warp=BRAIN_WARP), {"train": 26, "val": 10, "test": 20}, 1
    ),
    "heart": DatasetSpec(lambda rng, size: heart_case(rng, size=size), {"train": 12, "val": 5, "test": 20}, 2),
}


def check_dataset(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"dataset={name!r} is unknown; allowed: {list(DATASETS)}")
    return DATASETS[name]


def check_inputs(mode: str) -> str:
    if mode not in INPUT_MODES:
        raise ValueError(f"inputs={mode!r} is unknown; allowed: {list(INPUT_MODES)}")
    return mode


def input_channels(mode: str) -> int:
    """The U-Net's input channels for input ``mode``: 2 with the image and a mask, else 1."""
    return 2 if check_inputs(mode).startswith("image+") else 1


@lru_cache(maxsize=16)
def load_split(
    dataset: str, split: str, *, size: int, shift: IntensityShift | None = None, count: int | None = None
) -> Cases:
    """The cases of ``split`` of ``dataset`` at ``size × size``; the test split takes ``shift`` when given.

    ``count`` cases are drawn (default: the split's size, the paper's for ``train``). Case ``i`` has its own seed,
    so a larger ``count`` keeps the first cases and adds new ones: the synthetic data can grow a pool at will.
    """
    spec = check_dataset(dataset)
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; allowed: {list(SPLITS)}")
    if count is not None:
        require_int("count", count, minimum=1)
    images, targets, spacing = [], [], 0.0
    for i in range(spec.sizes[split] if count is None else count):
        rng = np.random.default_rng([spec.key, SPLITS.index(split), i])
        image, target, spacing = spec.draw(rng, size)
        if shift is not None:
            image = shift.apply(image, rng)
        images.append(image)
        targets.append(target)
    return Cases(np.stack(images), np.stack(targets), (spacing, spacing))


def global_masks(images: np.ndarray) -> np.ndarray:
    """:func:`global_mask` of each image ``(N, H, W)`` → bool ``(N, H, W)``."""
    return np.stack([global_mask(image) for image in images])


def network_inputs(cases: Cases, mode: str, *, prior: np.ndarray) -> np.ndarray:
    """The U-Net input ``(N, C, H, W)`` float32 for input ``mode``; ``prior`` ``(H, W)`` is the population mask of
    the training targets (used by the ``prior`` modes)."""
    check_inputs(mode)
    if prior.shape != cases.images.shape[1:]:
        raise ValueError(f"prior mask has shape {prior.shape}; allowed: the images' {cases.images.shape[1:]}")
    channels = []
    if mode.startswith("image"):
        channels.append(cases.images)
    if mode.endswith("mask"):
        channels.append(global_masks(cases.images))
    if mode.endswith("prior"):
        channels.append(np.broadcast_to(prior, cases.images.shape))
    return np.stack(channels, axis=1).astype(np.float32)


def train_prior(cases: Cases) -> np.ndarray:
    """The population prior of a training set (:func:`prior_mask` of its targets)."""
    return prior_mask(cases.targets)
