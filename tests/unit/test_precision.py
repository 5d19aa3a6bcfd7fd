"""``dtype="auto"``: bf16 only where the probe finds native bf16; the probe is injected, so nothing here depends on
the machine's CPU."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from tensorslim.bench.harness import BenchConfig, _Arm, synthetic_batch
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.methods import build_for_method
from tensorslim.tasks.lm import causal_lm_loss
from tensorslim.train import optim
from tensorslim.train.optim import build_optimizer
from tensorslim.train.precision import (
    BF16Shadows,
    PrecisionProbe,
    autocast,
    cpu_flags,
    fused_adamw,
    probe_bf16,
    resolve_dtype,
    shadowable,
)


def _probe(native: bool):
    def probe(device: torch.device) -> PrecisionProbe:
        return PrecisionProbe(
            device=device.type,
            capability="injected",
            native_flags=("avx512_bf16",) if native else (),
            fp32_gflops=100.0,
            bf16_gflops=400.0 if native else 10.0,
            bf16_native=native,
        )

    return probe


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_follows_the_probe(native: bool, expected: str) -> None:
    used, found = resolve_dtype("auto", "cpu", probe=_probe(native))
    assert used == expected
    assert found is not None and found.bf16_native is native
    assert found.to_dict()["native_flags"] == (["avx512_bf16"] if native else [])


@pytest.mark.parametrize("requested", ["fp32", "bf16"])
def test_an_explicit_dtype_is_kept_without_probing(requested: str) -> None:
    def refuse(device: torch.device) -> PrecisionProbe:
        raise AssertionError("an explicit dtype must not probe")

    assert resolve_dtype(requested, "cpu", probe=refuse) == (requested, None)


def test_an_unknown_dtype_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="dtype='fp16' is invalid"):
        resolve_dtype("fp16", "cpu")


def test_the_real_probe_agrees_with_its_own_measurements() -> None:
    found = probe_bf16("cpu")
    assert found.fp32_gflops > 0 and found.bf16_gflops > 0
    # The verdict is the rule applied to what it found, whatever this machine is.
    assert found.bf16_native == (bool(found.native_flags) and found.bf16_gflops >= 1.3 * found.fp32_gflops)


def test_cpu_flags_reads_the_first_flags_line(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_bf16_autocast_runs_matmuls_in_bf16_and_fp32_leaves_them() -> None:
    a = torch.randn(4, 4)
    with autocast("bf16", "cpu"):
        assert (a @ a).dtype == torch.bfloat16
    with autocast("fp32", "cpu"):
        assert (a @ a).dtype == torch.float32


def _tiny_cola(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model, _, _ = build_for_method("tiny", "cola", max_seq_len=32)
    return model


def _autocast_step(model, optimizer, batch, max_norm) -> tuple[float, float]:
    with autocast("bf16", "cpu"):
        loss = causal_lm_loss(model(batch), batch)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), norm


def _shadow_step(model, optimizer, shadows, batch, max_norm) -> tuple[float, float]:
    with shadows.swapped(), autocast("bf16", "cpu"):
        loss = causal_lm_loss(model(batch), batch)
    loss.backward()
    norm, scale = shadows.clip_grad_norm(model, max_norm)
    shadows.step(optimizer, grad_scale=scale)
    shadows.zero_grad(optimizer)
    return loss.item(), norm


@pytest.mark.parametrize("max_norm", [0.5, float("inf")])
def test_bf16_weight_copies_compute_exactly_what_autocast_computes(monkeypatch, max_norm: float) -> None:
    # Slices of 1,000 elements: every weight is updated in several slices, some ending mid-tensor.
    monkeypatch.setattr(optim, "BF16_SLICE", 1000)
    plain, shadowed = _tiny_cola(), _tiny_cola()
    plain_opt = build_optimizer(plain, lr=3e-3, weight_decay=0.1)
    shadow_opt = build_optimizer(shadowed, lr=3e-3, weight_decay=0.1)
    shadows = BF16Shadows(shadowed)
    assert (
        fused_adamw(shadow_opt) and shadows.describe()["tensors"] == len(plain.layers) * 7 * 2 + 1
    )  # A, B × 7 per block; head
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):  # the first step creates AdamW's state through the optimizer's own step, the others do not
        batch = torch.randint(plain.config.vocab_size, (2, 32), generator=generator)
        assert _shadow_step(shadowed, shadow_opt, shadows, batch, max_norm) == _autocast_step(
            plain, plain_opt, batch, max_norm
        )
    for (name, a), b in zip(plain.named_parameters(), shadowed.parameters(), strict=True):
        assert b.dtype == torch.float32 and torch.equal(a, b), name  # fp32 master weights, bit for bit
        if id(b) in shadows.shadows:
            assert torch.equal(shadows.shadows[id(b)], a.to(torch.bfloat16)), name  # fresh copies
    # Between forwards the modules hold their fp32 parameters again.
    assert all(p.dtype == torch.float32 for p in shadowed.parameters())


def test_a_weight_changed_outside_the_optimizer_is_copied_again() -> None:
    model = _tiny_cola()
    head = model.lm_head.weight
    shadows = BF16Shadows(model)
    with torch.no_grad():
        head.mul_(3.0)  # a checkpoint loaded, a hook: the version counter moves
    with shadows.swapped():
        assert model.lm_head.weight is not head and torch.equal(model.lm_head.weight, head.to(torch.bfloat16))
    assert model.lm_head.weight is head


def test_only_weights_that_autocast_casts_whole_get_a_copy() -> None:
    gated = LowRankLinear(8, 8, rank=4)
    gated.enable_gates()  # B·diag(gate) is formed in fp32, then cast: B itself is not cast whole
    plain = LowRankLinear(8, 8, rank=4)
    embedding, head, frozen = nn.Embedding(10, 8), nn.Linear(8, 10, bias=True), nn.Linear(8, 8)
    head.weight = embedding.weight  # tied: the embedding reads it in fp32
    frozen.weight.requires_grad_(False)
    model = nn.ModuleDict({"gated": gated, "plain": plain, "embedding": embedding, "head": head, "frozen": frozen})
    found = [(m, n) for m, n in shadowable(model)]
    assert [n for m, n in found if m is plain] == ["weight_a", "weight_b"]
    assert [n for m, n in found if m is gated] == ["weight_a"]
    assert len(found) == 3  # nothing of the tied head, the embedding or the frozen layer


def test_bench_steps_bf16_with_weight_copies_and_autocast_values() -> None:
    config = BenchConfig(preset="tiny", methods="cola", batch_size=1, seq_len=16, dtype="bf16", task="lm")
    batch = synthetic_batch(config)
    copies, plain = _Arm(config, "cola", dtype="bf16"), _Arm(config, "cola", dtype="bf16")
    plain.shadows = None
    assert copies.shadows and _Arm(config, "cola", dtype="fp32").shadows is None
    for _ in range(3):
        for arm in (copies, plain):
            arm.step(batch, timed=True, clock=time.perf_counter)
    assert copies.losses == plain.losses
