"""Random 2-D thorax phantoms: body, two lungs, heart and spine ellipses with jittered shapes and intensities.

arXiv 2205.09107 segments the heart in CT (§3, data: 20 patients), which does not ship offline; these phantoms
stand in for it. Every organ is placed relative to the body ellipse (its centre, axes and rotation) with a small
independent jitter, so the body silhouette carries most, not all, of the heart's position and shape: that coupling
is our choice and sets how well a silhouette alone can segment the heart (the jitter-free heart of the true body,
:func:`nominal_heart`, misses the heart's centre by about 2 mm at 4 mm pixels; ``experiments/segment_com_floor.py``).
It is tighter than in patients, whose outline also depends on subcutaneous fat that does not move the heart.
Intensities are CT-like on a 0..1 scale (air 0, lung ≈ 0.08, soft tissue ≈ 0.5, bone ≈ 0.9), drawn per case. The
heart is a myocardial wall barely brighter than soft tissue around a blood pool whose brightness follows the contrast
agent's timing (none to arterial phase), shared by the descending aorta: a heart painted one uniform grey level lets
a network trained on one case segment "that grey level", which no test-time intensity change leaves in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

FOV_MM = 384.0  # square field of view, so pixel size = FOV_MM / size (4 mm at 96 × 96)
BLOOD_CONTRAST = 0.16  # largest blood-pool brightening over soft tissue (≈ 320 HU on a 2000 HU window)
MYOCARDIUM_CONTRAST = (0.01, 0.04)  # the myocardial wall's brightening over soft tissue (≈ +20 to +80 HU)
# The heart's placement in the body frame: centre offset and semi-axes as fractions of the body's (AP, LR)
# semi-axes, its tilt from the body's AP axis, and the std of its independent centre jitter (px at 96 × 96).
HEART_OFFSET = (-0.28, 0.12)
HEART_AXES = (0.42, 0.30)
HEART_TILT = np.deg2rad(30.0)
HEART_JITTER_PX = 0.4


def ellipse(shape: tuple[int, int], center: tuple[float, float], axes: tuple[float, float], angle: float) -> np.ndarray:
    """Pixels inside the ellipse with ``center`` (row, col), semi-axes ``axes`` (row, col) and rotation ``angle``
    (radians), as a bool array of ``shape``."""
    rows, cols = np.meshgrid(np.arange(shape[0]) - center[0], np.arange(shape[1]) - center[1], indexing="ij")
    cos, sin = np.cos(angle), np.sin(angle)
    u, v = cos * rows + sin * cols, -sin * rows + cos * cols
    return (u / axes[0]) ** 2 + (v / axes[1]) ** 2 <= 1.0


@dataclass(frozen=True)
class Body:
    """A body ellipse: ``center`` (row, col) px, semi-axes ``axes`` (AP, LR) px, rotation ``angle`` (radians)."""

    center: np.ndarray
    axes: np.ndarray
    angle: float

    def rotation(self) -> np.ndarray:
        """The 2 × 2 matrix that turns body-frame (AP, LR) offsets into image (row, col) offsets."""
        cos, sin = np.cos(self.angle), np.sin(self.angle)
        return np.array([[cos, -sin], [sin, cos]])

    def mask(self, shape: tuple[int, int]) -> np.ndarray:
        return ellipse(shape, tuple(self.center), tuple(self.axes), self.angle)


def draw_body(rng: np.random.Generator, *, size: int) -> Body:
    """The body ellipse of a ``size × size`` phantom: the first draws of :func:`heart_case`."""
    unit = size / 96  # organ sizes are set for 96 × 96 and scale with the grid
    center = np.array([size / 2, size / 2]) + rng.normal(0, 4.0 * unit, 2)
    axes = np.array([27.0, 40.0]) * unit * rng.uniform(0.8, 1.2, 2)  # (AP, LR)
    return Body(center, axes, float(rng.normal(0, np.deg2rad(8))))


def nominal_heart(body: Body, shape: tuple[int, int]) -> np.ndarray:
    """The heart that ``body`` places with no jitter (mean offset, size and tilt), bool ``shape``: what the
    silhouette alone can say about the heart."""
    center = body.center + body.rotation() @ (np.asarray(HEART_OFFSET) * body.axes)
    heart = ellipse(shape, tuple(center), tuple(np.asarray(HEART_AXES) * body.axes), body.angle + HEART_TILT)
    return heart & body.mask(shape)


def body_from_silhouette(silhouette: np.ndarray) -> Body:
    """The ellipse with the silhouette's ``(H, W)`` first and second moments (a filled ellipse of semi-axis ``a``
    has variance ``a² / 4`` along it); its AP axis is the principal direction nearer the image rows."""
    rows, cols = (axis.astype(float) for axis in np.nonzero(silhouette))
    variances, vectors = np.linalg.eigh(np.cov(np.stack([rows, cols]), bias=True))
    ap = int(np.argmax(np.abs(vectors[0])))  # the eigenvector with the larger row component
    direction = vectors[:, ap] * np.sign(vectors[0, ap])
    axes = 2 * np.sqrt(variances[[ap, 1 - ap]])
    return Body(np.array([rows.mean(), cols.mean()]), axes, float(np.arctan2(direction[1], direction[0])))


def heart_case(rng: np.random.Generator, *, size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One synthetic thorax: ``(image (size, size) float32 in [0, 1], heart (size, size) bool, pixel mm)``.

    Rows run anterior (top) to posterior; the heart sits left of the midline (image right) and anterior.
    """
    shape = (size, size)
    unit = size / 96
    outline = draw_body(rng, size=size)
    body_center, body_axes, angle = outline.center, outline.axes, outline.angle
    rotate = outline.rotation()

    def place(offset: tuple[float, float], axes: tuple[float, float], jitter: float) -> tuple[np.ndarray, np.ndarray]:
        # An organ at ``offset`` (fractions of the body axes) from the body centre, turned with the body.
        where = body_center + rotate @ (np.asarray(offset) * body_axes + rng.normal(0, jitter * unit, 2))
        return where, np.asarray(axes) * body_axes * rng.uniform(0.94, 1.06, 2)

    body = outline.mask(shape)
    lungs = np.zeros(shape, dtype=bool)
    for side in (-1, 1):
        center, axes = place((-0.02, side * 0.45), (0.62, 0.33), jitter=0.8)
        lungs |= ellipse(shape, center, axes, angle + side * rng.normal(0, 0.05)) & body
    heart_center, heart_axes = place(HEART_OFFSET, HEART_AXES, jitter=HEART_JITTER_PX)
    heart_angle = angle + HEART_TILT + np.deg2rad(rng.normal(0, 4))
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
    image[heart] = tissue + rng.uniform(*MYOCARDIUM_CONTRAST)
    pool = ellipse(shape, heart_center, heart_axes * rng.uniform(0.6, 0.75), heart_angle)
    image[pool] = blood
    center, axes = place((0.45, -0.12), (0.1, 0.07), jitter=0.4)
    image[ellipse(shape, center, axes, 0.0) & body & ~spine & ~heart] = blood
    image = np.where(body, np.clip(image + texture, 0.02, 1.0), 0.0).astype(np.float32)
    return image, heart, FOV_MM / size
