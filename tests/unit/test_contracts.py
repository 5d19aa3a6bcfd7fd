"""Every row of the layer contract matrix (``tests/contracts.py``) passes the same checks.

Books (``plan`` = built parameters, ``flops`` = FlopCounterMode), forward = dense reconstruction, float64 gradcheck
through the whole toy model (LaX's crossings and CoLA-M's checkpointed blocks included), state-dict round trip,
save/load_pretrained round trip, ``meta``-device build, ``torch.compile`` = eager, finite bf16 forward close to float32.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tensorslim.convert import convert_, plan
from tensorslim.pretrained import load_pretrained, save_pretrained
from tensorslim.registry import TRANSFORMS, set_submodule, transform_for, transform_for_layer
from tests.contracts import BATCH, D_MODEL, ROWS, SEQ, Row, converted, converted_layers, dense_model, sample_inputs

pytestmark = pytest.mark.parametrize("row", ROWS, ids=str)


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_plan_books_equal_the_built_layers(row: Row) -> None:
    dense = dense_model(row)
    planned = plan(dense, row.config)
    model = copy.deepcopy(dense)
    report = convert_(model, row.config)
    layers = converted_layers(model, row)
    assert [r.name for r in planned.layers] == list(layers) and len(layers) == (1 if row.embedding else 4)
    for planned_row, built_row in zip(planned.layers, report.layers, strict=True):
        layer = layers[planned_row.name]
        assert planned_row.params_after == built_row.params_after == layer.num_params() == _n_params(layer)
    assert report.model_params_before == _n_params(dense) and report.model_params_after == _n_params(model)


def test_flops_equal_the_flop_counter(row: Row) -> None:
    model, _ = converted(row)
    with FlopCounterMode(display=False) as counter:
        model(sample_inputs(row))
    per_module = {name: sum(counts.values()) for name, counts in counter.get_flop_counts().items()}
    layers = converted_layers(model, row)
    for name, layer in layers.items():
        assert per_module.get(f"{type(model).__name__}.{name}", 0) == layer.flops(BATCH * SEQ), name
    # The toy's other operations (residual adds, SiLU) cost no matmul FLOPs: the layers are the whole count.
    assert counter.get_total_flops() == sum(layer.flops(BATCH * SEQ) for layer in layers.values())


def test_forward_equals_the_dense_reconstruction(row: Row) -> None:
    model, _ = converted(row)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    layers = converted_layers(model, row)
    handles = [
        layer.register_forward_hook(lambda module, args, out, name=name: seen.__setitem__(name, (args[0], out)))
        for name, layer in layers.items()
    ]
    out = model(sample_inputs(row))
    for handle in handles:
        handle.remove()
    refused = []
    for name, layer in layers.items():
        try:
            dense = layer.to_dense()
        except ValueError:
            refused.append(name)
            continue
        assert type(dense) in (nn.Linear, nn.Embedding)
        layer_in, layer_out = seen[name]
        torch.testing.assert_close(dense(layer_in), layer_out, rtol=1e-10, atol=1e-10)
    if row.dense:
        assert not refused
        reference = copy.deepcopy(model)
        for name, layer in converted_layers(reference, row).items():
            set_submodule(reference, name, layer.to_dense())
        torch.testing.assert_close(reference(sample_inputs(row)), out, rtol=1e-10, atol=1e-10)
    else:
        assert refused, "a layer without a dense equivalent must refuse to_dense()"


def test_gradcheck_float64(row: Row) -> None:
    """The model's own parameters are gradcheck's inputs (it perturbs them in place), so the check runs the model
    exactly as training does: a CoLA-M block recomputes with the parameters it saved, LaX reads its store."""
    model, _ = converted(row)
    params = tuple(model.parameters())
    x = sample_inputs(row)
    if row.embedding:
        assert torch.autograd.gradcheck(lambda *_: model(x), params)
    else:
        assert torch.autograd.gradcheck(lambda x, *_: model(x), (x.requires_grad_(), *params))


def test_state_dict_round_trip(row: Row) -> None:
    source, _ = converted(row, seed=0)
    fresh, _ = converted(row, seed=1)
    x = sample_inputs(row)
    assert not torch.allclose(fresh(x), source(x))
    fresh.load_state_dict(source.state_dict(), strict=True)
    torch.testing.assert_close(fresh(x), source(x), rtol=0, atol=0)


def test_save_load_pretrained_round_trip(row: Row, tmp_path: Path) -> None:
    source, _ = converted(row, seed=0)
    save_pretrained(source, tmp_path)
    with torch.device("meta"):
        base = dense_model(row)
    loaded = load_pretrained(tmp_path, model=base)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in source.modules()]
    x = sample_inputs(row)
    source.eval()  # as loaded: eval mode may store a layer's factors in another layout
    torch.testing.assert_close(loaded(x), source(x), rtol=0, atol=0)
    assert loaded(x).dtype == torch.float64


def test_every_family_describes_its_layers(row: Row) -> None:
    undescribed = sorted(cls.__name__ for cls, t in TRANSFORMS.items() if t.layer_type is None or t.describe is None)
    assert not undescribed, (
        f"registered families without layer_type/describe (save_pretrained needs both): {undescribed}"
    )
    transform = transform_for(row.config)
    assert transform.layer_type is row.layer
    model, _ = converted(row, seed=0)
    for name, layer in converted_layers(model, row).items():
        assert transform_for_layer(layer) is transform
        config, state = transform.describe(model, name, layer)
        assert type(config) is type(row.config)
        assert json.loads(json.dumps(state)) == state


def test_builds_and_runs_on_meta(row: Row) -> None:
    with torch.device("meta"):
        model, report = converted(row, dtype=torch.float32, random_init=True)
    assert all(p.is_meta for p in model.parameters()) and converted_layers(model, row)
    assert report.model_params_after == _n_params(model)
    out = model(sample_inputs(row, dtype=torch.float32, device="meta"))
    assert out.is_meta and out.shape == (BATCH, SEQ, D_MODEL)


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`-wrapped function")
def test_compile_equals_eager(row: Row) -> None:
    torch._dynamo.reset()  # a fresh cache per row, so no row falls back to eager for hitting the recompile limit
    model, _ = converted(row, dtype=torch.float32)
    x = sample_inputs(row, dtype=torch.float32)
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))


def test_bf16_forward_is_finite_and_close_to_float32(row: Row) -> None:
    model, _ = converted(row, dtype=torch.float32)
    expected = model(sample_inputs(row, dtype=torch.float32))
    out = model.to(torch.bfloat16)(sample_inputs(row, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.linalg.norm(out.float() - expected) <= 0.05 * torch.linalg.norm(expected)
