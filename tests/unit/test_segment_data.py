"""Segmentation data (arXiv 2205.09107 stand-ins): warps keep maps aligned, masks ignore intensities, CT check."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from tensorslim.data.segment.brain import brain_case
from tensorslim.data.segment.masks import HU_THRESHOLD, ct_small_path, global_mask, prior_mask, read_ct
from tensorslim.data.segment.phantoms import (
    HEART_OFFSET,
    Body,
    body_from_silhouette,
    draw_body,
    heart_case,
    nominal_heart,
)
from tensorslim.data.segment.sets import (
    Cases,
    IntensityShift,
    global_masks,
    input_channels,
    load_split,
    network_inputs,
)
from tensorslim.data.segment.warps import WarpRange, random_grid, resample
from tensorslim.tasks.segment.metrics import dice


def test_warp_moves_image_and_map_alike() -> None:
    # A smooth blob and its thresholded map, warped on one grid: thresholding the warped image gives the warped map.
    rows, cols = np.meshgrid(np.arange(80.0), np.arange(80.0), indexing="ij")
    image = np.exp(-((rows - 30) ** 2 / 200 + (cols - 45) ** 2 / 90))
    region = image > 0.5
    grid = random_grid(
        np.random.default_rng(3),
        out_shape=(64, 64),
        source_center=(40, 40),
        source_step=1.25,
        warp=WarpRange(rotate_deg=20, elastic_px=2.0),
    )
    warped_image, warped_map = resample(image, grid), resample(region.astype(float), grid) > 0.5
    assert dice(warped_image > 0.5, warped_map) > 0.95
    # The warp did move things: the map is not where an unwarped resampling puts it.
    identity = np.stack(np.meshgrid(np.arange(64.0), np.arange(64.0), indexing="ij")) * 1.25 + 40 - 31.5 * 1.25
    assert dice(resample(region.astype(float), identity) > 0.5, warped_map) < 0.9


def test_affine_warp_matches_its_formula() -> None:
    # No elastic field: output pixel (i, j) reads the source at centre + step * R/s (i - c, j - c) + step * shift.
    warp = WarpRange(rotate_deg=15, scale=(1.1, 1.1), shift_px=3, elastic_px=0)
    rng = np.random.default_rng(0)
    grid = random_grid(np.random.default_rng(0), out_shape=(9, 9), source_center=(20, 30), source_step=2, warp=warp)
    angle, scale, shift = np.deg2rad(rng.uniform(-15, 15)), rng.uniform(1.1, 1.1), rng.uniform(-3, 3, 2)
    rotate = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]) / scale
    expected = np.array([20.0, 30.0]) + 2 * (rotate @ np.array([8 - 4, 1 - 4]) + shift)
    np.testing.assert_allclose(grid[:, 8, 1], expected, atol=1e-9)


def test_brain_ventricles_sit_on_dark_csf_of_the_warped_t1() -> None:
    # Alignment of the warped maps with the warped T1: the ventricles (CSF) are dark in T1, inside the silhouette.
    for seed in range(3):
        image, target, spacing = brain_case(np.random.default_rng(seed), size=64, warp=WarpRange())
        silhouette = global_mask(image)
        assert target.sum() > 20 and (target & ~silhouette).sum() == 0
        assert image[target].mean() < 0.6 * image[silhouette & ~target].mean()
        assert spacing == pytest.approx(200 / 64)


def test_heart_phantom_is_inside_the_body_and_its_contrast_varies_per_case() -> None:
    contrasts = []
    for seed in range(12):
        image, heart, spacing = heart_case(np.random.default_rng(seed), size=96)
        body = global_mask(image)
        assert heart.sum() > 200 and (heart & ~body).sum() == 0
        tissue = np.median(image[body & ~heart & (image > 0.3) & (image < 0.8)])
        assert image[heart].mean() > tissue  # the myocardial wall and the blood pool are never darker than tissue
        contrasts.append(np.percentile(image[heart], 90) - tissue)
    assert spacing == 4.0
    # Contrast-agent timing: some hearts barely stand out (non-contrast), others are clearly brighter (arterial).
    assert min(contrasts) < 0.06 and max(contrasts) > 0.12


def test_silhouette_ellipse_recovers_the_drawn_body() -> None:
    # heart_case's first draws are draw_body's: the silhouette's moment-matched ellipse must give those back
    # wherever the body lies inside the field of view (about one phantom in five is cut by it).
    checked = 0
    for seed in range(8):
        image, _, _ = heart_case(np.random.default_rng(seed), size=96)
        silhouette = global_mask(image)
        if silhouette[[0, -1]].any() or silhouette[:, [0, -1]].any():
            continue
        checked += 1
        drawn, fitted = draw_body(np.random.default_rng(seed), size=96), body_from_silhouette(silhouette)
        np.testing.assert_allclose(fitted.center, drawn.center, atol=0.3)
        np.testing.assert_allclose(fitted.axes, drawn.axes, rtol=0.03)
        if abs(drawn.axes[0] - drawn.axes[1]) > 4:  # a near-circle's orientation is not defined by its outline
            assert abs(fitted.angle - drawn.angle) < np.deg2rad(2)
    assert checked >= 5


def test_nominal_heart_follows_the_body_and_the_drawn_heart_jitters_around_it() -> None:
    # The jitter-free heart sits at the body centre + the rotated, axis-scaled offset (ellipse centroid formula).
    body = Body(np.array([50.0, 44.0]), np.array([30.0, 38.0]), np.deg2rad(10))
    expected = body.center + body.rotation() @ (np.asarray(HEART_OFFSET) * body.axes)
    np.testing.assert_allclose(ndimage.center_of_mass(nominal_heart(body, (96, 96))), expected, atol=0.15)
    # Each phantom's heart lies within a few jitter steps (0.4 px std per axis) of its body's nominal heart.
    for seed in range(8):
        _, heart, _ = heart_case(np.random.default_rng(seed), size=96)
        nominal = nominal_heart(draw_body(np.random.default_rng(seed), size=96), heart.shape)
        offset = np.subtract(ndimage.center_of_mass(heart), ndimage.center_of_mass(nominal))
        assert np.linalg.norm(offset) < 2.0 and dice(heart, nominal) > 0.85


@pytest.mark.parametrize("dataset", ["heart", "brain"])
def test_global_mask_ignores_the_intensity_shift(dataset: str) -> None:
    clean = load_split(dataset, "test", size=64)
    shifted = load_split(dataset, "test", size=64, shift=IntensityShift())
    assert np.abs(shifted.images - clean.images).mean() > 0.03  # the image channel does feel the shift
    before, after = global_masks(clean.images[:8]), global_masks(shifted.images[:8])
    # Noise can flip an odd boundary pixel, and partial-volume edges of the resampled template a few more.
    assert min(dice(a, b) for a, b in zip(before, after, strict=True)) > (0.995 if dataset == "heart" else 0.98)
    if dataset == "heart":  # sharp edges and no noise: exactly the same mask under gamma and bias field
        no_noise = load_split(dataset, "test", size=64, shift=IntensityShift(noise=0.0))
        assert np.array_equal(global_masks(no_noise.images[:8]), before)


def test_global_mask_on_the_real_ct_slice() -> None:
    hu, spacing = read_ct(ct_small_path())
    mask = global_mask(hu, threshold=HU_THRESHOLD)
    assert spacing == pytest.approx((0.661468, 0.661468))
    assert ndimage.label(mask)[1] == 1 and np.array_equal(ndimage.binary_fill_holes(mask), mask)
    assert mask[hu > 0].mean() > 0.99  # soft tissue and bone are in the silhouette
    assert not mask[hu < -700].any()  # the air is not
    assert 0.6 < mask.mean() < 0.95
    # A different window/level (HU → 0..1 display values) with the threshold mapped alike: the same silhouette.
    display = np.clip((hu + 1000) / 2000, 0, 1)
    assert np.array_equal(global_mask(display, threshold=(HU_THRESHOLD + 1000) / 2000), mask)


def test_prior_mask_is_the_majority_and_constant() -> None:
    targets = np.zeros((3, 8, 8), dtype=bool)
    targets[0, 2:5, 2:5] = targets[1, 3:6, 3:6] = targets[2, 7, 7] = True
    expected = np.zeros((8, 8), dtype=bool)
    expected[3:5, 3:5] = True  # the pixels in two of three cases
    assert np.array_equal(prior_mask(targets), expected)
    assert np.array_equal(prior_mask(targets[2:]), targets[2])


def test_a_larger_pool_keeps_the_paper_cases_and_adds_new_ones() -> None:
    paper = load_split("heart", "train", size=32)
    larger = load_split("heart", "train", size=32, count=len(paper) + 3)
    assert len(paper) == 12 and len(larger) == 15
    np.testing.assert_array_equal(larger.images[:12], paper.images)
    np.testing.assert_array_equal(larger.targets[:12], paper.targets)
    new = larger.images[12:]
    assert all(not np.array_equal(image, old) for image in new for old in paper.images)


def test_network_inputs_channels() -> None:
    cases = load_split("heart", "val", size=32)
    prior = prior_mask(cases.targets)
    for mode in ("mask", "image", "image+mask", "prior", "image+prior"):
        inputs = network_inputs(cases, mode, prior=prior)
        assert inputs.shape == (len(cases), input_channels(mode), 32, 32)
    both = network_inputs(cases, "image+mask", prior=prior)
    np.testing.assert_array_equal(both[:, 0], cases.images)
    np.testing.assert_array_equal(both[:, 1], global_masks(cases.images))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: network_inputs(c, "mask", prior=np.zeros((5, 5), dtype=bool)), "prior mask has shape (5, 5)"),
        (lambda c: network_inputs(c, "edges", prior=np.zeros((32, 32), dtype=bool)), "inputs='edges' is unknown"),
        (lambda c: load_split("lung", "train", size=32), "dataset='lung' is unknown"),
        (lambda c: load_split("heart", "train", size=32, count=0), "count=0 is invalid"),
        (lambda c: global_mask(c.images), "allowed: a 2-D (H, W) array"),
        (lambda c: dice(c.targets[0], c.targets[0][:16]), "allowed: two equal (H, W) shapes"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call: object, message: str) -> None:
    cases: Cases = load_split("heart", "val", size=32)
    with pytest.raises(ValueError, match=None) as error:
        call(cases)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_brain_ct_rendering_keeps_the_warp_and_target(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CT ablation draws its noise after the warp: same seed, same target as the T1 case. CSF reads about
    # (8 + 20) / 100 on the (-20, 80) HU window, brain tissue 0.45-0.6, air 0; the noise is NOISE_HU / 100 per pixel.
    from tensorslim.data.segment import brain

    t1_image, t1_target, _ = brain_case(np.random.default_rng(5), size=64, warp=WarpRange())
    monkeypatch.setattr(brain, "RENDERING", "ct")
    image, target, _ = brain_case(np.random.default_rng(5), size=64, warp=WarpRange())
    again, _, _ = brain_case(np.random.default_rng(5), size=64, warp=WarpRange())
    np.testing.assert_array_equal(target, t1_target)
    np.testing.assert_array_equal(image, again)
    assert not np.allclose(image, t1_image)
    core = ndimage.binary_erosion(target)
    assert abs(np.median(image[core]) - 0.28) < 0.05
    tissue = ndimage.binary_erosion(global_mask(image), iterations=3) & ~ndimage.binary_dilation(target, iterations=3)
    assert 0.4 < np.median(image[tissue]) < 0.65
    assert image[0, 0] == 0.0 and dice(global_mask(image), global_mask(t1_image)) > 0.97
    monkeypatch.setattr(brain, "RENDERING", "pet")
    with pytest.raises(ValueError, match=r"rendering='pet' is unknown; allowed: \['t1', 'ct'\]"):
        brain_case(np.random.default_rng(5), size=64, warp=WarpRange())


def test_heart_wall_contrast_changes_only_the_wall(monkeypatch: pytest.MonkeyPatch) -> None:
    # A wall-contrast variant (experiments/segment_diagnose.py --wall) keeps every draw: same heart, same silhouette,
    # and the image changes only inside the heart, by at most the two ranges' spread.
    from tensorslim.data.segment import phantoms

    image, heart, _ = heart_case(np.random.default_rng(4), size=96)
    monkeypatch.setattr(phantoms, "MYOCARDIUM_CONTRAST", (-0.005, 0.005))
    faint, faint_heart, _ = heart_case(np.random.default_rng(4), size=96)
    np.testing.assert_array_equal(faint_heart, heart)
    np.testing.assert_array_equal(global_mask(faint), global_mask(image))
    changed = ~np.isclose(faint, image)
    assert changed.any() and not (changed & ~heart).any()
    assert np.abs(faint - image).max() <= 0.045 + 1e-6
