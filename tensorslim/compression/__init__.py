"""Compress a pretrained model to a budget: calibration, activation-aware decompositions, the choice of family and
size per layer, and healing."""

from tensorslim.compression.api import CompressReport, compress
from tensorslim.compression.calibration import Calibration, calibrate
from tensorslim.compression.heal import heal

__all__ = ["Calibration", "CompressReport", "calibrate", "compress", "heal"]
