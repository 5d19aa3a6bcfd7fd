"""tensorslim: low-rank and tensor-network structure for cheaper transformers.

Importing the package only defines names: no global backends, threads or I/O. The public names are loaded on first
use (PEP 562), so that ``import tensorslim.cli`` does not import torch before the command line has set up its
environment.
"""

from __future__ import annotations

import importlib
from typing import Any

from tensorslim._version import __version__ as __version__

_EXPORTS = {
    "ConversionReport": "tensorslim.registry",
    "LayerReport": "tensorslim.registry",
    "convert_": "tensorslim.convert",
    "plan": "tensorslim.convert",
    "Budget": "tensorslim.budget",
    "calibrate": "tensorslim.compression",
    "compress": "tensorslim.compression",
    "CoLAConfig": "tensorslim.layers.lowrank",
    "CoLAMConfig": "tensorslim.layers.cola_m",
    "checkpoint_": "tensorslim.layers.cola_m",
    "LaXCoLAConfig": "tensorslim.layers.lax",
    "LaXSVDConfig": "tensorslim.layers.lax",
    "LaXTTConfig": "tensorslim.layers.lax_tt",
    "TrainConfig": "tensorslim.train.config",
    "KronConfig": "tensorslim.layers.kron",
    "KronLinear": "tensorslim.layers.kron",
    "LowRankConfig": "tensorslim.layers.lowrank",
    "LowRankLinear": "tensorslim.layers.lowrank",
    "SVDConfig": "tensorslim.layers.lowrank",
    "TTConfig": "tensorslim.layers.tt",
    "TTLinear": "tensorslim.layers.tt",
    "TTEmbeddingConfig": "tensorslim.layers.tt_embedding",
    "TTEmbedding": "tensorslim.layers.tt_embedding",
    "quantize_": "tensorslim.quant",
    "COMQConfig": "tensorslim.quant",
    "GPTQConfig": "tensorslim.quant",
    "RTNConfig": "tensorslim.quant",
    "save_pretrained": "tensorslim.pretrained",
    "load_pretrained": "tensorslim.predict",  # tensorslim.pretrained's, with the training runs' bases registered
    "generate": "tensorslim.generation",
    "predictor": "tensorslim.predict",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tensorslim' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
