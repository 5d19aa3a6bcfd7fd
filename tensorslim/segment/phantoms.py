"""Random 2-D thorax phantoms: body, two lungs, heart and spine ellipses with jittered shapes and intensities.

arXiv 2205.09107 segments the heart in CT (§3, data: 20 patients), which does not ship offline; these phantoms
stand in for it. Every organ is placed relative to the body ellipse (its centre, axes and rotation) with a small
independent jitter, so the body silhouette carries most, not all, of the heart's position and shape: that coupling
is our choice and sets how well a silhouette alone can segment the heart. Intensities are CT-like on a 0..1 scale
(air 0, lung ≈ 0.08, soft tissue ≈ 0.5, bone ≈ 0.9), drawn per case. The heart is a myocardial wall barely brighter
than soft tissue around a blood pool whose brightness follows the contrast agent's timing (none to arterial phase),
shared by the descending aorta: a heart painted one uniform grey level lets a network trained on one case segment
"that grey level", which no test-time intensity change leaves in place.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

FOV_MM = 384.0  # square field of view, so pixel size = FOV_MM / size (4 mm at 96 × 96)
BLOOD_CONTRAST = 0.16  # largest blood-pool brightening over soft tissue (≈ 320 HU on a 2000 HU window)


def ellipse(shape: tuple[int, int], center: tuple[float, float], axes: tuple[float, float], angle: float) -> np.ndarray:
    """Pixels inside the ellipse with ``center`` (row, col), semi-axes ``axes`` (row, col) and rotation ``angle``
    (radians), as a bool array of ``shape``."""
    rows, cols = np.meshgrid(np.arange(shape[0]) - center[0], np.arange(shape[1]) - center[1], indexing="ij")
    cos, sin = np.cos(angle), np.sin(angle)
    u, v = cos * rows + sin * cols, -sin * rows + cos * cols
    return (u / axes[0]) ** 2 + (v / axes[1]) ** 2 <= 1.0


def heart_case(rng: np.random.Generator, *, size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One synthetic thorax: ``(image (size, size) float32 in [0, 1], heart (size, size) bool, pixel mm)``.

    Rows run anterior (top) to posterior; the heart sits left of the midline (image right) and anterior.
    """
    shape = (size, size)
    unit = size / 96  # organ sizes are set for 96 × 96 and scale with the grid
    body_center = np.array([size / 2, size / 2]) + rng.normal(0, 4.0 * unit, 2)
    body_axes = np.array([27.0, 40.0]) * unit * rng.uniform(0.8, 1.2, 2)  # (AP, LR)
    angle = rng.normal(0, np.deg2rad(8))
    rotate = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])

    def place(offset: tuple[float, float], axes: tuple[float, float], jitter: float) -> tuple[np.ndarray, np.ndarray]:
        # An organ at ``offset`` (fractions of the body axes) from the body centre, turned with the body.
        where = body_center + rotate @ (np.asarray(offset) * body_axes + rng.normal(0, jitter * unit, 2))
        return where, np.asarray(axes) * body_axes * rng.uniform(0.94, 1.06, 2)

    body = ellipse(shape, body_center, body_axes, angle)
    lungs = np.zeros(shape, dtype=bool)
    for side in (-1, 1):
        center, axes = place((-0.02, side * 0.45), (0.62, 0.33), jitter=0.8)
        lungs |= ellipse(shape, center, axes, angle + side * rng.normal(0, 0.05)) & body
    heart_center, heart_axes = place((-0.28, 0.12), (0.42, 0.30), jitter=0.4)
    heart_angle = angle + np.deg2rad(rng.normal(30, 4))
    heart = ellipse(shape, heart_center, heart_axes, heart_angle) & body
    center, axes = place((0.72, 0.0), (0.16, 0.11), jitter=0.4)
    spine = ellipse(shape, center, axes, angle) & body

    image = np.zeros(shape, dtype=np.float32)
    tissue = rng.uniform(0.46, 0.54)
    image[body] = tissue
    image[lungs] = rng.uniform(0.05, 0.11)
    rng.uniform(0.58, 0.66)  # the former uniform heart level: drawn still, so every later draw stays the same
    image[spine] = rng.uniform(0.85, 0.95)
    texture = ndimage.gaussian_filter(rng.standard_normal(shape), 1.5 * unit) * 0.04 * np.sqrt(unit)
    # The heart is a myocardial wall barely brighter than the surrounding soft tissue around a blood pool whose
    # brightness depends on the contrast agent's timing, from none (non-contrast CT: blood ≈ muscle) to arterial
    # phase; the descending aorta, beside the spine, carries the same blood.
    blood = tissue + rng.uniform(0.0, BLOOD_CONTRAST)
    image[heart] = tissue + rng.uniform(0.01, 0.04)
    pool = ellipse(shape, heart_center, heart_axes * rng.uniform(0.6, 0.75), heart_angle)
    image[pool] = blood
    center, axes = place((0.45, -0.12), (0.1, 0.07), jitter=0.4)
    image[ellipse(shape, center, axes, 0.0) & body & ~spine & ~heart] = blood
    image = np.where(body, np.clip(image + texture, 0.02, 1.0), 0.0).astype(np.float32)
    return image, heart, FOV_MM / size
