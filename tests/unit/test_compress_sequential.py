"""Sequential calibration and the closed-form update against least squares; calibrated quantized candidates."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from tensorslim import Budget
from tensorslim.compression import calibrate, compress
from tensorslim.compression.build import balanced, low_rank_layer
from tensorslim.compression.calibration import call_groups, first_inputs, paired_grams
from tensorslim.compression.choose import Candidate, choose, layer_candidates
from tensorslim.decomp.svd import aligned_target, whitened_truncation, whitening_factor
from tensorslim.quant import COMQConfig, quantize_
from tensorslim.quant.calibration import relative_output_error

transformers = pytest.importorskip("transformers")


def _inputs(seed: int = 0, n: int = 300, d: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Original inputs ``x_f`` (n, d), drifted inputs ``x`` of a compressed model, a weight ``W`` (7, d)."""
    g = torch.Generator().manual_seed(seed)
    x_f = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    drift = torch.eye(d, dtype=torch.float64) + 0.2 * torch.randn(d, d, generator=g, dtype=torch.float64)
    x = x_f @ drift + 0.1 * torch.randn(n, d, generator=g, dtype=torch.float64)  # systematic error and noise
    return x_f, x, torch.randn(7, d, generator=g, dtype=torch.float64)


def test_aligned_target_is_the_least_squares_solution() -> None:
    x_f, x, w = _inputs()
    gram, cross = x.T @ x, x_f.T @ x
    whitener = whitening_factor(gram, damping=0.0)
    target = aligned_target(w, gram, cross, whitener)  # M x ≈ W x_f over the rows
    reference = torch.linalg.lstsq(x, x_f @ w.T).solution.T
    torch.testing.assert_close(target, reference, rtol=1e-8, atol=1e-10)
    assert torch.equal(aligned_target(w, gram, cross, whitener, alignment=0.0), w)
    half = aligned_target(w, gram, cross, whitener, alignment=0.5)  # targets halfway: (W x + W x_f) / 2
    torch.testing.assert_close(half, torch.linalg.lstsq(x, (x @ w.T + x_f @ w.T) / 2).solution.T)


def test_closed_form_update_beats_plain_whitening_and_is_stationary() -> None:
    x_f, x, w = _inputs(seed=1)
    gram, cross, rank = x.T @ x, x_f.T @ x, 5
    whitener = whitening_factor(gram, damping=0.0)

    def error(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(((x_f @ w.T - x @ (b @ a).T) ** 2).sum())

    a, b = whitened_truncation(aligned_target(w, gram, cross, whitener), whitener, rank)
    plain = whitened_truncation(w, whitening_factor(x_f.T @ x_f, damping=0.0), rank)  # fitted to the original inputs
    floor = float(((x_f @ w.T - x @ torch.linalg.lstsq(x, x_f @ w.T).solution) ** 2).sum())  # any rank
    tail = float((torch.linalg.svdvals(aligned_target(w, gram, cross, whitener) @ whitener)[rank:] ** 2).sum())
    assert error(a, b) == pytest.approx(floor + tail, rel=1e-9)  # the least any rank-r layer reaches
    assert error(a, b) - floor < 0.5 * (error(*plain) - floor)
    # with A fixed, the best B is the least-squares solution of (A x) Bᵀ = W x_f: the update already reached it
    b_lstsq = torch.linalg.lstsq(x @ a.T, x_f @ w.T).solution.T
    torch.testing.assert_close(b, b_lstsq, rtol=1e-6, atol=1e-8)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 8)).eval()


def test_paired_grams_of_an_unchanged_copy_equal_the_calibration() -> None:
    model = _mlp()
    batches = [torch.randn(10, 16) for _ in range(3)]
    names = ["0", "2", "4"]
    assert call_groups(model, batches[0], names) == [["0"], ["2"], ["4"]]
    copy = _mlp()
    stats = paired_grams(first_inputs(model, batches, names), copy, batches, names)
    cal = calibrate(model, batches, progress=False)
    for name in names:
        gram, cross = stats[name]
        torch.testing.assert_close(gram, cal.gram(model.get_submodule(name)))
        torch.testing.assert_close(cross, gram)


