"""``dtype="auto"``: bf16 only where the probe finds native bf16; the probe is injected, so nothing here depends on
the machine's CPU."""

from __future__ import annotations

import pytest
import torch

from tensorslim.train.precision import PrecisionProbe, autocast, cpu_flags, probe_bf16, resolve_dtype


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
