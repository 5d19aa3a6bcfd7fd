"""The Trainer's static-shape step (``static_step=True``: the step a CUDA graph captures, run eagerly) against the
ordinary step, and the CUDA-graph option's refusals (CoMERA, arXiv 2405.14377, §4, captures the whole step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer


def _config(corpus: Path, out: Path, **overrides: object) -> TrainConfig:
    fields = dict(
        preset="tiny",
        method="cola",
        steps=6,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        data=str(corpus),
        eval_every=3,
        eval_blocks=4,
        checkpoint_every=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return TrainConfig(**{**fields, **overrides})


def test_static_step_trains_exactly_like_the_eager_step(small_corpus: Path, tmp_path: Path) -> None:
    eager = Trainer(_config(small_corpus, tmp_path / "eager")).run()
    static = Trainer(_config(small_corpus, tmp_path / "static"), static_step=True).run()
    # The static step warms up on the first batch and restores every weight and AdamW moment in place before its
    # first real step, so it must not differ at all.
    assert static.losses == eager.losses
    assert static.val_loss == eager.val_loss


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_graphs_refuse_a_machine_without_cuda(small_corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cuda_graphs=True needs device='cuda' and a CUDA device") as error:
        Trainer(_config(small_corpus, tmp_path / "run"), cuda_graphs=True)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"grad_accum": 2}, "static_step=True needs grad_accum=1, got 2"),
        ({"method": "galore"}, r"method 'galore' \(optimizer 'galore'\) does not fit"),
        ({"method": "comera"}, r"method 'comera' \(optimizer 'adamw'\) does not fit"),
    ],
)
def test_static_step_refuses_what_it_cannot_run(
    small_corpus: Path, tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Trainer(_config(small_corpus, tmp_path / "run", **overrides), static_step=True)
    with pytest.raises(ValueError, match="needs on_nonfinite='stop'"):
        Trainer(_config(small_corpus, tmp_path / "run"), static_step=True, on_nonfinite="skip")


def test_the_cuda_graphs_flag_is_refused_in_one_line_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorslim.cli.main import main

    if torch.cuda.is_available():
        return  # the refusal is for machines without CUDA; with CUDA the flag runs (not testable here)
    assert main(["train", "--method", "dense", "--cuda-graphs", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cuda" in err.lower()