def test_bert_attention_inputs_form_one_group() -> None:
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    groups = call_groups(model, {"input_ids": torch.randint(0, 64, (2, 5))}, names)
    prefix = "encoder.layer.0."
    assert groups == [
        [prefix + "attention.self.query", prefix + "attention.self.key", prefix + "attention.self.value"],
        [prefix + "attention.output.dense"],
        [prefix + "intermediate.dense"],
        [prefix + "output.dense"],
    ]


def test_sequential_build_lowers_the_output_error() -> None:
    model = _mlp()
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(32, 16, generator=gen) for _ in range(4)]

    def output_error(student: nn.Module) -> float:
        with torch.no_grad():
            return sum(float(((student(b) - model(b)) ** 2).sum()) for b in batches)

    kwargs = {"families": ("lowrank",), "progress": False}
    plain, report = compress(model, Budget(params=0.4), batches, sequential=False, **kwargs)
    sequential, report_seq = compress(model, Budget(params=0.4), batches, sequential=True, **kwargs)
    assert report.choices == report_seq.choices  # the same ranks, fitted differently
    assert output_error(sequential) < 0.9 * output_error(plain)


def test_quantized_candidates_are_quantize_s_layers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 16)).eval()
    batches = [torch.randn(20, 24) for _ in range(2)]
    cal = calibrate(model, batches, progress=False)
    layer = model[0]
    cands = {c.family: c for c in layer_candidates("0", layer, cal, ("int4", "int3"))}
    for bits in (4, 3):
        reference = nn.Sequential(nn.Linear(24, 16))
        reference.load_state_dict(model.state_dict())
        report = quantize_(reference, COMQConfig(bits=bits), batches)
        candidate = cands[f"int{bits}"]
        assert candidate.nbytes == reference[0].storage_bytes()  # packed codes, scales, zero points, bias
        assert candidate.error == pytest.approx(report.layers[0].rel_output_error ** 2, rel=1e-6)
        w = layer.weight.detach().double()
        q = candidate.solution.dequantize(dtype=torch.float64)
        assert relative_output_error(w, q, cal.gram(layer)) ** 2 == pytest.approx(candidate.error, rel=1e-9)


def test_choice_is_never_worse_than_the_best_uniform_one() -> None:
    # the uniform 4-bit choice lies above each layer's convex hull, where the Lagrangian alone cannot reach it
    layer = [
        Candidate("lowrank", 1, 0, 0, 0, 1.0),
        Candidate("int4", 4, 6, 6, 0, 0.45),
        Candidate("dense", 0, 10, 10, 0, 0.0),
    ]
    options = [layer] * 3
    picks = choose(options, "params", 18)
    error = sum(o[i].error for o, i in zip(options, picks, strict=True))
    brute = min(
        sum(c.error for c in combo) for combo in itertools.product(*options) if sum(c.params for c in combo) <= 18
    )
    assert sum(o[i].params for o, i in zip(options, picks, strict=True)) <= 18
    assert error == pytest.approx(brute) == pytest.approx(1.35)


def test_low_rank_layers_get_balanced_factors_with_the_same_product() -> None:
    x_f, _, w = _inputs(seed=3)
    x_f = x_f * torch.linspace(0.1, 30.0, x_f.shape[1], dtype=torch.float64)  # input scales far apart
    a, b = whitened_truncation(w, whitening_factor(x_f.T @ x_f, damping=0.0), 4)
    assert (b.norm(dim=0) / a.norm(dim=1)).min() > 10  # the whitened factors come out unbalanced
    dense = nn.Linear(12, 7)
    layer = low_rank_layer(dense, a.float(), b.float())
    torch.testing.assert_close(layer.weight_b @ layer.weight_a, (b @ a).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight_a.norm(dim=1), layer.weight_b.norm(dim=0), rtol=1e-5, atol=0.0)
    torch.testing.assert_close(layer.bias, dense.bias)
    zero_a, zero_b = balanced(torch.zeros(2, 5), torch.ones(3, 2))  # a zero component stays as it was
    assert torch.equal(zero_a, torch.zeros(2, 5)) and torch.equal(zero_b, torch.ones(3, 2))
