"""Dice, 95 % Hausdorff and centre-of-mass distance (mm) against hand-made shapes and a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from tensorslim.tasks.segment.metrics import case_metrics, com_distance, dice, hd95, surface


def square(shape: tuple[int, int], top: int, left: int, side: int) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    mask[top : top + side, left : left + side] = True
    return mask


def test_dice_of_half_overlapping_squares() -> None:
    a, b = square((30, 30), 5, 5, 10), square((30, 30), 5, 10, 10)  # overlap 10 × 5 = 50 of 100 + 100
    assert dice(a, b) == pytest.approx(0.5)
    assert dice(a, a) == 1.0 and dice(a, ~a) == 0.0
    assert dice(np.zeros_like(a), np.zeros_like(a)) == 1.0


def test_single_pixels_give_their_distance_in_mm() -> None:
    a, b = np.zeros((10, 10), dtype=bool), np.zeros((10, 10), dtype=bool)
    a[2, 3], b[5, 7] = True, True
    spacing = (2.0, 0.5)  # anisotropic pixels: 3 rows = 6 mm, 4 columns = 2 mm
    assert hd95(a, b, spacing) == pytest.approx(np.hypot(6, 2))
    assert com_distance(a, b, spacing) == pytest.approx(np.hypot(6, 2))


def test_com_distance_of_shifted_rectangles() -> None:
    a = np.zeros((40, 40), dtype=bool)
    a[10:20, 20:26] = True
    b = np.roll(a, (3, 4), axis=(0, 1))
    assert com_distance(a, b, (2.0, 3.0)) == pytest.approx(np.hypot(3 * 2.0, 4 * 3.0))


def brute_hd95(a: np.ndarray, b: np.ndarray, spacing: tuple[float, float]) -> float:
    # Independent reference: all pairwise boundary distances, directed 95th percentiles, the larger one.
    pa, pb = np.argwhere(surface(a)) * spacing, np.argwhere(surface(b)) * spacing
    d = cdist(pa, pb)
    return max(np.percentile(d.min(1), 95), np.percentile(d.min(0), 95))


def test_hd95_matches_brute_force_on_discs_and_blobs() -> None:
    rows, cols = np.mgrid[:48, :48]
    inner = (rows - 24) ** 2 + (cols - 24) ** 2 <= 8**2
    outer = (rows - 24) ** 2 + (cols - 22) ** 2 <= 14**2
    assert hd95(inner, outer, (1.0, 1.0)) == pytest.approx(brute_hd95(inner, outer, (1.0, 1.0)))
    # Concentric discs of radii 8 and 14: every boundary distance is about 6 px.
    ring = (rows - 24) ** 2 + (cols - 24) ** 2 <= 14**2
    assert hd95(inner, ring, (1.5, 1.5)) == pytest.approx(6 * 1.5, abs=1.5)
    rng = np.random.default_rng(0)
    for _ in range(3):
        a, b = rng.random((24, 24)) > 0.7, rng.random((24, 24)) > 0.6
        assert hd95(a, b, (0.7, 1.3)) == pytest.approx(brute_hd95(a, b, (0.7, 1.3)))


def test_empty_prediction_has_no_distance() -> None:
    a = square((20, 20), 2, 2, 5)
    metrics = case_metrics(np.zeros_like(a), a, (1.0, 1.0))
    assert metrics["dice"] == 0.0 and np.isnan(metrics["hd95_mm"]) and np.isnan(metrics["com_mm"])


def test_largest_component_drops_a_stray_blob_and_its_centre_of_mass_pull() -> None:
    from tensorslim.data.segment.masks import largest_component

    target = square((40, 40), 10, 10, 8)  # centre (13.5, 13.5)
    pred = target | square((40, 40), 35, 35, 2)  # a 4-pixel blob far away: centre moves by 4/68 of (22, 22)
    assert com_distance(pred, target, (2.0, 2.0)) == pytest.approx(2.0 * np.hypot(22, 22) * 4 / 68)
    kept = largest_component(pred)
    assert np.array_equal(kept, target) and com_distance(kept, target, (2.0, 2.0)) == 0.0
    diagonal = np.zeros((6, 6), dtype=bool)
    diagonal[[1, 2, 3], [1, 2, 3]] = True  # touching corners: one 8-connected component
    assert np.array_equal(largest_component(diagonal), diagonal)
    assert not largest_component(np.zeros((5, 5), dtype=bool)).any()
    with pytest.raises(ValueError, match="allowed: a 2-D"):
        largest_component(np.zeros(5, dtype=bool))
