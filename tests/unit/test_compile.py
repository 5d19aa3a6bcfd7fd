"""Regional ``torch.compile`` (:mod:`tensorslim.train.execution`) computes what the eager model computes.

The tests compile with the ``aot_eager`` backend: Dynamo and AOTAutograd trace forward and backward exactly as for
TorchInductor, but no C++ is generated and built, which takes minutes on a loaded 2-core CI machine. The benchmarks
(``tensorslim bench --compile``) run TorchInductor itself.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.train.execution import compile_model, compile_seconds, repeated_blocks


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(LowRankLinear(16, 16, 4, activation="silu") for _ in range(2))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_compiled_cola_blocks_match_eager_forward_and_backward() -> None:
    torch.manual_seed(0)
    eager = _Stack()
    compiled = _Stack()
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled, backend="aot_eager")
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their names
    x = torch.randn(5, 16)
    for model in (eager, compiled):
        model(x).square().sum().backward()
    assert torch.allclose(compiled(x), eager(x), atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_repeated_blocks_are_the_stacks_of_one_class() -> None:
    model = _Stack()
    assert repeated_blocks(model) == list(model.blocks)
    assert repeated_blocks(nn.Sequential(nn.Linear(2, 2))) == []
    mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
    assert repeated_blocks(mixed) == []


@pytest.mark.parametrize(("times", "expected"), [([5.0, 1.0, 2.0, 1.5], 3.5), ([0.5, 1.0, 1.0], 0.0), ([2.0], 2.0)])
def test_compile_seconds_is_the_first_steps_excess_over_the_steady_median(times: list[float], expected: float) -> None:
    assert compile_seconds(times) == pytest.approx(expected)
