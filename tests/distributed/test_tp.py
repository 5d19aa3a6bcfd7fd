"""Tensor parallelism on CPU/gloo against the single-process model (BOOST, arXiv 2512.12131, §3).

Each multi-process fixture starts its processes once and runs every check inside them (process start-up
dominates: about 3–5 s per process on two shared cores).
"""

from __future__ import annotations

import fcntl
import json

import pytest
import torch.multiprocessing as mp

from tests.distributed import workers

D, F, R = workers.TINY["d_model"], workers.TINY["d_ff"], workers.RANK


def _spawn_once(fn, nprocs: int, factory: pytest.TempPathFactory, name: str) -> dict:
    """Run ``fn`` on ``nprocs`` processes once per test session, even under pytest-xdist: the workers share the
    base temp folder's parent, and a file lock makes the second worker wait for the first one's results."""
    shared = factory.getbasetemp().parent
    path = shared / f"tensorslim-{name}.json"
    with open(shared / f"tensorslim-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = shared / f"tensorslim-{name}.partial.json"
            with workers.hosted_group() as group:
                mp.spawn(fn, args=(nprocs, group, str(partial)), nprocs=nprocs)
            partial.rename(path)
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def tp2(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict:
    return _spawn_once(workers.tp2_worker, 2, tmp_path_factory, f"tp2-{_run_id(tmp_path_factory, worker_id)}")


@pytest.fixture(scope="session")
def tp4(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict:
    return _spawn_once(workers.tp4_worker, 4, tmp_path_factory, f"tp4-{_run_id(tmp_path_factory, worker_id)}")


def _run_id(factory: pytest.TempPathFactory, worker_id: str) -> str:
    # Under xdist the base temp is <root>/pytest-N/popen-gwK, so the shared parent is unique per session; without
    # xdist it is <root> itself, shared across sessions, so key by the session's own folder name.
    base = factory.getbasetemp()
    return base.parent.name if worker_id != "master" else base.name


OVERLAP_CASES = ["btp_overlap_backward", "btp_overlap_full", "btp_overlap_full_sync", "btp_overlap_full_ckpt"]
CASES = ["btp", "vanilla", "megatron", "btp_sync", "btp_ckpt", "btp_layer_ckpt", *OVERLAP_CASES]


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_match_one_process(tp2: dict, case: str) -> None:
    result = tp2[case]
    assert result["logits_err"] < 1e-5
    assert result["loss_err"] < 1e-5
    assert result["grad_keys_match"]
    assert result["grad_err"] < 1e-5 * max(1.0, result["grad_scale"])
    assert result["state_exact"]  # full_state_dict() gives back the TP=1 weights bit for bit


@pytest.mark.parametrize("style", ["btp", "vanilla", "megatron"])
def test_twenty_step_loss_curve_matches_one_process(tp2: dict, style: str) -> None:
    curve = tp2[f"curve_{style}"]
    assert len(curve["tp"]) == 20
    assert max(abs(a - b) for a, b in zip(curve["tp"], curve["ref"], strict=True)) < 1e-5


# Elements per token and layer, and collectives per layer (§5.2; §9 items 8 and 10), derived from the code:
# BTP sends qkv 3r+1 (latent + online-RMSNorm statistic), o r, gate_up 2r+1, down r, both directions;
# vanilla sends the B outputs forward (3d + d + 2f + d) and the A inputs backward (d + d + d + f);
# Megatron sends o and down forward, the two column-parallel inputs backward.
EXPECTED = {
    "btp": ((7 * R + 2, 4), (7 * R + 2, 4)),
    "btp_ckpt": ((7 * R + 2, 4), (7 * R + 2, 4)),  # latent recomputation re-runs no collective
    "btp_layer_ckpt": ((2 * (7 * R + 2), 8), (7 * R + 2, 4)),  # whole-layer recomputation runs the forward twice
    "btp_sync": ((7 * R + 2, 6), (7 * R + 2, 6)),  # the statistics travel in their own collectives
    "vanilla": ((5 * D + 2 * F, 7), (3 * D + F, 4)),
    "megatron": ((2 * D, 2), (2 * D, 2)),
    # Overlapped: B's backward all-reduces the latent's gradient (r per projection; the online statistic's gradient
    # is then computed from replicated values, so it is not sent). "full" all-reduces q, k, v and gate, up apart.
    "btp_overlap_backward": ((7 * R + 2, 4), (7 * R, 4)),
    "btp_overlap_full": ((7 * R + 2, 7), (7 * R, 7)),
    "btp_overlap_full_sync": ((7 * R + 2, 9), (7 * R + 2, 9)),  # + the two statistics both ways
    "btp_overlap_full_ckpt": ((7 * R + 2, 4), (7 * R, 4)),  # latent recomputation keeps the grouped latents
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_measured_communication_equals_the_formula(tp2: dict, case: str) -> None:
    (fwd, fwd_count), (bwd, bwd_count) = EXPECTED[case]
    assert tp2[case]["layer_fwd"] == {"elements_per_token": fwd, "count": fwd_count}
    assert tp2[case]["layer_bwd"] == {"elements_per_token": bwd, "count": bwd_count}


def test_overlapped_all_reduces_give_the_synchronous_loss_curve(tp2: dict) -> None:
    overlapped, synchronous = tp2["curve_btp_overlap"]["tp"], tp2["curve_btp"]["tp"]
    assert len(overlapped) == 20
    assert max(abs(a - b) for a, b in zip(overlapped, tp2["curve_btp"]["ref"], strict=True)) < 1e-5
    assert max(abs(a - b) for a, b in zip(overlapped, synchronous, strict=True)) < 1e-5


def test_btp_sends_at_least_4x_less_than_vanilla_and_less_than_megatron(tp2: dict) -> None:
    btp = tp2["btp"]["layer_fwd"]["elements_per_token"] + tp2["btp"]["layer_bwd"]["elements_per_token"]
    vanilla = tp2["vanilla"]["layer_fwd"]["elements_per_token"] + tp2["vanilla"]["layer_bwd"]["elements_per_token"]
    megatron = tp2["megatron"]["layer_fwd"]["elements_per_token"] + tp2["megatron"]["layer_bwd"]["elements_per_token"]
    assert vanilla >= 4 * btp and btp < megatron


def test_btp_head_gathers_once_and_softmax_statistics_are_small(tp2: dict) -> None:
    tokens = 4 * 16
    btp = {(row["tag"], row["phase"]): row for row in tp2["btp"]["rows"]}
    assert btp[("head.gather", "fwd")]["elements"] == tokens * D  # one all-gather of d after the last layer
    assert btp[("head.in", "bwd")]["elements"] == tokens * D  # the replicated final norm's gradient
    assert all(btp[(f"head.ce.{s}", "fwd")]["elements"] == 4 * 15 for s in ("max", "sumexp", "target"))


@pytest.mark.parametrize("norm", ["online", "sync"])
def test_rmsnorm_on_sharded_stream_is_exact(tp2: dict, norm: str) -> None:
    # values are O(10) and gradients O(10^3) here, so these are relative errors of about 1e-6
    assert tp2["rmsnorm"][norm]["value_err"] < 2e-5
    assert tp2["rmsnorm"][norm]["grad_err"] < 1e-3


def test_tp4_matches_one_process(tp4: dict) -> None:
    result = tp4["btp_tp4"]
    assert result["logits_err"] < 1e-5 and result["grad_err"] < 1e-5 and result["state_exact"]
    assert result["layer_fwd"] == {"elements_per_token": 7 * R + 2, "count": 4}
    curve = tp4["curve_btp_tp4"]
    assert max(abs(a - b) for a, b in zip(curve["tp"], curve["ref"], strict=True)) < 1e-5
    overlapped = tp4["btp_tp4_overlap"]
    assert overlapped["logits_err"] < 1e-5 and overlapped["grad_err"] < 1e-5
    assert overlapped["layer_fwd"] == {"elements_per_token": 7 * R + 2, "count": 7}


def test_tp2_by_dp2_mesh_matches_one_process_on_the_global_batch(tp4: dict) -> None:
    curve = tp4["curve_btp_dp2tp2"]
    assert max(abs(a - b) for a, b in zip(curve["tp"], curve["ref"], strict=True)) < 1e-5
    overlapped = tp4["curve_btp_dp2tp2_overlap"]["tp"]  # async latent all-reduces next to DDP's async buckets
    assert max(abs(a - b) for a, b in zip(overlapped, curve["ref"], strict=True)) < 1e-5
    accumulated = tp4["curve_btp_dp2tp2_accum"]["tp"]  # the same batches as two micro-batches per step
    assert max(abs(a - b) for a, b in zip(accumulated, curve["ref"], strict=True)) < 1e-5
    # DDP all-reduces every local gradient once per step over the dp axis (20 steps), also when a step accumulates
    # two micro-batches (no all-reduce after the first)
    assert tp4["dp_grads"]["elements"] == 20 * tp4["dp_grads"]["local_params"]
    assert tp4["dp_grads"]["accumulated"] == 20 * tp4["dp_grads"]["local_params"]
