"""Random spatial warps: one random affine plus a smooth elastic field, applied alike to an image and its maps.

The brain "patients" (:mod:`tensorslim.data.segment.brain`) are the MNI152 template warped this way, standing in for the
inter-subject variation of the brain CT cases of arXiv 2205.09107 (§3, data), which do not ship offline. A warp is
a sampling grid: output pixel ``(i, j)`` reads the source at ``grid[:, i, j]`` (source pixel coordinates), so every
map resampled on the same grid stays aligned with the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage


@dataclass(frozen=True, kw_only=True)
class WarpRange:
    """How far a random warp may go.

    Attributes:
        rotate_deg: largest rotation, either way, in degrees.
        scale: smallest and largest isotropic scale.
        shift_px: largest shift along each axis, in output pixels.
        elastic_px: standard deviation of the elastic displacement, in output pixels (0: affine only).
        elastic_smooth_px: Gaussian smoothing of the elastic field, in output pixels (larger: smoother).
    """

    rotate_deg: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    shift_px: float = 4.0
    elastic_px: float = 1.0
    elastic_smooth_px: float = 8.0

    def __post_init__(self) -> None:
        low, high = self.scale
        if not 0 < low <= high:
            raise ValueError(f"scale={self.scale!r} is invalid; allowed: 0 < low <= high")
        if min(self.rotate_deg, self.shift_px, self.elastic_px) < 0 or self.elastic_smooth_px <= 0:
            raise ValueError("rotate_deg, shift_px, elastic_px must be >= 0 and elastic_smooth_px > 0")


def random_grid(
    rng: np.random.Generator,
    *,
    out_shape: tuple[int, int],
    source_center: tuple[float, float],
    source_step: float,
    warp: WarpRange,
) -> np.ndarray:
    """A sampling grid ``(2, H, W)`` of source pixel coordinates for an ``out_shape`` output.

    Without a warp, output pixel ``(i, j)`` reads the source at ``source_center + source_step * (i - H/2, j - W/2)``
    (``source_step`` source pixels per output pixel). The random rotation and scale turn about the output centre,
    then the shift and the elastic field (both in output pixels) move the read position.
    """
    h, w = out_shape
    rows, cols = np.meshgrid(np.arange(h) - (h - 1) / 2, np.arange(w) - (w - 1) / 2, indexing="ij")
    angle = np.deg2rad(rng.uniform(-warp.rotate_deg, warp.rotate_deg))
    scale = rng.uniform(*warp.scale)
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    shift = rng.uniform(-warp.shift_px, warp.shift_px, size=2)
    offsets = np.stack([cos * rows - sin * cols, sin * rows + cos * cols]) + shift[:, None, None]  # (2, H, W)
    if warp.elastic_px > 0:
        offsets = offsets + elastic_field(
            rng, out_shape=out_shape, sigma_px=warp.elastic_px, smooth_px=warp.elastic_smooth_px
        )
    center = np.asarray(source_center, dtype=float)[:, None, None]
    return center + source_step * offsets


def elastic_field(
    rng: np.random.Generator, *, out_shape: tuple[int, int], sigma_px: float, smooth_px: float
) -> np.ndarray:
    """A smooth random displacement ``(2, H, W)``: white noise, Gaussian-smoothed, rescaled to std ``sigma_px``."""
    field = np.stack([ndimage.gaussian_filter(rng.standard_normal(out_shape), smooth_px) for _ in range(2)])
    return field * (sigma_px / max(float(field.std()), 1e-12))


def resample(source: np.ndarray, grid: np.ndarray, *, order: int = 1) -> np.ndarray:
    """``source`` read at ``grid`` (source pixel coordinates ``(2, H, W)``); outside the source reads 0."""
    return ndimage.map_coordinates(source, grid, order=order, mode="constant", cval=0.0)
