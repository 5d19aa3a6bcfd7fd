"""Segmentation with global binary masks (arXiv 2205.09107): offline data, the mask builder, metrics and plots."""
