"""Training methods: importing this package registers every method (see :mod:`tensorslim.methods.registry`)."""

from tensorslim.methods import adapters, adaptive, comera, dense, kron, lowrank, qat  # noqa: F401 - each module registers its methods
from tensorslim.methods.build import (
    apply_method,
    build_for_method,
    build_run_model,
    initial_model,
    method_books,
    method_options,
    model_books,
)
from tensorslim.methods.registry import METHODS, Method, MethodContext, get_method, register_method

__all__ = [
    "METHODS",
    "Method",
    "MethodContext",
    "apply_method",
    "build_for_method",
    "build_run_model",
    "get_method",
    "initial_model",
    "method_books",
    "method_options",
    "model_books",
    "register_method",
]
