"""One real MiniLM layer: COMQ's defaults (descent from GPTQ) at or below GPTQ's output error, both far below RTN."""

from __future__ import annotations

import torch

from tensorslim.quant import COMQConfig, GPTQConfig, RTNConfig, comq_quantize, gptq_quantize, rtn_quantize
from tensorslim.quant.calibration import collect_grams, relative_output_error, weight_matrix


def test_comq_defaults_on_a_real_minilm_layer_are_at_or_below_gptq() -> None:
    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import bbcnews_labelled
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    model = BertModel.from_pretrained(model_folder("minilm")).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_folder("minilm"))
    texts = bbcnews_labelled()[0][::100][:16]  # 16 articles across the five classes
    name = "encoder.layer.1.attention.self.query"
    layer = model.get_submodule(name)
    stats = collect_grams(model, {name: layer}, calibration_batches(tokenizer, texts, seq_len=96))
    assert stats[name].rows > 384  # enough rows for a full-rank H
    w, h = weight_matrix(layer), stats[name].gram
    err = {
        label: relative_output_error(w, fn(w, h, config).dequantize(dtype=torch.float64), h)
        for label, fn, config in (
            ("rtn", rtn_quantize, RTNConfig(bits=4)),
            ("gptq", gptq_quantize, GPTQConfig(bits=4)),
            ("comq", comq_quantize, COMQConfig(bits=4)),
        )
    }
    assert err["comq"] <= err["gptq"], err
    assert max(err["comq"], err["gptq"]) < 0.8 * err["rtn"], err
