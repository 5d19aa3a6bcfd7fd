"""The U-Net model family and the segment task: shapes, registry overrides, books, loss, stream, overfitting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorslim.books import flops_per_token
from tensorslim.models.registry import build_model, get_model
from tensorslim.models.unet import UNet, UNetConfig
from tensorslim.tasks.segment import IntensityAugment, SegmentOptions, load_run, predict, segment_loss
from tensorslim.tasks.segment.metrics import com_distance, dice


def test_unet_shapes_and_registry_overrides() -> None:
    model = build_model("unet-small", in_channels=2, image_size=32)
    assert get_model("unet-small").tasks == ("segment",)
    assert model(torch.zeros(3, 2, 32, 48)).shape == (3, 1, 32, 48)
    with pytest.raises(ValueError, match=r"allowed: \(B, 2, H, W\)"):
        model(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match="allowed: multiples of 8"):
        model(torch.zeros(1, 2, 36, 36))
    with pytest.raises(ValueError, match="in_channels=3 is invalid"):
        UNetConfig(in_channels=3)
    with pytest.raises(ValueError, match="are invalid for model='unet-small'"):
        build_model("unet-small", depth=3)
    deep = build_model("unet-deep", in_channels=1, image_size=32)  # five levels: sides must be multiples of 16
    assert deep(torch.zeros(1, 1, 32, 32)).shape == (1, 1, 32, 32) and len(deep.down) == 5
    with pytest.raises(ValueError, match="allowed: a multiple of 16"):
        build_model("unet-deep", image_size=40)


def test_instance_norm_unet_evaluates_as_it_trains() -> None:
    # Instance norm keeps no running statistics: train- and eval-mode outputs agree, unlike batch norm's.
    x = torch.rand(2, 1, 16, 16)
    torch.manual_seed(0)
    instance = UNet(UNetConfig(channels=(4, 8), norm="instance"))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in instance.modules())
    torch.testing.assert_close(instance.train()(x), instance.eval()(x))
    batch = UNet(UNetConfig(channels=(4, 8)))
    assert not torch.allclose(batch.train()(x), batch.eval()(x))
    with pytest.raises(ValueError, match="norm='group' is unknown; allowed: \\['batch', 'instance'\\]"):
        UNetConfig(norm="group")


def test_books_count_a_unet_per_pixel() -> None:
    # FLOPs per pixel are independent of the image side (convolutions cost the same per pixel at every size).
    small, large = (UNet(UNetConfig(channels=(4, 8), image_size=side)) for side in (16, 32))
    per_pixel = flops_per_token(small, seq_len=1)
    assert per_pixel == pytest.approx(flops_per_token(large, seq_len=1))
    # Hand count of the first 3 × 3 convolution alone (1 → 4 channels): 2 * 9 * 1 * 4 FLOPs per pixel.
    assert per_pixel > 2 * 9 * 4


def test_loss_is_small_for_confident_right_logits() -> None:
    target = torch.zeros(2, 1, 8, 8)
    target[:, :, 2:6, 2:6] = 1
    assert segment_loss(20 * (2 * target - 1), target).item() < 1e-3
    assert segment_loss(-20 * (2 * target - 1), target).item() > 1.5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset": "lung"}, "dataset='lung' is unknown"),
        ({"inputs": "edges"}, "inputs='edges' is unknown"),
        ({"train_cases": 0}, "train_cases=0 is invalid; allowed: 1..12"),
        ({"train_cases": 13}, "train_cases=13 is invalid; allowed: 1..12"),
        ({"dataset": "brain", "train_cases": 27}, "allowed: 1..26"),
        ({"intensity": "wild"}, "intensity='wild' is unknown"),
        ({"mask_dropout": 1.0}, "mask_dropout=1.0 is invalid"),
        ({"train_pool": -1}, "train_pool=-1 is invalid"),
        ({"train_pool": 20, "train_cases": 21}, "train_cases=21 is invalid; allowed: 1..20"),
    ],
)
def test_bad_options(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SegmentOptions(**fields)


def test_a_larger_pool_allows_more_training_cases() -> None:
    assert SegmentOptions(train_pool=200, train_cases=200).train_cases == 200


def test_tiny_unet_overfits_one_case_through_the_trainer(tmp_path: object) -> None:
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset="unet-small",
        task="segment",
        method="dense",
        task_options={"dataset": "heart", "inputs": "image+mask", "train_cases": 1, "image_size": 32, "augment": False},
        steps=60,
        batch_size=2,
        lr=1e-2,
        eval_every=60,
        checkpoint_every=60,
        out_dir=str(tmp_path),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config)
    result = trainer.run()
    split = trainer.task.train_split
    predicted = predict(trainer.model.eval(), split.inputs).numpy()
    assert dice(predicted[0], split.targets[0].numpy()) > 0.95
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert set(result.val_metrics) == {"val_loss", "val_dice", "val_com_mm"}
    # The validation centre-of-mass error is the metric's mean over the validation cases' predictions.
    val = trainer.task.held_out("val")
    predicted = predict(trainer.model, val.inputs).numpy()
    coms = [com_distance(p, t, val.spacing) for p, t in zip(predicted, val.targets.numpy(), strict=True)]
    assert result.val_metrics["val_com_mm"] == pytest.approx(np.nanmean(coms))
    # The run's checkpoint loads back into the same network.
    loaded, options = load_run(tmp_path)
    assert options["inputs"] == "image+mask" and options["image_size"] == 32
    torch.testing.assert_close(loaded(split.inputs), trainer.model(split.inputs))
    with pytest.raises(ValueError, match="holds no checkpoint"):
        load_run(tmp_path / "nowhere")


def test_stream_is_deterministic_and_resumes() -> None:
    from tensorslim.tasks.segment import AugmentedStream, SegmentSplit

    inputs = torch.rand(3, 2, 16, 16)
    inputs[:, 1] = (inputs[:, 1] > 0.5).float()
    split = SegmentSplit(inputs, torch.rand(3, 16, 16) > 0.5, np.zeros((3, 16, 16)), (1.0, 1.0))
    first = AugmentedStream(split, batch_size=4, seed=1, augment=True, binary=(1,))
    batches = [first.next_batch() for _ in range(3)]
    again = AugmentedStream(split, batch_size=4, seed=1, augment=True, binary=(1,))
    again.load_state_dict(first.state_dict() | {"step": 2})
    x, y = again.next_batch()
    assert torch.equal(x, batches[2][0]) and torch.equal(y, batches[2][1])
    assert set(x[:, 1].unique().tolist()) <= {0.0, 1.0} and set(y.unique().tolist()) <= {0.0, 1.0}
    assert not torch.equal(batches[0][0], batches[1][0])


def test_intensity_augment_gamma_alone_matches_its_formula() -> None:
    # Only the gamma transform, always on: each sample is x ** g with one g per sample, below or above 1.
    images = torch.rand(64, 8, 8) * 0.9 + 0.05
    augment = IntensityAugment(p=1.0, gamma=(0.7, 1.5), brightness=(1.0, 1.0), bias=0.0, noise=0.0)
    out = augment.apply(images, torch.Generator().manual_seed(0))
    gammas = torch.log(out) / torch.log(images)  # (64, 8, 8), constant within a sample
    assert torch.allclose(gammas, gammas[:, :1, :1].expand_as(gammas), atol=1e-4)
    per_sample = gammas[:, 0, 0]
    assert per_sample.min() >= 0.7 - 1e-4 and per_sample.max() <= 1.5 + 1e-4
    assert (per_sample < 1).any() and (per_sample > 1).any()
    # p = 0: nothing changes; the same generator seed: the same draw.
    off = IntensityAugment(p=0.0).apply(images, torch.Generator().manual_seed(0))
    assert torch.equal(off, images)
    assert torch.equal(augment.apply(images, torch.Generator().manual_seed(0)), out)


def test_intensity_augment_touches_only_the_image_channel() -> None:
    from tensorslim.tasks.segment import AugmentedStream, SegmentSplit

    inputs = torch.rand(2, 2, 16, 16)
    inputs[:, 1] = (inputs[:, 1] > 0.5).float()
    split = SegmentSplit(inputs, torch.rand(2, 16, 16) > 0.5, np.zeros((2, 16, 16)), (1.0, 1.0))
    stream = AugmentedStream(
        split, batch_size=8, seed=0, augment=False, binary=(1,), intensity=IntensityAugment(p=1.0), image_channel=0
    )
    x, _ = stream.next_batch()
    index = torch.randint(2, (8,), generator=torch.Generator().manual_seed(0))  # the stream's draw of batch 0
    assert torch.equal(x[:, 1], inputs[index, 1])  # the mask channel is untouched
    assert (x[:, 0] - inputs[index, 0]).abs().mean() > 0.02  # the image channel changed
    assert torch.equal(inputs[:, 1], (inputs[:, 1] > 0.5).float())  # and the stored cases are not modified


def test_mask_dropout_blanks_whole_mask_channels_only() -> None:
    from tensorslim.tasks.segment import AugmentedStream, SegmentSplit

    inputs = torch.rand(3, 2, 16, 16)
    inputs[:, 1] = 1.0  # a full mask: a blanked sample is all 0, a kept one all 1
    split = SegmentSplit(inputs, torch.rand(3, 16, 16) > 0.5, np.zeros((3, 16, 16)), (1.0, 1.0))
    stream = AugmentedStream(
        split, batch_size=400, seed=0, augment=False, binary=(1,), mask_dropout=0.3, mask_channel=1
    )
    x, _ = stream.next_batch()
    index = torch.randint(3, (400,), generator=torch.Generator().manual_seed(0))  # the stream's draw of batch 0
    per_sample = x[:, 1].flatten(1)
    assert set(per_sample.mean(1).unique().tolist()) == {0.0, 1.0}  # whole channels, never parts
    assert 0.22 < (per_sample.mean(1) == 0).float().mean() < 0.38  # about 30 % (binomial, n = 400: ±2.3 % std)
    assert torch.equal(x[:, 0], inputs[index, 0])  # the image channel is untouched
    # Rate 0 draws nothing more, so its batches equal those of a stream without the option.
    plain = AugmentedStream(split, batch_size=4, seed=3, augment=True, binary=(1,))
    zero = AugmentedStream(split, batch_size=4, seed=3, augment=True, binary=(1,), mask_dropout=0.0, mask_channel=1)
    assert all(torch.equal(a, b) for a, b in zip(plain.next_batch(), zero.next_batch(), strict=True))
