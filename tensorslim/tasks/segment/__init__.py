"""Segmentation with global binary masks (arXiv 2205.09107): the ``segment`` task, its metrics and figures.

The data the task reads (phantoms, warped brain slices, masks, splits) is in :mod:`tensorslim.data.segment`.
"""

from tensorslim.tasks.segment.task import (
    AugmentedStream,
    IntensityAugment,
    Segmentation,
    SegmentOptions,
    SegmentSplit,
    load_run,
    predict,
    random_affine,
    segment_loss,
)

__all__ = [
    "AugmentedStream",
    "IntensityAugment",
    "SegmentOptions",
    "SegmentSplit",
    "Segmentation",
    "load_run",
    "predict",
    "random_affine",
    "segment_loss",
]
