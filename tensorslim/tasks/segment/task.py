"""Binary segmentation with global binary masks (arXiv 2205.09107): a U-Net on the image, the mask, or both.

The paper gives a U-Net either a global binary mask alone (scenario 1: it must find the structure from shape and
position) or the mask as a second channel beside the image (scenario 2: a shape/position clue when training cases
are few). This task trains either on our offline data (:mod:`tensorslim.data.segment.sets`): ``train_cases`` cases drawn
by the run's seed from the training pool, augmented by small random affine moves of input and target together and
(by default) nnU-Net-style intensity changes of the image channel (:class:`IntensityAugment`); loss = soft Dice +
binary cross-entropy (the paper's loss is not stated). The validation set is clean; the test set
(:meth:`Segmentation.held_out`) carries the intensity shift, so the image channel feels it and the mask does not.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option
from tensorslim.tasks.base import Autocast, Task, TaskData, register_task


@dataclass(frozen=True, kw_only=True)
class SegmentOptions:
    """What :class:`Segmentation` trains on."""

    dataset: str = option("heart", "segmentation data: brain (warped MNI152, ventricles) or heart (thorax phantoms)")
    inputs: str = option("mask", "U-Net input: mask, image, image+mask, prior or image+prior")
    train_cases: int = option(8, "training cases drawn from the pool (brain 26, heart 12, or --train-pool)")
    train_pool: int = option(0, "training pool size; 0: the paper's (brain 26, heart 12); the data are synthetic")
    image_size: int = option(96, "image side in pixels (a multiple of the U-Net's 2 ** (levels - 1))")
    augment: bool = option(True, "random small affine moves of input and target together")
    intensity: str = option("nnunet", "image-channel intensity augmentation: none, nnunet or strong")
    mask_dropout: float = option(0.0, "probability of blanking the mask channel of an image+mask training sample")

    def __post_init__(self) -> None:
        check_fields(self)
        from tensorslim.data.segment.sets import check_dataset, check_inputs

        require_int("train_pool", self.train_pool, minimum=0)
        pool = self.train_pool or check_dataset(self.dataset).sizes["train"]
        check_inputs(self.inputs)
        if self.intensity not in INTENSITY_AUGMENTS:
            raise ValueError(f"intensity={self.intensity!r} is unknown; allowed: {list(INTENSITY_AUGMENTS)}")
        require_int("image_size", self.image_size, minimum=8)
        if isinstance(self.mask_dropout, bool) or not 0.0 <= self.mask_dropout < 1.0:
            raise ValueError(f"mask_dropout={self.mask_dropout!r} is invalid; allowed: a number in [0, 1)")
        if (
            isinstance(self.train_cases, bool)
            or not isinstance(self.train_cases, int)
            or not 1 <= self.train_cases <= pool
        ):
            raise ValueError(
                f"train_cases={self.train_cases!r} is invalid; allowed: 1..{pool} for dataset {self.dataset!r}"
            )


@dataclass(frozen=True, kw_only=True)
class IntensityAugment:
    """Random intensity changes of the image channel during training, in the manner of nnU-Net's default
    augmentation (Isensee et al., arXiv 1809.10486): each sample independently gets, each with probability ``p``, a
    gamma (drawn below or above 1 with equal odds), a multiplicative brightness, a smooth multiplicative bias field
    (as in TorchIO's ``RandomBiasField``; not in nnU-Net) and additive Gaussian noise. The gamma and brightness
    ranges are nnU-Net's defaults; one probability for all four is our simplification (nnU-Net uses 0.1-0.3).

    arXiv 2205.09107 trains with nnU-Net (§2); without such augmentation a network trained on a few clean cases keys
    on absolute intensities and breaks under a test-time intensity shift.

    Attributes:
        p: probability of each of the four transforms, per sample.
        gamma: the gamma range (low < 1 < high) on images clipped to 0..1.
        brightness: the range of the multiplicative brightness factor.
        bias: amplitude of the bias field ``1 ± bias`` (a 4 × 4 random grid, bilinearly upsampled).
        noise: largest standard deviation of the Gaussian noise (drawn uniformly in ``[0, noise]``).
    """

    p: float = 0.3
    gamma: tuple[float, float] = (0.7, 1.5)
    brightness: tuple[float, float] = (0.75, 1.25)
    bias: float = 0.2
    noise: float = 0.05

    def apply(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augmented copies of ``images`` ``(B, H, W)`` (0..1 scale)."""
        n = len(images)

        def chosen() -> torch.Tensor:  # (B, 1, 1): which samples get a transform
            return (torch.rand(n, 1, 1, generator=generator) < self.p).float()

        def uniform(low: float, high: float) -> torch.Tensor:  # (B, 1, 1)
            return low + (high - low) * torch.rand(n, 1, 1, generator=generator)

        below = torch.rand(n, 1, 1, generator=generator) < 0.5
        gamma = torch.where(below, uniform(self.gamma[0], 1.0), uniform(1.0, self.gamma[1]))
        out = images.clamp(0, 1) ** (1 + chosen() * (gamma - 1))
        out = out * (1 + chosen() * (uniform(*self.brightness) - 1))
        coarse = torch.rand(n, 1, 4, 4, generator=generator) * 2 - 1
        field = F.interpolate(coarse, size=images.shape[-2:], mode="bilinear", align_corners=True)[:, 0]
        out = out * (1 + chosen() * self.bias * field)
        sigma = chosen() * uniform(0.0, self.noise)
        return out + sigma * torch.randn(images.shape, generator=generator)


INTENSITY_AUGMENTS: dict[str, IntensityAugment | None] = {
    "none": None,
    "nnunet": IntensityAugment(),
    "strong": IntensityAugment(p=0.8, gamma=(0.5, 2.0), bias=0.3),
}


@dataclass(frozen=True)
class SegmentSplit:
    """Network inputs ``(N, C, H, W)``, targets ``(N, H, W)`` bool, images ``(N, H, W)`` and pixel mm."""

    inputs: torch.Tensor
    targets: torch.Tensor
    images: np.ndarray
    spacing: tuple[float, float]


def segment_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Soft Dice (per image, then averaged) + binary cross-entropy; ``logits``/``targets`` ``(B, 1, H, W)``."""
    probs = torch.sigmoid(logits).flatten(1)
    flat = targets.flatten(1)
    soft_dice = (2 * (probs * flat).sum(1) + 1) / (probs.sum(1) + flat.sum(1) + 1)
    return (1 - soft_dice).mean() + F.binary_cross_entropy_with_logits(logits, targets)


class AugmentedStream:
    """Resumable batches ``(inputs (B, C, H, W), targets (B, 1, H, W))`` drawn with replacement from a few cases.

    Batch ``k`` depends only on ``(seed, k)``. With ``augment``, each sample moves by a random affine (rotation
    ±8°, scale 0.92-1.08, shift ±4 % of the side) applied to input and target alike; binary channels (masks) and
    the target are re-thresholded after the bilinear resampling. With ``mask_dropout`` > 0, each sample's
    ``mask_channel`` is blanked (set to 0) with that probability, so a two-channel network cannot rest on the
    silhouette alone (modality dropout, as in ModDrop, Neverova et al., arXiv 1501.00102; our choice, not the
    paper's).
    """

    def __init__(
        self,
        split: SegmentSplit,
        *,
        batch_size: int,
        seed: int,
        augment: bool,
        binary: tuple[int, ...],
        intensity: IntensityAugment | None = None,
        image_channel: int | None = None,
        mask_dropout: float = 0.0,
        mask_channel: int | None = None,
    ):
        self.inputs = split.inputs
        self.targets = split.targets.float().unsqueeze(1)
        self.batch_size, self.seed, self.augment, self.binary = batch_size, seed, augment, binary
        self.intensity, self.image_channel = intensity, image_channel
        self.mask_dropout, self.mask_channel = mask_dropout, mask_channel
        self.step = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        self.step += 1
        index = torch.randint(len(self.inputs), (self.batch_size,), generator=generator)
        inputs, targets = self.inputs[index], self.targets[index]  # indexing by a tensor copies: safe to edit
        if self.intensity is not None and self.image_channel is not None:
            inputs[:, self.image_channel] = self.intensity.apply(inputs[:, self.image_channel], generator)
        if self.mask_dropout > 0 and self.mask_channel is not None:  # no draw otherwise: batches stay as they were
            blank = torch.rand(self.batch_size, generator=generator) < self.mask_dropout
            inputs[blank, self.mask_channel] = 0.0
        if not self.augment:
            return inputs, targets
        theta = random_affine(self.batch_size, generator)
        grid = F.affine_grid(theta, list(inputs.shape), align_corners=False)
        inputs = F.grid_sample(inputs, grid, align_corners=False)
        targets = (F.grid_sample(targets, grid, align_corners=False) > 0.5).float()
        for channel in self.binary:
            inputs[:, channel] = (inputs[:, channel] > 0.5).float()
        return inputs, targets

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def random_affine(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random 2 × 3 affine matrices in ``affine_grid``'s normalized coordinates."""
    uniform = torch.rand(n, 4, generator=generator) * 2 - 1
    angle, scale = uniform[:, 0] * math.radians(8), 1 + 0.08 * uniform[:, 1]
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    shift = 0.08 * uniform[:, 2:]  # ±4 % of the side: normalized coordinates span 2
    return torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)


@torch.no_grad()
def predict(model: nn.Module, inputs: torch.Tensor, *, batch_size: int = 16) -> torch.Tensor:
    """Foreground where the logit is > 0: bool ``(N, H, W)`` for inputs ``(N, C, H, W)``."""
    device = next(model.parameters()).device
    out = [model(inputs[i : i + batch_size].to(device))[:, 0] > 0 for i in range(0, len(inputs), batch_size)]
    return torch.cat(out).cpu()


def load_run(run_dir: str | Path, *, device: str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The U-Net of a ``segment`` run's latest checkpoint (in eval mode) and the run's task options.

    Raises:
        ValueError: ``run_dir`` holds no checkpoint, or its run did not train the ``segment`` task.
    """
    from tensorslim.checkpoint import latest_checkpoint
    from tensorslim.data.segment.sets import input_channels
    from tensorslim.models.registry import build_model
    from tensorslim.pretrained import load_weights_

    checkpoint = latest_checkpoint(Path(run_dir) / "checkpoints")
    if checkpoint is None:
        raise ValueError(f"run={str(run_dir)!r} holds no checkpoint (expected {Path(run_dir) / 'checkpoints'})")
    state = json.loads((checkpoint / "state.json").read_text())
    config = state["config"]
    if config["task"] != "segment":
        raise ValueError(f"run {str(run_dir)!r} trained task={config['task']!r}; allowed: a 'segment' run")
    options = dict(config["task_options"])
    model = build_model(
        config["preset"],
        task="segment",
        in_channels=input_channels(options["inputs"]),
        image_size=options["image_size"],
    )
    load_weights_(model, checkpoint / "model.safetensors", state.get("aliases", {}), device=device)
    return model.eval(), options


@register_task
class Segmentation(Task):
    """Binary segmentation from image / global binary mask (built-in data: brain, heart; arXiv 2205.09107)."""

    name = "segment"
    options = SegmentOptions

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data.segment.sets import input_channels, load_split, train_prior

        settings = self.settings
        pool = load_split(settings.dataset, "train", size=settings.image_size, count=settings.train_pool or None)
        chosen = np.random.default_rng(config.seed).permutation(len(pool))[: settings.train_cases]
        train = pool.subset(np.sort(chosen))
        self.prior = train_prior(train)
        self.train_split = self._split(train)
        binary = () if settings.inputs == "image" else (input_channels(settings.inputs) - 1,)  # mask channel
        return TaskData(
            train=AugmentedStream(
                self.train_split,
                batch_size=config.batch_size,
                seed=config.seed,
                augment=settings.augment,
                binary=binary,
                intensity=INTENSITY_AUGMENTS[settings.intensity],
                image_channel=0 if settings.inputs.startswith("image") else None,
                mask_dropout=settings.mask_dropout,
                mask_channel=1 if input_channels(settings.inputs) == 2 else None,
            ),
            validation=self.held_out("val"),
            model_overrides={"in_channels": input_channels(settings.inputs), "image_size": settings.image_size},
            tokens_per_batch=config.batch_size * settings.image_size**2,  # "tokens" are pixels
        )

    def held_out(self, split: str) -> SegmentSplit:
        """The ``val`` (clean) or ``test`` (intensity-shifted) cases, with inputs built like the training ones."""
        from tensorslim.data.segment.sets import IntensityShift, load_split

        shift = IntensityShift() if split == "test" else None
        return self._split(load_split(self.settings.dataset, split, size=self.settings.image_size, shift=shift))

    def _split(self, cases: Any) -> SegmentSplit:
        from tensorslim.data.segment.sets import network_inputs

        inputs = network_inputs(cases, self.settings.inputs, prior=self.prior)
        return SegmentSplit(torch.from_numpy(inputs), torch.from_numpy(cases.targets), cases.images, cases.spacing)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return segment_loss(model(inputs).float(), targets)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        from tensorslim.tasks.segment.metrics import com_distance, dice

        split: SegmentSplit = data.validation
        device = next(model.parameters()).device
        losses, dices, coms = [], [], []
        for start in range(0, len(split.inputs), batch_size):
            inputs = split.inputs[start : start + batch_size].to(device)
            targets = split.targets[start : start + batch_size].float().unsqueeze(1).to(device)
            with autocast():
                logits = model(inputs).float()
            losses.append(segment_loss(logits, targets).item() * len(inputs))
            pairs = list(zip((logits[:, 0] > 0).cpu().numpy(), targets[:, 0].bool().cpu().numpy(), strict=True))
            dices += [dice(p, t) for p, t in pairs]
            coms += [com_distance(p, t, split.spacing) for p, t in pairs]
        # The centre-of-mass error skips empty predictions (nan), as the test tables do; all empty gives nan.
        com = float(np.nanmean(coms)) if not np.isnan(coms).all() else float("nan")
        return {"val_loss": sum(losses) / len(split.inputs), "val_dice": float(np.mean(dices)), "val_com_mm": com}
