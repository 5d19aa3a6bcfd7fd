"""``tensorslim export --format gguf``: a trained LLaMA run becomes a GGUF file with the run's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorslim.cli.main import main
from tensorslim.predict import predictor
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

gguf = pytest.importorskip("gguf", reason="GGUF export needs the deploy extra: pip install 'tensorslim[deploy]'")


def test_a_llama_run_exports_to_gguf(small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    steps = {"steps": 2, "batch_size": 2, "eval_every": 2, "eval_blocks": 2, "checkpoint_every": 2}
    quiet = {"progress": False, "tensorboard": False, "out_dir": str(run)}
    data = {"data": str(small_corpus), "seq_len": 32, "vocab_size": 300}
    Trainer(TrainConfig(**steps, **quiet, **data, preset="tiny", method="dense")).run()
    out = tmp_path / "gguf"
    assert main(["export", "--run", str(run), "--out", str(out), "--format", "gguf", "--gguf-type", "q8_0"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'model-q8_0.gguf'}"
    reader = gguf.GGUFReader(str(out / "model-q8_0.gguf"))
    loaded = predictor(run)
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embedding.tensor_type.name == "Q8_0"
    values = gguf.quants.dequantize(embedding.data, embedding.tensor_type).reshape(
        loaded.model.embed_tokens.weight.shape
    )
    weight = loaded.model.embed_tokens.weight.detach()
    assert torch.linalg.norm(torch.from_numpy(values) - weight) <= 0.01 * torch.linalg.norm(weight)
    # a second export into the same folder is refused and changes nothing
    assert main(["export", "--run", str(run), "--out", str(out), "--format", "gguf"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["model-q8_0.gguf"]
