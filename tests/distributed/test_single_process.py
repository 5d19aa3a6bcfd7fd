"""What needs no process group: TP=1 equivalence of every style and the saved-activation cut of BTP checkpointing."""

from __future__ import annotations

import pytest
import torch

from tensorslim.distributed import parallelize
from tensorslim.tasks.lm import causal_lm_loss
from tests.distributed import workers


@pytest.mark.parametrize("style", ["btp", "vanilla", "megatron"])
def test_tp1_equals_the_model(style: str) -> None:
    model = workers.tiny_model(style)
    tp_model = parallelize(model, None, style)
    ids = workers.batches(1)[0]
    torch.testing.assert_close(tp_model(ids), model(ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tp_model.loss(ids), causal_lm_loss(model(ids), ids), rtol=1e-6, atol=1e-6)


def _saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(ids).backward()
    return sum(seen.values())


def test_latent_checkpointing_saves_less_and_changes_nothing() -> None:
    ids = workers.batches(1, batch=4, seq=64)[0]
    plain = parallelize(workers.tiny_model("btp"), None, "btp")
    ckpt = parallelize(workers.tiny_model("btp"), None, "btp", recompute="latent")
    assert _saved_bytes(ckpt, ids) < 0.6 * _saved_bytes(plain, ids)
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6, msg=name)
