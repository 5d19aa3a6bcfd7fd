"""W8/W4 for deployment: token embeddings and output head quantized with the rest (llama.cpp-style), CoLA factors
quantized after conversion, the same logits as the dequantized model, and the bytes in memory and on disk."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.lowrank import CoLAConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.pretrained import WEIGHTS, load_pretrained, save_pretrained
from tensorslim.quant import (
    QuantEmbedding,
    QuantLinear,
    QuantLowRankLinear,
    RTNConfig,
    quantize_,
    set_kernel_activations,
)
from tensorslim.quant.quantizer import dequantize

CONFIG = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=160, vocab_size=256, max_seq_len=64)


def _llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(CONFIG).eval()


def _dequantized_copy(model: nn.Module, *, cola: CoLAConfig | None = None) -> LlamaForCausalLM:
    """An independent float model (converted by ``cola`` first) whose every quantized matrix is
    ``scale · (codes − zero)`` of ``model``'s."""
    reference = _llama(seed=1)
    if cola is not None:
        convert_(reference, cola)
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantLowRankLinear):
            for factor, key in ((module.a, "weight_a"), (module.b, "weight_b")):
                state[f"{name}.{key}"] = dequantize(factor.codes(), factor.grid)
        elif isinstance(module, QuantLinear) and not name.endswith((".a", ".b")):
            state[f"{name}.weight"] = dequantize(module.codes(), module.grid)
    float_state = {k: v for k, v in model.state_dict().items() if not k.endswith(("packed", "scale", "zero"))}
    reference.load_state_dict({**float_state, **state})
    return reference


def _state_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("bits", [4, 8])
def test_embeddings_and_head_are_quantized_and_the_logits_follow_the_codes(bits: int, tmp_path) -> None:
    model = _llama()
    dense_bytes = _state_bytes(model)
    report = quantize_(model, RTNConfig(bits=bits, embeddings=True), None)
    assert isinstance(model.embed_tokens, QuantEmbedding) and isinstance(model.lm_head, QuantLinear)
    assert {"embed_tokens", "lm_head"} <= {r.name for r in report.layers}
    set_kernel_activations(model, "float32")
    ids = torch.randint(0, CONFIG.vocab_size, (2, 12))
    with torch.no_grad():
        logits = model(ids)
        torch.testing.assert_close(logits, _dequantized_copy(model)(ids), rtol=1e-4, atol=1e-4)
    # memory: every weight matrix at bits/8 bytes, plus per-row scales/zero points and the float norms
    weights = sum(p.numel() for n, p in _llama().named_parameters() if "norm" not in n)
    assert _state_bytes(model) <= weights * bits / 8 * 1.15 + (dense_bytes - 4 * weights)
    assert report.bytes_after() <= weights * bits / 8 * 1.15
    save_pretrained(model, tmp_path, base=None)
    assert (tmp_path / WEIGHTS).stat().st_size <= report.bytes_after() + (dense_bytes - 4 * weights) + 16_384
    loaded = load_pretrained(tmp_path, model=_llama(seed=2))
    set_kernel_activations(loaded, "float32")
    assert isinstance(loaded.embed_tokens, QuantEmbedding)
    with torch.no_grad():
        assert torch.equal(loaded(ids), logits)


def test_float_embeddings_stay_float_by_default() -> None:
    model = _llama()
    quantize_(model, RTNConfig(bits=4), None)
    assert type(model.embed_tokens) is nn.Embedding and type(model.lm_head) is nn.Linear
    with pytest.raises(ValueError, match="embeddings='yes'"):
        RTNConfig(bits=4, embeddings="yes")


def test_cola_factors_are_quantized_after_conversion_and_run_on_the_kernels() -> None:
    model = _llama()
    cola = CoLAConfig(rank=16)
    convert_(model, cola)
    quantize_(model, RTNConfig(bits=4, embeddings=True), None)
    factored = [m for m in model.modules() if isinstance(m, QuantLowRankLinear)]
    assert len(factored) == 2 * 7  # q, k, v, o, gate, up, down in each block
    assert all(m.a.layout == "int4pack" and m.b.layout == "int4pack" for m in factored)
    set_kernel_activations(model, "float32")
    ids = torch.randint(0, CONFIG.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), _dequantized_copy(model, cola=cola)(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits", [4, 8])
def test_cola_factors_chain_on_the_kernels_like_the_dequantized_factors(bits: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96))
    convert_(model, CoLAConfig(rank=32))  # σ = SiLU between the factors
    quantize_(model, RTNConfig(bits=bits), None)
    layer = model[0]
    x = torch.randn(5, 3, 64)
    a = dequantize(layer.a.codes(), layer.a.grid, dtype=torch.float64)
    b = dequantize(layer.b.codes(), layer.b.grid, dtype=torch.float64)
    hidden = torch.nn.functional.silu(x.double() @ a.t())  # (5, 3, 32)
    reference = hidden @ b.t() + layer.bias.double()
    magnitude = (x.double().abs() @ a.abs().t()) @ b.abs().t()  # the scale of the roundings on the way
    with torch.no_grad():
        set_kernel_activations(model, "float32")
        torch.testing.assert_close(layer(x).double(), reference, rtol=1e-5, atol=1e-5)
        set_kernel_activations(model, "bfloat16")  # σ(A x) stays bf16 between the two kernels
        y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (5, 3, 96)
    # bf16 rounds x, A's scale table, A x (the hidden), B's table and the output: 2**-9 each, a few times over
    assert ((y.double() - reference).abs() <= 8 * 2**-9 * magnitude + 1e-6).all()
