"""Every module-swap family refuses a bad request without changing the model (the :data:`tests.contracts.REFUSALS`
rows): module types, parameter and buffer values, ``requires_grad`` flags and hooks are bit-identical afterwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.registry import set_submodule, unchanged_on_error
from tests.contracts import REFUSALS, ROWS, Refusal, assert_unchanged, dense_model, snapshot


@pytest.mark.parametrize("row", REFUSALS, ids=str)
def test_a_refused_call_leaves_the_model_bit_identical(row: Refusal) -> None:
    model = row.model()
    before = snapshot(model)
    with pytest.raises(row.error) as caught:
        row.call(model)
    assert "\n" not in str(caught.value)  # one line
    assert_unchanged(before, snapshot(model))


def test_every_registered_family_has_a_refusal_row() -> None:
    import tensorslim.layers  # noqa: F401 - registers every layer family
    import tensorslim.quant  # noqa: F401 - registers quantization and QAT
    from tensorslim.registry import TRANSFORMS

    refused = [row.family for row in REFUSALS if row.family is not None]
    missing = sorted(cls.__name__ for cls in TRANSFORMS if not any(issubclass(family, cls) for family in refused))
    assert not missing, f"registered families without a refusal row in tests/contracts.py: {missing}"


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def test_the_guard_undoes_swaps_freezing_attributes_hooks_and_parametrizations() -> None:
    """What only building can find fails halfway: everything the block did before it is undone."""
    model = dense_model(ROWS[0])
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="halfway"), unchanged_on_error(model):
        model.requires_grad_(False)
        set_submodule(model, "blocks.0.up", LowRankLinear(8, 12, 2))
        parametrize.register_parametrization(model.blocks[1].up, "weight", _Double())
        model.blocks[1].register_forward_hook(lambda *args: None)
        model.extra = "added"
        raise RuntimeError("halfway")
    assert_unchanged(before, snapshot(model))
    assert not hasattr(model, "extra")
    torch.testing.assert_close(
        model(torch.ones(1, 8, dtype=torch.float64)), dense_model(ROWS[0])(torch.ones(1, 8, dtype=torch.float64))
    )


def test_a_layer_larger_than_dense_is_refused_by_plan_and_convert_unless_allowed() -> None:
    """The sizes in the message are the layers' own books: the built layer has exactly the planned parameters."""
    from tensorslim.convert import convert_, plan
    from tensorslim.layers.lowrank import SVDConfig

    model = dense_model(ROWS[0])
    config = SVDConfig(rank=8)  # 8 -> 12: 8·(8 + 12) + 12 = 172 > 8·12 + 12 = 108
    for verb in (plan, convert_):
        with pytest.raises(ValueError, match=r"layer 'blocks.0.up': SVDConfig makes it larger than dense \(172 > 108"):
            verb(model, config)
    report = convert_(model, config, allow_larger=True)
    built = model.blocks[0].up
    assert report.layers[0].params_after == sum(p.numel() for p in built.parameters()) == 172
    assert report.layers[0].params_before == 108
