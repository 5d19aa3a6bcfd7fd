"""``tensorslim quantize`` end to end on the bundled MiniLM (RTN: no solver time), and its bad-input errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tensorslim.cli.main import main
from tensorslim.quant import QuantLinear, load_quantized
from tests.helpers import train_until_interrupted


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


def test_quantize_cli_embeddings_flag_quantizes_the_token_tables_too(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from transformers import BertModel

    from tensorslim.quant import QuantEmbedding
    from tensorslim.quant.hf_inputs import model_folder

    argv = ["quantize", "--method", "rtn", "--bits", "8", "--calib-docs", "2", "--seq-len", "16", "--data", "stdlib"]
    sizes = {}
    for flags in ([], ["--embeddings"]):
        out = tmp_path / f"minilm-w8{''.join(flags)}.safetensors"
        assert main([*argv, *flags, "--out", str(out)]) == 0
        sizes[bool(flags)] = out.stat().st_size
    model = load_quantized(BertModel.from_pretrained(model_folder("minilm")).eval(), out)
    # the word table has a padding_idx and stays float; the position and token-type tables are quantized
    tables = [model.embeddings.position_embeddings, model.embeddings.token_type_embeddings]
    assert all(isinstance(table, QuantEmbedding) and table.bits == 8 for table in tables)
    # each table entry shrinks from 4 bytes to 1 byte (plus a scale and zero point per row)
    table_bytes = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    assert sizes[True] < sizes[False] - 0.7 * table_bytes
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
        (["--init", "zeros"], "init='zeros' is not supported"),
        (["--model", "/nonexistent"], "is neither 'minilm' nor"),
        (["--data", "/no/such/corpus"], "data '/no/such/corpus' does not exist"),  # before the model loads
    ],
)
def test_quantize_cli_bad_input_is_one_line_exit_2(flags: list[str], message: str, capsys) -> None:  # noqa: ANN001
    assert main(["quantize", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def _distill_config(out: Path, **overrides: object):  # noqa: ANN202 - a TrainConfig
    from tensorslim.train.config import TrainConfig

    base = TrainConfig(
        preset="minilm",
        task="distill",
        method="tt-qat",
        steps=4,
        batch_size=4,
        seq_len=32,
        lr=1e-3,
        warmup_fraction=0.0,
        data="bbcnews",
        eval_blocks=4,
        eval_every=2,
        checkpoint_every=2,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return replace(base, **overrides)


def test_train_command_distills_minilm_into_a_tt_qat_student(tmp_path: Path) -> None:
    import json

    out = tmp_path / "run"
    argv = ["train", "--preset", "minilm", "--task", "distill", "--method", "tt-qat", "--steps", "6", "--lr", "1e-3"]
    argv += ["--steps-per-layer", "100", "--rank", "8", "--batch-size", "4", "--seq-len", "32", "--data", "bbcnews"]
    argv += ["--warmup-fraction", "0", "--eval-blocks", "4", "--eval-every", "6", "--checkpoint-every", "3"]
    assert main([*argv, "--out-dir", str(out), "--no-progress", "--no-tensorboard"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    losses = summary["losses"]
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2]), losses  # one layer on: comparable steps
    assert summary["params_total"] < summary["dense_params_total"] / 1.5
    assert 0.0 < summary["val_metrics"]["val_cos_mean"] <= 1.0 and summary["val_loss"] > 0
    assert (out / "loss.png").stat().st_size > 0 and (out / "metrics.jsonl").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1].endswith("6")


def test_distill_run_interrupted_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    from tensorslim.train.trainer import train

    config = _distill_config(tmp_path / "full", task_options={"steps_per_layer": 2})  # steps 2, 3 match 2 layers
    full = train(config)
    interrupted = replace(config, out_dir=str(tmp_path / "cut"))

    train_until_interrupted(interrupted, after_step=3)
    resumed = train(replace(interrupted, resume=True))
    assert resumed.losses == full.losses
    assert resumed.val_metrics == full.val_metrics


def test_distill_cli_runs_a_few_steps_and_reports_compression(tmp_path: Path) -> None:
    import json

    out = tmp_path / "distill.json"
    argv = ["distill", "--steps-per-layer", "1", "--task-steps", "1", "--batch-size", "2", "--seq-len", "8"]
    argv += ["--eval-docs", "4", "--no-eval-bbc", "--rank", "4", "--out-dir", str(tmp_path / "run")]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["steps"] == 6 + 1
    assert (tmp_path / "run" / "summary.json").is_file()
    before, after = report["encoder_linear_params"]
    assert after < before / 20
    assert report["model_bits"][1] < report["model_bits"][0]
    (teacher_params, student_params), (teacher_bits, student_bits) = report["encoder_params"], report["encoder_bits"]
    assert teacher_bits == 32 * teacher_params
    assert 4 * student_params < student_bits < 32 * student_params  # 4-bit cores, float LayerNorms/biases/scales
    assert report["compression_encoder_bits"] == teacher_bits / student_bits
    assert -1.0 <= report["spearman_pairwise"] <= 1.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--qat", "int4"], "qat='int4' is not supported"),
        (["--bits", "9"], "bits=9"),
        (["--init", "x"], "init='x'"),
        (["--final-lr", "1"], "final_lr=1.0 is invalid"),
        (["--lr", "0"], "lr=0.0 is invalid; allowed: a finite number > 0"),
        (["--eval-docs", "0"], "eval_docs=0 is invalid; allowed: an integer >= 1"),
        (["--test-docs", "0"], "test_docs=0 is invalid; allowed: an integer >= 1"),
        (["--task-steps", "-1"], "task_steps=-1 is invalid; allowed: an integer >= 0"),
    ],
)
def test_distill_cli_bad_input(flags: list[str], message: str, capsys) -> None:  # noqa: ANN001
    assert main(["distill", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
