"""Compress a pretrained model to a budget: calibration, activation-aware decompositions and their allocation."""

from tensorslim.compress.calibration import Calibration, calibrate

__all__ = ["Calibration", "calibrate"]
