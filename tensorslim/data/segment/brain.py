"""Synthetic brain "patients" from the MNI152 template that ships inside nilearn (no download).

arXiv 2205.09107 segments brain structures in CT (§3, data: 46 patients); those scans are not public. We stand in
for them with axial slices of nilearn's bundled ICBM152 2009a template (T1 plus grey- and white-matter probability
maps, 1 mm, skull-stripped): each case takes a slice near the lateral ventricles (jittered by ±1 mm in z) and warps
T1 and maps alike with a random affine plus a smooth elastic field (:mod:`tensorslim.data.segment.warps`). The target
structure is the lateral ventricles, defined from the maps on the template (CSF = brain, GM < 0.2 and WM < 0.2; the
components near the centre), then carried by the same warp. This is our construction, not the paper's data. An
ablation (:data:`RENDERING` ``"ct"``) renders the warped maps in head-CT numbers with scanner noise instead of the T1.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import ndimage

from tensorslim.data.segment.warps import WarpRange, random_grid, resample

# Axial template slices (1 mm, z index of the 197 × 233 × 189 volume) crossing the bodies of the lateral ventricles.
VENTRICLE_SLICES = range(94, 97)
FOV_MM = 200.0  # the square field of view every case is resampled to, so pixel size = FOV_MM / size
BRAIN_THRESHOLD = 0.1  # T1 intensity (0..1) above which a template voxel is brain
CSF_MAX_TISSUE = 0.2  # a voxel is CSF where both GM and WM probabilities stay below this
VENTRICLE_RADIUS_MM = 30.0  # CSF components whose centre lies this close to the brain's centre are ventricles
VENTRICLE_MIN_MM2 = 30  # smaller CSF specks are not ventricles
# The CT rendering of the tissue maps (an ablation; the paper's images are CT): typical non-contrast head-CT numbers
# (HU) of CSF, grey and white matter, a brain window mapped to 0..1 (air, far below it, reads 0), the scanner's noise.
TISSUE_HU = {"csf": 8.0, "gm": 40.0, "wm": 25.0}
WINDOW_HU = (-20.0, 80.0)
NOISE_HU = 4.0
RENDERINGS = ("t1", "ct")
RENDERING = "t1"  # the images every split draws: the template's T1 (the default) or the maps in CT numbers


MNI_FILES = {  # nilearn's bundled ICBM152 2009a files (what load_mni152_{template,gm_template,wm_template} read)
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}


def mni_file(kind: str) -> Path:
    """The path of a bundled MNI152 file, found without importing ``nilearn.datasets`` (which takes seconds)."""
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the brain data set needs nilearn (pip install nilearn); it ships the MNI152 template")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / MNI_FILES[kind]


def mni_slices(kind: str, zs: range) -> np.ndarray:
    """Axial slices ``(197, 233, len(zs))`` of a bundled MNI152 volume (uint8), scaled to 0..1 by 255.

    Only the slab is read (the gzip stream is decompressed up to it). nilearn's ``load_mni152_*`` loaders divide by
    the whole volume's maximum, which is 255 in all three files, so the values are theirs.
    """
    import nibabel

    return np.asarray(nibabel.load(mni_file(kind)).dataobj[:, :, zs.start : zs.stop], dtype=np.float32) / 255.0


@lru_cache(maxsize=1)
def template_slices() -> dict[int, tuple[np.ndarray, ...]]:
    """``{z: (t1, ventricles, brain, gm, wm)}`` for the slices in :data:`VENTRICLE_SLICES` (197 × 233 each, 1 mm),
    read once per process."""
    t1s, gms, wms = (mni_slices(kind, VENTRICLE_SLICES) for kind in ("t1", "gm", "wm"))
    slices = {}
    for i, z in enumerate(VENTRICLE_SLICES):
        t1, gm, wm = (np.ascontiguousarray(volume[:, :, i]) for volume in (t1s, gms, wms))
        brain = ndimage.binary_fill_holes(t1 > BRAIN_THRESHOLD)
        slices[z] = (t1, ventricle_map(brain, gm, wm), brain, gm, wm)
    return slices


def ventricle_map(brain: np.ndarray, gm: np.ndarray, wm: np.ndarray) -> np.ndarray:
    """The lateral ventricles of one 1 mm slice: CSF components large enough and near the brain's centre."""
    csf = brain & (gm < CSF_MAX_TISSUE) & (wm < CSF_MAX_TISSUE)
    labels, n = ndimage.label(csf)
    if n == 0:
        return csf
    index = np.arange(1, n + 1)
    sizes = ndimage.sum(csf, labels, index)
    centers = np.array(ndimage.center_of_mass(csf, labels, index))
    middle = np.array(ndimage.center_of_mass(brain))
    near = np.hypot(*(centers - middle).T) < VENTRICLE_RADIUS_MM
    return np.isin(labels, index[near & (sizes >= VENTRICLE_MIN_MM2)])


def brain_case(rng: np.random.Generator, *, size: int, warp: WarpRange) -> tuple[np.ndarray, np.ndarray, float]:
    """One synthetic patient: ``(image (size, size) float32 in [0, 1], ventricles (size, size) bool, pixel mm)``.

    The image is the warped T1, or with :data:`RENDERING` ``"ct"`` the warped tissue maps in CT numbers
    (:func:`ct_image`); the warp and the target are the same either way.
    """
    if RENDERING not in RENDERINGS:
        raise ValueError(f"brain rendering={RENDERING!r} is unknown; allowed: {list(RENDERINGS)}")
    slices = template_slices()
    t1, ventricles, brain, gm, wm = slices[int(rng.choice(list(slices)))]
    step = FOV_MM / size
    center = ndimage.center_of_mass(brain)
    grid = random_grid(rng, out_shape=(size, size), source_center=center, source_step=step, warp=warp)
    target = resample(ventricles.astype(np.float32), grid) > 0.5
    if RENDERING == "ct":  # the noise is drawn after the warp, so the anatomy and target stay those of the T1 cases
        image = ct_image(*(resample(m, grid) for m in (brain.astype(np.float32), gm, wm)), rng)
    else:
        image = np.clip(resample(t1, grid), 0.0, 1.0).astype(np.float32)
    return image, target, step


def ct_image(brain: np.ndarray, gm: np.ndarray, wm: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A head-CT-like slice on a brain window, 0..1: each pixel's tissue fractions (``brain`` the brain fraction,
    ``gm``/``wm`` the probability maps, CSF the rest) times :data:`TISSUE_HU`, air (-1000 HU) outside, plus
    scanner noise of :data:`NOISE_HU` inside the head (air stays far below the window, so it reads 0)."""
    gm, wm = np.clip(gm, 0, 1), np.clip(wm, 0, 1)
    csf = np.clip(1 - gm - wm, 0, 1)
    tissue = csf * TISSUE_HU["csf"] + gm * TISSUE_HU["gm"] + wm * TISSUE_HU["wm"]
    hu = brain * tissue + (1 - brain) * -1000.0 + (brain > 0.5) * rng.normal(0, NOISE_HU, brain.shape)
    low, high = WINDOW_HU
    return np.clip((hu - low) / (high - low), 0.0, 1.0).astype(np.float32)
