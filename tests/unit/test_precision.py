"""``dtype="auto"``: bf16 exactly where the device declares native bf16; the probe and the CPU flags are injected, so
nothing here depends on the machine's CPU."""

from __future__ import annotations

import pytest
import torch

from tensorslim.train.execution import PrecisionProbe, autocast, cpu_flags, probe_bf16, resolve_dtype


def _probe(native: bool):
    def probe(device: torch.device) -> PrecisionProbe:
        return PrecisionProbe(
            device=device.type,
            capability="injected",
            native_flags=("avx512_bf16",) if native else (),
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


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ({"avx2", "avx512f"}, ()),
        ({"avx512f", "avx512_bf16"}, ("avx512_bf16",)),
        ({"amx_bf16", "amx_tile"}, ("amx_bf16",)),
    ],
)
def test_auto_decides_from_the_cpu_flags_alone_and_says_what_it_found(flags: set[str], native: tuple) -> None:
    found = probe_bf16("cpu", flags=frozenset(flags))
    assert found.native_flags == native and found.bf16_native is bool(native)
    assert probe_bf16("cpu", flags=frozenset(flags)) == found  # no timing: the same flags, the same verdict
    capability = torch.backends.cpu.get_cpu_capability()
    if native:
        assert found.reason == f"CPU {capability} with native bf16 ({native[0]})"
    else:
        assert found.reason == f"CPU {capability} without native bf16 (no avx512_bf16 or amx_bf16 flag)"
    assert found.to_dict()["reason"] == found.reason


def test_auto_on_this_machine_follows_its_flags() -> None:
    found = probe_bf16("cpu")
    assert found.bf16_native == bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


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
