"""Training steps free their autograd graph, also the part the loss never reaches (BERT's pooler under distillation).

The Trainer tallies saved activations with ``saved_tensors_hooks``; a pack hook that returned the tensor itself made
every node that saves its own output (tanh, softmax, ...) own a tensor owning the node, a C++ cycle that gc cannot
see and that only backward breaks. The pooler output is never in the distillation loss, so its graph, and through it
the last layer's activations, outlived every step.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch
from torch import nn

from tensorslim.train.memory import count_saved_tensors


class TwoHeads(nn.Module):
    """A trunk with a head the loss uses and a tanh head it never reaches (a pooler)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.head, self.side = nn.Linear(6, 6), nn.Linear(6, 3), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (B, 6) -> (B, 3), (B, 6)
        h = torch.tanh(self.trunk(x))
        return self.head(h), torch.tanh(self.side(h))


def _step(model: TwoHeads, x: torch.Tensor, *, tally: bool) -> tuple[weakref.ref, int]:
    """Forward + backward; a weak reference to the unused head's output and the saved bytes tallied."""
    if tally:
        with count_saved_tensors(model) as counter:
            out, unused = model(x)
        saved = counter.bytes
    else:
        (out, unused), saved = model(x), 0
    out.square().sum().backward()
    return weakref.ref(unused), saved


def test_counting_saved_tensors_frees_the_graph_of_an_unused_output() -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(4, 6)
    unused, _ = _step(model, x, tally=False)
    gc.collect()
    assert unused() is None  # plain autograd: the reference behaviour
    unused, saved = _step(model, x, tally=True)
    gc.collect()
    assert unused() is None
    # the storages saved in the forward: x (trunk matmul), the trunk's tanh output (its own backward and both heads'
    # matmuls) and the side head's tanh output, 4×6 float32 each; the weights are excluded
    assert saved == 3 * 4 * 6 * 4


def test_counting_saved_tensors_keeps_the_gradients() -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(4, 6)
    _step(model, x, tally=False)
    used = [*model.trunk.parameters(), *model.head.parameters()]  # the side head gets no gradient
    reference = [p.grad.clone() for p in used]
    model.zero_grad()
    _step(model, x, tally=True)
    for p, g in zip(used, reference, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    assert all(p.grad is None for p in model.side.parameters())


def test_distill_trainer_steps_free_the_pooler_graph(tmp_path: Path) -> None:
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset="minilm",
        task="distill",
        method="tt-qat",
        options={"rank": 4},
        task_options={"steps_per_layer": 1},
        steps=2,
        batch_size=2,
        seq_len=8,
        lr=1e-3,
        warmup_fraction=0.0,
        data="bbcnews",
        eval_blocks=2,
        eval_every=2,
        checkpoint_every=2,
        out_dir=str(tmp_path),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config)
    outputs: list[weakref.ref] = []
    trainer.model.pooler.register_forward_hook(lambda module, args, out: outputs.append(weakref.ref(out)))
    trainer.run()
    gc.collect()
    assert len(outputs) >= 2  # one per training step at least (evaluation adds its own)
    assert [ref() for ref in outputs] == [None] * len(outputs)
