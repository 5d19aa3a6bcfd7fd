"""Bad arguments to the public Python entry points (README): one-line ``ValueError``/``TypeError`` naming the bad
value and what is allowed, raised before anything is built, trained or written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from torch import nn

import tensorslim
from tensorslim import TrainConfig
from tensorslim.train.trainer import train


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda _: tensorslim.convert_(None, tensorslim.SVDConfig(rank=4)), TypeError, "model of type NoneType"),
        (lambda _: tensorslim.plan("gpt2", tensorslim.SVDConfig(rank=4)), TypeError, "model of type str is invalid"),
        (
            lambda _: tensorslim.convert_(_model(), tensorslim.SVDConfig(rank=4), filter_fn="0"),
            TypeError,
            "filter_fn of type str is invalid; allowed: (module, name) -> bool",
        ),
        (lambda _: TrainConfig(lr="1e-3"), ValueError, "lr='1e-3' is invalid; allowed: a finite number or None"),
        (lambda _: TrainConfig(min_lr_ratio="0"), ValueError, "min_lr_ratio='0' is invalid; allowed: a finite number"),
        (lambda _: TrainConfig(seed=-1), ValueError, "seed=-1 is invalid; allowed: an integer >= 0"),
        (lambda _: TrainConfig(seed=1.5), ValueError, "seed=1.5 is invalid; allowed: an integer"),
        (lambda _: train({"preset": "tiny"}), TypeError, "config of type dict is invalid; allowed: a TrainConfig"),
        (lambda tmp: tensorslim.save_pretrained(None, tmp / "out"), TypeError, "model of type NoneType"),
        (lambda tmp: tensorslim.load_pretrained(tmp, model="x"), TypeError, "model of type str is invalid"),
        (
            lambda tmp: tensorslim.load_pretrained(tmp, device="tpu"),
            ValueError,
            "device='tpu' is invalid; allowed: a torch device such as 'cpu' or 'cuda'",
        ),
    ],
)
def test_bad_arguments_are_one_line_errors(
    call: Callable[[Path], object], error: type[Exception], message: str, tmp_path: Path
) -> None:
    with pytest.raises(error) as raised:
        call(tmp_path)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_vocabulary_for_a_model_that_reads_no_tokens_is_a_value_error() -> None:
    from tensorslim.models import build_model

    with pytest.raises(ValueError, match="vocab_size=512 is invalid for model='unet-small', which has none"):
        build_model("unet-small", vocab_size=512)
