"""Compress a pretrained model to a budget: calibration, activation-aware decompositions, the choice of family and
size per layer, and healing."""

from tensorslim.compression.api import CompressReport, compress, heal
from tensorslim.compression.calibration import Calibration, calibrate

__all__ = ["Calibration", "CompressReport", "calibrate", "compress", "heal"]
