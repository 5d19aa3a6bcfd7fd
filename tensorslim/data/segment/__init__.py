"""Offline segmentation data for global-binary-mask U-Nets (arXiv 2205.09107): thorax phantoms, warped MNI152 brain
slices, the global and prior masks, and the splits (:mod:`tensorslim.data.segment.sets`); the task that trains on
them is :mod:`tensorslim.tasks.segment`."""
