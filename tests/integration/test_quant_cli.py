"""``tensorslim quantize`` end to end on the bundled MiniLM (RTN: no solver time), and its bad-input errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorslim.cli.main import main
from tensorslim.quant import QuantLinear, load_quantized


def test_quantize_cli_writes_a_loadable_packed_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformers import BertModel

    from tensorslim.quant.hf_inputs import model_folder

    out = tmp_path / "minilm-w4.safetensors"
    argv = ["quantize", "--method", "rtn", "--bits", "4", "--calib-docs", "2", "--seq-len", "16", "--data"]
    assert main([*argv, "stdlib", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "layers quantized with RTNConfig" in text and f"wrote {out}" in text
    float_size = (model_folder("minilm") / "model.safetensors").stat().st_size
    model = BertModel.from_pretrained(model_folder("minilm")).eval()
    linear_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))
    # every linear weight shrinks from 32 to 4 bits plus per-row scales; the embeddings stay float
    assert out.stat().st_size < float_size - 0.85 * linear_bytes
    model = load_quantized(model, out)
    layer = model.encoder.layer[0].attention.self.query
    assert isinstance(layer, QuantLinear) and layer.bits == 4
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).last_hidden_state).all()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--bits", "9"], "bits=9 is not supported"),
        (["--bits", "1"], "bits=1 is not supported"),
        (["--method", "awq"], "method='awq' is not supported"),
        (["--order", "random"], "order='random' is not supported"),
        (["--model", "/nonexistent"], "is neither 'minilm' nor"),
    ],
)
def test_quantize_cli_bad_input_is_one_line_exit_2(flags: list[str], message: str, capsys) -> None:  # noqa: ANN001
    assert main(["quantize", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_distill_cli_runs_a_few_steps_and_reports_compression(tmp_path: Path) -> None:
    import json

    out = tmp_path / "distill.json"
    argv = ["distill", "--steps-per-layer", "1", "--task-steps", "1", "--batch-size", "2", "--seq-len", "8"]
    assert main([*argv, "--eval-docs", "4", "--no-eval-bbc", "--rank", "4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["steps"] == 6 + 1
    before, after = report["encoder_linear_params"]
    assert after < before / 20
    assert report["model_bits"][1] < report["model_bits"][0]
    assert -1.0 <= report["spearman_pairwise"] <= 1.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--qat", "int4"], "qat='int4' is not supported"), (["--bits", "9"], "bits=9"), (["--init", "x"], "init='x'")],
)
def test_distill_cli_bad_input(flags: list[str], message: str, capsys) -> None:  # noqa: ANN001
    assert main(["distill", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
