"""Quantization: RTN/GPTQ/COMQ post-training quantization with packed storage (``QuantLinear``), QAT of tensor
cores with learnable scales, and layer-by-layer distillation. Importing it does no work."""

from tensorslim.quant.api import QuantReport, load_quantized, quantize_, save_quantized, select_layers
from tensorslim.quant.comq import COMQConfig, comq_quantize
from tensorslim.quant.gptq import GPTQConfig, gptq_quantize
from tensorslim.quant.qat import LearnedScaleQuantizer, QATConfig, lsq_quantize, prepare_qat_, qat_bits
from tensorslim.quant.qlinear import (
    QuantConv2d,
    QuantEmbedding,
    QuantLinear,
    QuantLowRankLinear,
    QuantTTLinear,
    set_kernel_activations,
    set_weight_cache,
)
from tensorslim.quant.quantizer import Grid, QuantConfig, QuantResult, minmax_grid, pack_codes, unpack_codes
from tensorslim.quant.rtn import RTNConfig, rtn_quantize

__all__ = [
    "COMQConfig",
    "LearnedScaleQuantizer",
    "QATConfig",
    "lsq_quantize",
    "prepare_qat_",
    "qat_bits",
    "GPTQConfig",
    "Grid",
    "QuantConfig",
    "QuantConv2d",
    "QuantEmbedding",
    "QuantLinear",
    "QuantLowRankLinear",
    "QuantTTLinear",
    "set_kernel_activations",
    "set_weight_cache",
    "QuantReport",
    "QuantResult",
    "RTNConfig",
    "comq_quantize",
    "gptq_quantize",
    "load_quantized",
    "minmax_grid",
    "pack_codes",
    "quantize_",
    "rtn_quantize",
    "save_quantized",
    "select_layers",
    "unpack_codes",
]
