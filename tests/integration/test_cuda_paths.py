"""The CUDA code paths, each against its CPU or eager reference: a captured CUDA-graph step (CoMERA, arXiv
2405.14377, §4) and the Trainer's ``--cuda-graphs``, bf16 autocast, the LM loss and the factored vocabulary on the GPU.

They need a CUDA device and skip without one; ``benchmarks/gpu_check.sh`` runs them on a machine with a GPU.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.functional.cross_entropy import linear_cross_entropy
from tensorslim.layers.tt import TTConfig
from tensorslim.methods.comera import CoMERAConfig, CoMERAObjective, param_groups
from tensorslim.methods.comera.static import GateFreeze, stage_loss
from tensorslim.methods.vocab import factor_vocabulary_
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.tasks.lm import lm_loss
from tensorslim.train.config import TrainConfig
from tensorslim.train.execution import GraphedStep, autocast
from tensorslim.train.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
CONFIG = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=256, max_seq_len=32)


def _llama(device: torch.device | str = "cpu") -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).to(device)


def _ids(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1)).to(device)


def _loss(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
    loss = lm_loss(model, batch)
    return loss, {"loss": loss.detach()}


def test_a_captured_step_trains_like_the_plain_loop() -> None:
    model = _llama(CUDA)
    twin = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-3, capturable=True)
    step = GraphedStep(model, optimizer, _loss, capture=True, warmup=3)
    batches = [_ids(CUDA).roll(i, dims=1) for i in range(4)]
    captured = [float(step(batch)["loss"]) for batch in batches]
    plain = []
    for batch in batches:
        loss, _ = _loss(twin, batch)
        twin_optimizer.zero_grad()
        loss.backward()
        twin_optimizer.step()
        plain.append(loss.item())
    assert captured == pytest.approx(plain, rel=1e-4)
    torch.testing.assert_close(model.state_dict(), twin.state_dict(), rtol=1e-4, atol=1e-5)


def _comera_late_step(model: nn.Module, *, capture: bool) -> GraphedStep:
    """CoMERA's late-stage step with the sync-free gate freeze, captured or eager."""
    optimizer = torch.optim.AdamW(param_groups(model), weight_decay=0.0, capturable=True)
    objective = CoMERAObjective(CoMERAConfig(target_ratio=0.5))

    def task(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return (model(x) - y).square().mean()

    freeze = GateFreeze(model, optimizer, objective)
    objective.start_late(model, target_loss=1.0)
    loss = stage_loss(objective, task, late=True)
    return GraphedStep(
        model, optimizer, loss, capture=capture, warmup=2, update=freeze.step, extra_state=(freeze.frozen,)
    )


def test_comera_captured_late_step_equals_the_eager_one() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 12))
    convert_(model, TTConfig(rank=4, n_cores=4, init="random", rank_gates=True))
    model = model.to(CUDA)
    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randn(5, 12, generator=generator).to(CUDA), torch.randn(5, 12, generator=generator).to(CUDA))]
    batches *= 3
    captured, eager = _comera_late_step(model, capture=True), _comera_late_step(twin, capture=False)
    for batch in batches:
        captured(batch)
        eager(batch)
    torch.testing.assert_close(model.state_dict(), twin.state_dict(), rtol=1e-4, atol=1e-6)


def test_trainer_cuda_graphs_equal_the_eager_cuda_run(small_corpus: Path, tmp_path: Path) -> None:
    fields = dict(preset="tiny", method="cola", steps=4, batch_size=4, seq_len=32, vocab_size=512)
    fields |= dict(data=str(small_corpus), eval_every=2, eval_blocks=4, progress=False, tensorboard=False)
    eager = Trainer(TrainConfig(**fields, device="cuda", out_dir=str(tmp_path / "eager"))).run()
    graphed = Trainer(TrainConfig(**fields, device="cuda", cuda_graphs=True, out_dir=str(tmp_path / "graph"))).run()
    assert graphed.losses == pytest.approx(eager.losses, rel=1e-3)
    assert graphed.val_loss == pytest.approx(eager.val_loss, rel=1e-3)


def test_bf16_autocast_loss_and_gradients_are_close_to_float32() -> None:
    model, ids = _llama(CUDA), _ids(CUDA)
    reference = lm_loss(model, ids)
    reference_grads = torch.autograd.grad(reference, list(model.parameters()))
    with autocast("bf16", CUDA):
        loss = lm_loss(model, ids)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(reference.item(), rel=2e-2)
    for grad, ref in zip(grads, reference_grads, strict=True):
        assert torch.linalg.vector_norm(grad - ref) <= 0.1 * torch.linalg.vector_norm(ref) + 1e-6


def test_lm_loss_and_factored_vocabulary_on_cuda_equal_cpu() -> None:
    cpu = _llama()
    factor_vocabulary_(cpu, 16, embedding=True, init="random")
    gpu = copy.deepcopy(cpu).to(CUDA)
    torch.testing.assert_close(lm_loss(gpu, _ids(CUDA)).cpu(), lm_loss(cpu, _ids()), rtol=1e-4, atol=1e-5)
    hidden = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    weight, targets = torch.randn(40, 16), torch.randint(0, 40, (8,))
    expected = F.cross_entropy(F.linear(hidden, weight), targets)
    got = linear_cross_entropy(hidden.to(CUDA), weight.to(CUDA), targets.to(CUDA))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)
