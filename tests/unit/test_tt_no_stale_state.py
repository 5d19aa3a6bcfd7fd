"""TT layers keep nothing derived from their cores between calls: after a forward, a write to the cores through
``.data``, ``copy_``, ``load_state_dict`` or an optimizer step shows in the next forward and in ``to_dense``, exactly
as in a module freshly built with the new cores (only shape-keyed contraction plans are cached, never tensors)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig


def _linear() -> tuple[nn.Module, Callable[[], nn.Module], torch.Tensor]:
    torch.manual_seed(0)
    build = lambda: TTLinear.from_dense(nn.Linear(24, 32), TTConfig(rank=4, n_cores=4, rank_gates=True))  # noqa: E731
    return build(), build, torch.randn(3, 24)


def _embedding() -> tuple[nn.Module, Callable[[], nn.Module], torch.Tensor]:
    torch.manual_seed(0)
    config = TTEmbeddingConfig(rank=4, n_cores=3, rank_gates=True)
    build = lambda: TTEmbedding.from_dense(nn.Embedding(60, 24), config)  # noqa: E731
    return build(), build, torch.tensor([[0, 5, 59, 5]])


def _data(layer: nn.Module, new: dict[str, torch.Tensor]) -> None:
    for name, param in layer.named_parameters():
        param.data = new[name].clone()


def _copy(layer: nn.Module, new: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(new[name])


def _load(layer: nn.Module, new: dict[str, torch.Tensor]) -> None:
    layer.load_state_dict({**layer.state_dict(), **new})


def _step(layer: nn.Module, x: torch.Tensor) -> None:
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).float().pow(2).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("make", [_linear, _embedding], ids=["tt-linear", "tt-embedding"])
@pytest.mark.parametrize("write", ["data", "copy_", "load_state_dict", "optimizer step"])
def test_a_write_to_the_cores_shows_in_the_next_forward(make: Callable, write: str) -> None:
    layer, build, x = make()
    before = layer(x).detach().clone()  # a forward first: anything it kept would now be stale
    new = {name: param.detach() * 1.5 + 0.01 for name, param in layer.named_parameters()}
    if write == "optimizer step":
        _step(layer, x)
    else:
        {"data": _data, "copy_": _copy, "load_state_dict": _load}[write](layer, new)
    fresh = build()
    fresh.load_state_dict(layer.state_dict())  # a module that never ran, holding the written cores
    with torch.no_grad():
        after, expected = layer(x), fresh(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, expected)
    dense, fresh_dense = layer.to_dense(), fresh.to_dense()
    assert torch.equal(dense.weight, fresh_dense.weight)
