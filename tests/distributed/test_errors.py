"""User errors of the parallel setup are one-line ValueErrors raised before any work; dead peers end runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorslim.distributed.layout import check_parallel_config, parallel_layout
from tensorslim.distributed.parallelize import check_divisibility, check_world, parallelize
from tensorslim.models.llama import LlamaConfig
from tensorslim.train.config import TrainConfig
from tests.distributed import workers

CONFIG = LlamaConfig(**workers.TINY)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("tp", "style", "rank", "names"),
    [
        (3, "btp", 16, "n_heads=4"),  # also d=64, but heads come first
        (8, "btp", 16, "n_heads=4"),
        (2, "vanilla", 15, "rank=15"),
        (4, "btp", 16, None),  # 4 divides 4 heads, d=64, d_ff=172 and V=256; BTP never splits r
    ],
)
def test_tp_must_divide_heads_d_and_rank(tp: int, style: str, rank: int, names: str | None) -> None:
    if names is None:
        check_divisibility(CONFIG, tp=tp, style=style, rank=rank)  # 4 divides 4 heads, 64, 172, 256
        return
    with pytest.raises(ValueError, match=f"tp={tp} does not divide {names}"):
        check_divisibility(CONFIG, tp=tp, style=style, rank=rank)


def test_tp_must_divide_d_ff_and_vocabulary() -> None:
    # (tp dividing the heads implies it divides d = heads · head_dim, so d cannot fail on its own)
    config = LlamaConfig(d_model=64, n_layers=1, n_heads=4, d_ff=170, vocab_size=256)
    with pytest.raises(ValueError, match="tp=4 does not divide d_ff=170"):
        check_divisibility(config, tp=4, style="btp", rank=16)
    config = LlamaConfig(d_model=64, n_layers=1, n_heads=4, d_ff=172, vocab_size=250)
    with pytest.raises(ValueError, match="tp=4 does not divide vocab_size=250"):
        check_divisibility(config, tp=4, style="megatron", rank=0)


@pytest.mark.parametrize(("tp", "world"), [(3, 4), (0, 2), (4, 2)])
def test_world_size_must_be_a_multiple_of_tp(tp: int, world: int) -> None:
    with pytest.raises(ValueError, match=f"tp={tp} must be a positive divisor of the world size {world}"):
        check_world(tp, world_size=world)


def test_bad_style_norm_or_model_is_refused_before_any_work() -> None:
    with pytest.raises(ValueError, match="style='zero' is unknown"):
        parallelize(workers.tiny_model("btp"), None, "zero")
    with pytest.raises(ValueError, match="needs a dense model"):
        parallelize(workers.tiny_model("btp"), None, "megatron")
    with pytest.raises(ValueError, match="bias-free LowRankLinear"):
        parallelize(workers.tiny_model("megatron"), None, "btp")
    with pytest.raises(ValueError, match="recompute='latent' needs norm='online'"):
        parallelize(workers.tiny_model("btp"), None, "btp", norm="sync", recompute="latent")
    with pytest.raises(ValueError, match="recompute='all' is unknown"):
        parallelize(workers.tiny_model("btp"), None, "btp", recompute="all")
    with pytest.raises(ValueError, match=r"overlap='async' is unknown; allowed: \['none', 'backward', 'full'\]"):
        parallelize(workers.tiny_model("btp"), None, "btp", overlap="async")
    with pytest.raises(ValueError, match=r"dp_shard=True needs a \(dp, tp\) mesh from build_mesh\(\)"):
        parallelize(workers.tiny_model("btp"), None, "btp", dp_shard=True)


def test_train_config_checks_style_method_and_batch_split() -> None:
    with pytest.raises(ValueError, match="tp_style='zero' is unknown"):
        check_parallel_config(TrainConfig(tp=2, tp_style="zero").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="tp_overlap='yes' is unknown"):
        check_parallel_config(TrainConfig(tp=2, tp_overlap="yes").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="method='cola' does not fit tp_style='megatron'"):
        check_parallel_config(TrainConfig(tp=2, tp_style="megatron").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="batch_size=3 must be divisible by the data-parallel size 2"):
        check_parallel_config(TrainConfig(tp=2, batch_size=3).parallel_setup(), world_size=4)
    with pytest.raises(
        ValueError,
        match=r"method='galore' does not fit tp_style='btp' \(GaLore's projector .*\); allowed: \['cola', 'svd'\]",
    ):
        check_parallel_config(TrainConfig(tp=2, method="galore").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="task='mlm' cannot run in parallel"):
        check_parallel_config(TrainConfig(preset="bert-tiny", tp=2).parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="family 'gpt2'"):
        check_parallel_config(TrainConfig(preset="gpt2-tiny", tp=2).parallel_setup(), world_size=2)


def test_the_method_registry_says_which_methods_shard_and_why_not() -> None:
    # DDP: the projector sees whole gradients
    check_parallel_config(TrainConfig(method="galore").parallel_setup(), world_size=2)
    # FSDP2 on the TT model itself
    check_parallel_config(TrainConfig(method="tt", dp_shard=2).parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match=r"method='galore' cannot train data-parallel with fsdp \(GaLore's projector"):
        check_parallel_config(TrainConfig(method="galore", dp_shard=2).parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match=r"method='comera' cannot train data-parallel with ddp \(its stages slice"):
        check_parallel_config(TrainConfig(method="comera").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match=r"method='lax-cola' does not fit tp_style='btp' \(TP: the BTP/vanilla"):
        check_parallel_config(TrainConfig(method="lax-cola", tp=2).parallel_setup(), world_size=4)
    with pytest.raises(ValueError, match=r"method='tt' does not fit tp_style='vanilla' \(TP: a TT layer"):
        check_parallel_config(TrainConfig(method="tt", tp=2, tp_style="vanilla").parallel_setup(), world_size=2)
    with pytest.raises(ValueError, match="dp_shard=3 must be 1 \\(DDP\\) or the whole data-parallel size 2"):
        check_parallel_config(TrainConfig(tp=2, dp_shard=3).parallel_setup(), world_size=4)


def test_one_process_gets_the_single_process_layout_and_tp_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorslim.distributed.layout import SingleProcess

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert isinstance(parallel_layout(TrainConfig().parallel_setup()), SingleProcess)
    with pytest.raises(ValueError, match="tp=2 needs one process per rank: torchrun --nproc-per-node 2"):
        parallel_layout(TrainConfig(tp=2).parallel_setup())


def test_cli_reports_a_bad_mesh_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from tensorslim.cli.main import main

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "--tp", "3"]) == 2  # before any process group, data or model exists
    assert (
        capsys.readouterr().err.strip()
        == "tensorslim train: error: tp=3 must be a positive divisor of the world size 4"
    )


def test_a_dead_peer_ends_the_survivor_by_its_reset_not_a_timeout(small_corpus: Path, tmp_path: Path) -> None:
    code = "import sys; from tests.distributed.workers import fault_main; fault_main(*sys.argv[1:])"
    args = [str(small_corpus), str(tmp_path / "run")]
    with workers.hosted_group() as group:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **group}
        procs = [
            subprocess.Popen([sys.executable, "-c", code, str(rank), *args], cwd=ROOT, env=env, stderr=subprocess.PIPE)
            for rank in (0, 1)
        ]
        errors = [proc.communicate(timeout=1200)[1].decode() for proc in procs]
    assert procs[1].returncode == 3
    assert procs[0].returncode == 1, errors[0][-2000:]
    lost = next(line for line in errors[0].splitlines() if "lost contact" in line)
    assert lost.startswith("tensorslim train: error: rank 0 lost contact with a peer process")
    assert "timed out" not in lost and "timeout" not in lost.lower()  # seen by the reset, not by waiting 600 s


def test_guard_reports_lost_peers_only(capsys: pytest.CaptureFixture) -> None:
    from tensorslim.distributed.layout import peer_failure_guard

    with pytest.raises(RuntimeError, match="shape mismatch"), peer_failure_guard(0):
        raise RuntimeError("shape mismatch")  # a bug, not a lost peer: passes through
    with pytest.raises(SystemExit) as exit_info, peer_failure_guard(1):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert exit_info.value.code == 1
    assert "rank 1 lost contact with a peer process" in capsys.readouterr().err


def test_mixed_precision_policies() -> None:
    import torch

    from tensorslim.distributed.fsdp import mixed_precision

    policy = mixed_precision("bf16")
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert mixed_precision("fp32").param_dtype is None
    with pytest.raises(ValueError, match="mixed_precision='fp16' is unknown; allowed: \\['fp32', 'bf16'\\]"):
        mixed_precision("fp16")
