"""Segmentation metrics in physical units: Dice, 95 % Hausdorff distance and centre-of-mass distance (mm).

arXiv 2205.09107 reports Dice and the Euclidean distance between predicted and true centres of mass in mm (abstract);
we add the 95th-percentile symmetric Hausdorff distance, the usual boundary metric. Masks are bool ``(H, W)``
arrays and ``spacing`` the pixel size (row, column) in mm.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def _check_pair(pred: np.ndarray, target: np.ndarray) -> None:
    if pred.shape != target.shape or pred.ndim != 2:
        raise ValueError(f"mask shapes {pred.shape} and {target.shape} are invalid; allowed: two equal (H, W) shapes")


def dice(pred: np.ndarray, target: np.ndarray) -> float:
    """``2|P ∩ T| / (|P| + |T|)``; 1 when both are empty."""
    _check_pair(pred, target)
    total = int(pred.sum()) + int(target.sum())
    return 1.0 if total == 0 else 2.0 * int((pred & target).sum()) / total


def surface(mask: np.ndarray) -> np.ndarray:
    """The mask's boundary pixels: those with a 4-neighbour outside (or on the image border)."""
    return mask & ~ndimage.binary_erosion(mask, border_value=0)


def hd95(pred: np.ndarray, target: np.ndarray, spacing: tuple[float, float]) -> float:
    """The 95 % Hausdorff distance in mm: the larger of the two directed 95th percentiles of boundary-to-boundary
    distances (MONAI's ``compute_hausdorff_distance(percentile=95)`` convention); ``nan`` when a mask is empty."""
    _check_pair(pred, target)
    if not pred.any() or not target.any():
        return float("nan")
    edge_p, edge_t = surface(pred), surface(target)
    to_t = ndimage.distance_transform_edt(~edge_t, sampling=spacing)[edge_p]
    to_p = ndimage.distance_transform_edt(~edge_p, sampling=spacing)[edge_t]
    return float(max(np.percentile(to_t, 95), np.percentile(to_p, 95)))


def center_of_mass_mm(mask: np.ndarray, spacing: tuple[float, float]) -> np.ndarray:
    """The centre of mass (row, column) in mm."""
    return np.asarray(ndimage.center_of_mass(mask)) * np.asarray(spacing)


def com_distance(pred: np.ndarray, target: np.ndarray, spacing: tuple[float, float]) -> float:
    """Euclidean distance between the centres of mass in mm; ``nan`` when a mask is empty."""
    _check_pair(pred, target)
    if not pred.any() or not target.any():
        return float("nan")
    return float(np.linalg.norm(center_of_mass_mm(pred, spacing) - center_of_mass_mm(target, spacing)))


def case_metrics(pred: np.ndarray, target: np.ndarray, spacing: tuple[float, float]) -> dict[str, float]:
    """``{"dice", "hd95_mm", "com_mm"}`` of one case."""
    return {
        "dice": dice(pred, target),
        "hd95_mm": hd95(pred, target, spacing),
        "com_mm": com_distance(pred, target, spacing),
    }
