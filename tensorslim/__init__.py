"""tensorslim: low-rank and tensor-network structure for cheaper transformers.

Importing the package only defines names: no global backends, threads or I/O.
"""

from tensorslim.convert import METHODS, TRANSFORMS, ConversionReport, LayerReport, convert_, plan
from tensorslim.layers.lowrank import CoLAConfig, LowRankConfig, LowRankLinear, SVDConfig

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "TRANSFORMS",
    "CoLAConfig",
    "ConversionReport",
    "LayerReport",
    "LowRankConfig",
    "LowRankLinear",
    "SVDConfig",
    "convert_",
    "plan",
]
