"""Global binary masks (arXiv 2205.09107): whole-image, intensity-free silhouettes given to a U-Net.

The paper's abstract says a global binary mask is the U-Net's only input (scenario 1) or a second channel beside the
image (scenario 2); how the paper builds it is not in the parts we could read. We implement the reading in which each
patient's mask varies with the patient (the paper's mask-only Dice varies per patient, which a population mask
could not do): the whole-image silhouette, i.e. the image thresholded above the air/background level, its largest
connected component, holes filled (:func:`global_mask`). The other reading, a population prior (the training
targets averaged and binarized, :func:`prior_mask`), is kept as an ablation; it is the same for every patient.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

IMAGE_THRESHOLD = 0.12  # on our 0..1 images: air is 0 (+ test noise of std 0.03: 4 std), body tissue >= 0.23
HU_THRESHOLD = -500.0  # CT: halfway between air (-1000 HU) and water (0 HU)


def global_mask(image: np.ndarray, *, threshold: float = IMAGE_THRESHOLD) -> np.ndarray:
    """The silhouette of ``image`` ``(H, W)``: bool ``(H, W)``.

    Steps: ``> threshold``, holes filled (dark lungs and ventricles are inside the body), a 3 × 3 opening (noise
    specks in the air, even those touching the body, go), the largest connected component, holes filled again.
    Only the threshold looks at intensities, so an intensity change that keeps every pixel on its side of it gives
    exactly the same mask.
    """
    if image.ndim != 2:
        raise ValueError(f"image has shape {image.shape}; allowed: a 2-D (H, W) array")
    filled = ndimage.binary_fill_holes(image > threshold)
    foreground = ndimage.binary_opening(filled, structure=np.ones((3, 3), dtype=bool))
    labels, n = ndimage.label(foreground)
    if n == 0:
        return foreground
    sizes = ndimage.sum(foreground, labels, np.arange(1, n + 1))
    return ndimage.binary_fill_holes(labels == 1 + int(np.argmax(sizes)))


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of ``mask`` ``(H, W)`` (empty stays empty): nnU-Net's "keep the largest
    component" post-processing (Isensee et al., arXiv 1809.10486, §2.5), which it keeps only where validation
    says it helps. A stray blob far from the structure moves the predicted centre of mass by its area times its
    distance, so removing it mostly helps the centre-of-mass error."""
    if mask.ndim != 2:
        raise ValueError(f"mask has shape {mask.shape}; allowed: a 2-D (H, W) array")
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if n <= 1:
        return mask.astype(bool)
    sizes = ndimage.sum(mask, labels, np.arange(1, n + 1))
    return labels == 1 + int(np.argmax(sizes))


def prior_mask(targets: np.ndarray) -> np.ndarray:
    """The population prior of targets ``(N, H, W)``: pixels that are target in at least half the cases (their
    union where no pixel is), bool ``(H, W)``. It is also the constant predictor's output."""
    if targets.ndim != 3 or len(targets) == 0:
        raise ValueError(f"targets has shape {targets.shape}; allowed: a non-empty (N, H, W) stack")
    mean = targets.astype(np.float64).mean(0)
    majority = mean >= 0.5
    return majority if majority.any() else mean > 0


def read_ct(path: str | Path) -> tuple[np.ndarray, tuple[float, float]]:
    """A CT slice in Hounsfield units and its pixel spacing (row, column) in mm, read with pydicom."""
    import pydicom

    dataset = pydicom.dcmread(str(path))
    hu = dataset.pixel_array.astype(np.float64) * float(dataset.RescaleSlope) + float(dataset.RescaleIntercept)
    spacing = tuple(float(s) for s in dataset.PixelSpacing)
    return hu, (spacing[0], spacing[1])


def ct_small_path() -> Path:
    """pydicom's bundled 128 × 128 CT test slice (``CT_small.dcm``; no download)."""
    from pydicom.data import get_testdata_file

    return Path(get_testdata_file("CT_small.dcm"))
