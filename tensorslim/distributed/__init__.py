"""Tensor parallelism for low-rank LLaMA models: BOOST's bottleneck-aware TP and its baselines.

See :func:`tensorslim.distributed.parallelize.parallelize` and ``docs/boost.md``.
"""

from tensorslim.distributed.comm import CommLog, TPGroup
from tensorslim.distributed.parallelize import STYLES, TPCausalLM, build_mesh, parallelize

__all__ = ["STYLES", "CommLog", "TPCausalLM", "TPGroup", "build_mesh", "parallelize"]
