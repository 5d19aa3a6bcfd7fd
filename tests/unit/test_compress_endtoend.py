"""End-to-end choices of tensorslim.compress against losses computed directly on the swapped models; tiny BERT."""

from __future__ import annotations

import copy

import pytest
import torch

from tensorslim import Budget
from tensorslim.compression import calibrate, compress
from tensorslim.compression.build import replacement
from tensorslim.compression.choose import layer_candidates, quantized_nbytes
from tensorslim.compression.endtoend import EndToEnd, probe_indices, sensitivities
from tensorslim.quant import COMQConfig, quantize_
from tests.helpers import tiny_hf_bert

transformers = pytest.importorskip("transformers")


def _batches(n: int, *, seed: int, pad: bool = True) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(4, 12, dtype=torch.long)
    if pad:
        mask[0, 8:] = 0
    return [{"input_ids": torch.randint(0, 64, (4, 12), generator=gen), "attention_mask": mask} for _ in range(n)]


@torch.no_grad()
def _loss(model: torch.nn.Module, reference: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """1 − mean cosine of the masked mean-pooled last hidden states, written out here as the reference."""
    cosines = []
    for batch in batches:
        mask = batch["attention_mask"][..., None].float()
        a = (model(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)
        b = (reference(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)
        cosines.append((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)))
    return 1.0 - torch.cat(cosines).mean().item()


def test_sensitivity_is_the_loss_of_the_model_with_that_layer_alone_swapped() -> None:
    model, batches = tiny_hf_bert(), _batches(2, seed=0)
    name = "encoder.layer.0.intermediate.dense"
    cal = calibrate(model, batches, progress=False)
    layer = model.get_submodule(name)
    options = [layer_candidates(name, layer, cal, ("lowrank", "int4"))]
    measured = sensitivities(EndToEnd(model, batches), [name], options, cal, progress=False)[0]
    probed = set(probe_indices(options[0])) | {0}
    assert {options[0][i].family for i in probed} == {"dense", "lowrank", "int4"}
    for i in sorted(probed):
        cand, scaled = options[0][i], measured[i]
        swapped = copy.deepcopy(model)
        if cand.family != "dense":
            new = replacement(layer, cand, cal.gram(layer), damping=cal.damping)
            swapped.encoder.layer[0].intermediate.dense = new
        assert scaled.error == pytest.approx(_loss(swapped, model, batches), rel=1e-4, abs=1e-7)
    ranks = [c for c in measured if c.family == "lowrank"]
    assert all(a.error >= 0 for a in ranks) and ranks[0].error > ranks[-1].error


def test_compress_at_comq_bytes_is_no_worse_than_comq_4bit_end_to_end() -> None:
    model, batches = tiny_hf_bert(), _batches(3, seed=0, pad=False)
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    budget = Budget(bytes=sum(quantized_nbytes(m, 4) for m in linear))
    student, report = compress(model, budget, batches, families=("lowrank", "int8", "int4", "int3"), progress=False)
    comq = copy.deepcopy(model)
    quantize_(comq, COMQConfig(bits=4), batches)
    assert "int4 4 everywhere" in report.plan_losses
    assert report.plan_losses[report.plan] == min(report.plan_losses.values())
    assert report.plan_losses[report.plan] == pytest.approx(_loss(student, model, batches), rel=1e-4, abs=1e-7)
    assert _loss(student, model, batches) <= _loss(comq, model, batches) + 1e-7
    assert sum(c.nbytes for c in report.choices.values()) <= budget.bytes


def test_loss_over_a_language_model_s_long_flattened_logits_is_never_negative() -> None:
    """Two examples of 128 tokens × 32,000 logits: float32 sums over 4M entries err by ~1e-4, enough to make the
    unswapped loss negative and to rank a worse swap below a better one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 32_000)).eval()
    batches = [torch.randint(0, 64, (2, 128))]
    end_to_end = EndToEnd(model, batches)
    assert end_to_end.loss() == pytest.approx(0.0, abs=1e-12) and end_to_end.loss() >= 0.0
    head = model[1]
    losses = []
    for noise in (1e-3, 1e-2):
        new = copy.deepcopy(head)
        with torch.no_grad():
            new.weight.add_(noise * torch.randn_like(new.weight))
        with torch.no_grad():
            a = model(batches[0]).double().reshape(2, -1)
            b = new(model[0](batches[0])).double().reshape(2, -1)
        expected = 1.0 - ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).mean().item()
        losses.append(end_to_end.swapped_loss(head, new))
        assert losses[-1] == pytest.approx(expected, rel=1e-6)
    assert 0.0 < losses[0] < losses[1]
