"""tensorslim.compress: candidates measured on calibration inputs, one budget, healing; on a tiny random BERT."""

from __future__ import annotations

import pytest
import torch

from tensorslim import Budget
from tensorslim.compression import compress
from tensorslim.compression.choose import Candidate, choose
from tensorslim.compression.heal import HealConfig
from tests.helpers import tiny_hf_bert

transformers = pytest.importorskip("transformers")


def _batches(n: int, *, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, 8:] = 0
    return [{"input_ids": torch.randint(0, 64, (4, 12), generator=gen), "attention_mask": mask} for _ in range(n)]


def _linear_params(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() + m.bias.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_choose_fits_the_limit_and_beats_every_single_family() -> None:
    gen = torch.Generator().manual_seed(1)
    options = []
    for _ in range(6):
        scale = float(torch.rand((), generator=gen)) * 3
        cands = [Candidate("dense", 0, 100, 400, 200, 0.0)]
        for family, step in (("lowrank", 10), ("kron", 7)):
            for k in range(1, 9):
                error = scale * (1 - k / 9) ** (2 if family == "lowrank" else 1.5)
                cands.append(Candidate(family, k, step * k, step * k * 4, 2 * step * k, error))
        options.append(cands)
    limit = 300
    picks = choose(options, "params", limit)
    used = sum(o[i].params for o, i in zip(options, picks, strict=True))
    error = sum(o[i].error for o, i in zip(options, picks, strict=True))
    assert used <= limit
    for family in ("lowrank", "kron"):  # one family, one size everywhere, at the largest size that fits
        for k in range(8, 0, -1):
            single = [next(c for c in o if c.family == family and c.setting == k) for o in options]
            if sum(c.params for c in single) <= limit:
                assert error <= sum(c.error for c in single) + 1e-12
                break
    with pytest.raises(ValueError, match="below"):
        choose(options, "params", 10)


def test_compress_meets_the_budget_and_heals() -> None:
    model = tiny_hf_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dense = _linear_params(model)
    student, report = compress(
        model,
        Budget(params=0.5),
        _batches(3, seed=0),
        held_out=_batches(1, seed=9),
        healing=HealConfig(block_steps=2, steps=4, lr=1e-3),
        progress=False,
    )
    assert sum(c.params for c in report.choices.values()) <= 0.5 * dense
    assert {c.family for c in report.choices.values()} <= {"dense", "lowrank", "kron"}
    names = [s.name for s in report.stages]
    assert names == [
        "original",
        "chosen, before healing",
        "healed layer by layer (2 steps per block)",
        "healed end to end (4 steps)",
    ]
    assert report.stages[0].quality == pytest.approx(1.0)
    assert report.stages[1].params < report.stages[0].params
    assert all(0 < s.quality <= 1 + 1e-6 for s in report.stages)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is untouched


def test_compress_to_bytes_quantizes() -> None:
    model = tiny_hf_bert()
    student, report = compress(model, Budget(bytes=0.2), _batches(2, seed=0), progress=False)
    assert any(c.family in ("int8", "int4") for c in report.choices.values())
    assert sum(c.nbytes for c in report.choices.values()) <= 0.2 * 4 * _linear_params(model)
    out = student(**_batches(1, seed=3)[0]).last_hidden_state
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 0.5}, "budget="),
        ({"families": ("svd",)}, "families="),
        ({"healing": HealConfig(steps=1), "heal_data": [torch.zeros(2, 3)]}, "cannot be healed"),
        ({"calibration": []}, "calibration is empty"),
    ],
)
def test_compress_refuses_a_bad_request(kwargs: dict, match: str) -> None:
    args = {"budget": Budget(params=0.5), "calibration": _batches(1, seed=0)} | kwargs
    with pytest.raises(ValueError, match=match):
        compress(tiny_hf_bert(), args.pop("budget"), args.pop("calibration"), progress=False, **args)
