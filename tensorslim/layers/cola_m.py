"""CoLA-M: memory-efficient CoLA training by checkpointing at the rank-r latents.

CoLA (Liu et al., 2025, arXiv 2502.10940), §4 "CoLA-M": because every projection of a CoLA
block passes through an r-dimensional latent, the activations kept for backward can be cut down to those latents plus
the residual stream, and everything else (norms, up-projections, attention, the GLU product) recomputed once in
backward.

Our policy, which works on any model converted with :func:`tensorslim.convert_` (our LLaMA, Hugging Face models):

* each block (an element of an ``nn.ModuleList`` that holds low-rank layers) runs inside one autograd function that
  saves only the block's tensor inputs (for a decoder block the residual stream ``x``, d values per token) and the
  **pre-activation** latent ``A·x`` of every low-rank layer (r values per token and layer);
* in backward the block is recomputed once, but each down-projection ``A·x`` is replayed from its saved latent
  instead of being multiplied again; its gradients (``∂x = g·A``, ``∂A = gᵀ·x``) are formed in the replay.

So a LLaMA block saves ``(d + 7r)`` values per token instead of the paper's ``(2d + 7r)``: the paper also keeps the
mid-block residual ``h = x + o_proj(…)``, which we recompute with one extra ``B_o`` product (an r×d matmul) instead.
Saving the pre-activation rather than ``σ(A·x)`` (the paper's chunk inputs) means the A matmuls, about half of the
block's linear FLOPs, are never recomputed; the paper's reentrant chunks recompute them.

Weights are untouched: :class:`CoLAMLinear` has the parameters of :class:`LowRankLinear` under the same names and
checkpointed blocks keep their class's parameters, so CoLA and CoLA-M state dicts are interchangeable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from tensorslim.functional.lowrank import activation_fn
from tensorslim.layers._source import is_dense_linear
from tensorslim.layers.lowrank import (
    CoLAConfig,
    LowRankConfig,
    LowRankLinear,
    drop_glu_activation,
    low_rank_fields,
    plan_low_rank,
)
from tensorslim.registry import ConversionReport, Transform, register_transform, set_submodule

POLICIES: tuple[str, ...] = ("latent", "layer")


@dataclass(frozen=True, kw_only=True)
class CoLAMConfig(CoLAConfig):
    """CoLA layers plus latent checkpointing of every block (CoLA §4, CoLA-M).

    Attributes:
        policy: ``"latent"`` saves block inputs + pre-activation latents (CoLA-M); ``"layer"`` saves only the block
            inputs and recomputes everything (classic whole-layer gradient checkpointing).
    """

    policy: str = "latent"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is unknown; allowed: {list(POLICIES)}")


# ----------------------------------------------------------------------------------------------------------------
# The latent tape: records A·x in the forward, replays it in the recompute.


class _LatentTape:
    """The pre-activation latents of one block, in call order."""

    def __init__(self, mode: Literal["record", "replay"], latents: tuple[torch.Tensor, ...] = ()) -> None:
        self.mode = mode
        self.latents = list(latents)
        self.index = 0

    def next(self, shape: torch.Size) -> torch.Tensor:
        if self.index >= len(self.latents) or self.latents[self.index].shape != shape:
            raise RuntimeError(
                f"CoLA-M replay diverged from the forward at latent {self.index} (expected shape {tuple(shape)}); "
                "the block must call its low-rank layers in the same order on every run"
            )
        latent = self.latents[self.index]
        self.index += 1
        return latent


_LOCAL = threading.local()


@contextmanager
def _use_tape(tape: _LatentTape | None) -> Iterator[None]:
    previous = getattr(_LOCAL, "tape", None)
    _LOCAL.tape = tape
    try:
        yield
    finally:
        _LOCAL.tape = previous


class _ReplayedProjection(torch.autograd.Function):
    """``A·x`` whose value comes from the tape; backward is the matmul's: ``∂x = g·A``, ``∂A = gᵀ·x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_a: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight_a)
        return latent.view_as(latent)  # (..., r)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight_a = ctx.saved_tensors  # (..., d_in), (r, d_in)
        grad_x = grad_a = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad @ weight_a.to(grad.dtype)).to(x.dtype)  # (..., d_in)
        if ctx.needs_input_grad[1]:
            flat_grad = grad.reshape(-1, grad.shape[-1])  # (N, r)
            grad_a = (flat_grad.T @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).to(weight_a.dtype)  # (r, d_in)
        return grad_x, grad_a, None


def project_a(x: torch.Tensor, weight_a: torch.Tensor) -> torch.Tensor:
    """The down-projection ``A·x`` ``(..., r)``, recorded or replayed when a CoLA-M block is running."""
    tape: _LatentTape | None = getattr(_LOCAL, "tape", None)
    if tape is None:
        return F.linear(x, weight_a)
    if tape.mode == "record":
        latent = F.linear(x, weight_a)
        tape.latents.append(latent)
        return latent
    latent = tape.next(torch.Size((*x.shape[:-1], weight_a.shape[0])))
    return _ReplayedProjection.apply(x, weight_a, latent)


class CoLAMLinear(LowRankLinear):
    """A :class:`LowRankLinear` whose down-projection can be saved and replayed by a CoLA-M block.

    Outside a checkpointed block it computes exactly ``B σ(A x) + b``; parameters and state-dict names are those of
    :class:`LowRankLinear`.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent = activation_fn(self.activation)(project_a(x, self.weight_a))  # (..., r)
        return F.linear(latent, self.weight_b, self.bias)  # (..., d_out)

    @classmethod
    def from_low_rank(cls, layer: LowRankLinear) -> CoLAMLinear:
        """A CoLA-M layer that shares ``layer``'s parameter objects (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features, new.rank = layer.in_features, layer.out_features, layer.rank
        new.activation = layer.activation
        new.weight_a, new.weight_b, new.bias = layer.weight_a, layer.weight_b, layer.bias
        new.train(layer.training)
        return new

    @classmethod
    def from_dense(cls, module: nn.Module, config: LowRankConfig | None = None) -> CoLAMLinear:
        return cls.from_low_rank(LowRankLinear.from_dense(module, config))


# ----------------------------------------------------------------------------------------------------------------
# The block checkpoint.


class _Runner:
    """Calls a block's original forward on a flat list of tensors (the other arguments are kept aside)."""

    def __init__(self, module: nn.Module, forward: Any, args: tuple, kwargs: dict, policy: str) -> None:
        leaves, self.in_spec = tree_flatten((args, kwargs))
        self.slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.tensors = [leaves[i] for i in self.slots]
        for i in self.slots:
            leaves[i] = None  # the tensors travel through the autograd function, not through this object
        self.leaves, self.module, self.forward, self.policy = leaves, module, forward, policy
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.out_spec: Any = None
        self.out_leaves: list[Any] = []

    def run(self, tensors: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        leaves = list(self.leaves)
        for slot, tensor in zip(self.slots, tensors, strict=True):
            leaves[slot] = tensor
        args, kwargs = tree_unflatten(leaves, self.in_spec)
        out_leaves, self.out_spec = tree_flatten(self.forward(self.module, *args, **kwargs))
        self.out_leaves = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in out_leaves]
        return [leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor)]

    def rebuild(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        it = iter(tensors)
        leaves = [next(it) if leaf is None else leaf for leaf in self.out_leaves]
        return tree_unflatten(leaves, self.out_spec)


def _device_type(tensors: list[torch.Tensor]) -> str:
    return next((t.device.type for t in tensors), "cpu")


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype] | None:
    """The autocast state to replay in the recompute; None on devices without autocast (e.g. ``meta``)."""
    if device_type not in ("cpu", "cuda", "xpu", "mps", "hpu"):
        return None
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def _autocast_like(device_type: str, state: tuple[bool, torch.dtype] | None) -> AbstractContextManager[Any]:
    if state is None:
        return nullcontext()
    enabled, dtype = state
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


class _BlockCheckpoint(torch.autograd.Function):
    """Runs a block without keeping its graph; saves the inputs (+ latents) and recomputes in backward."""

    @staticmethod
    def forward(ctx: Any, runner: _Runner, n_inputs: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = tensors[:n_inputs]
        device_type = _device_type(list(inputs))
        ctx.runner, ctx.n_inputs, ctx.device_type = runner, n_inputs, device_type
        ctx.autocast = _autocast_state(device_type)
        ctx.rng_cpu = torch.get_rng_state()
        ctx.rng_cuda = torch.cuda.get_rng_state() if device_type == "cuda" else None
        tape = _LatentTape("record") if runner.policy == "latent" else None
        with _use_tape(tape):
            outputs = runner.run(inputs)
        ctx.save_for_backward(*inputs, *(tape.latents if tape is not None else ()))
        ctx.mark_non_differentiable(*[o for o in outputs if not o.is_floating_point()])
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        runner: _Runner = ctx.runner
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in saved[: ctx.n_inputs]]
        tape = _LatentTape("replay", saved[ctx.n_inputs :]) if runner.policy == "latent" else None
        devices = [torch.cuda.current_device()] if ctx.rng_cuda is not None else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), _use_tape(tape):
            torch.set_rng_state(ctx.rng_cpu)
            if ctx.rng_cuda is not None:
                torch.cuda.set_rng_state(ctx.rng_cuda)
            with _autocast_like(ctx.device_type, ctx.autocast):
                # Views, not the leaves themselves: module hooks (FlopCounterMode's tracker) may not see leaves
                # inside autograd.grad.
                outputs = runner.run(tuple(t.view_as(t) if t.requires_grad else t for t in inputs))
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad]
        wanted = [t for t in inputs if t.requires_grad] + runner.params
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        found_iter = iter(found)
        input_grads = [next(found_iter) if t.requires_grad else None for t in inputs]
        return (None, None, *input_grads, *found_iter)


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    original = type(self)._tensorslim_original_forward
    if not torch.is_grad_enabled():
        return original(self, *args, **kwargs)  # evaluation: nothing to save
    runner = _Runner(self, original, args, kwargs, self._tensorslim_policy)
    if not runner.params and not any(t.requires_grad for t in runner.tensors):
        return original(self, *args, **kwargs)
    outputs = _BlockCheckpoint.apply(runner, len(runner.tensors), *runner.tensors, *runner.params)
    runner.tensors = []  # from here on the inputs live only in the function's saved tensors
    return runner.rebuild(outputs)


_CHECKPOINTED_CLASSES: dict[type, type] = {}


def _checkpointed_class(cls: type) -> type:
    """A subclass of ``cls`` whose forward is checkpointed (same attributes, so the same state-dict names)."""
    if getattr(cls, "_tensorslim_original_forward", None) is not None:
        return cls
    if cls not in _CHECKPOINTED_CLASSES:
        _CHECKPOINTED_CLASSES[cls] = type(
            f"Checkpointed{cls.__name__}",
            (cls,),
            {"forward": _checkpointed_forward, "_tensorslim_original_forward": cls.forward},
        )
    return _CHECKPOINTED_CLASSES[cls]


# ----------------------------------------------------------------------------------------------------------------
# The verbs.


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of ``model``: elements of its outermost ``nn.ModuleList`` s (``model.layers[i]``,
    Hugging Face ``model.model.layers[i]``, BERT ``encoder.layer[i]``, GPT-2 ``transformer.h[i]``)."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(f"{b}.") for b, _ in blocks):
            prefix = f"{name}." if name else ""
            blocks.extend((f"{prefix}{child_name}", child) for child_name, child in module.named_children())
    return blocks


def _swap_low_rank(block: nn.Module) -> int:
    """Replace the block's :class:`LowRankLinear` s by :class:`CoLAMLinear` s that share their parameters."""
    swapped = 0
    for name, module in list(block.named_modules()):
        if type(module) is LowRankLinear:
            set_submodule(block, name, CoLAMLinear.from_low_rank(module))
        swapped += isinstance(module, LowRankLinear)
    return swapped


def checkpoint_(model: nn.Module, *, policy: str = "latent") -> list[str]:
    """Install block checkpointing on ``model`` in place; returns the names of the checkpointed blocks.

    Args:
        model: any model whose blocks sit in an ``nn.ModuleList``; for ``policy="latent"`` it must already hold
            low-rank layers (e.g. after ``convert_(model, CoLAConfig())``).
        policy: ``"latent"`` (CoLA-M, CoLA §4): save block inputs + the pre-activation latent of every low-rank
            layer, recompute the rest once in backward without re-running the down-projections. ``"layer"``:
            classic whole-layer checkpointing, save the block inputs only.

    Raises:
        ValueError: unknown policy, a model without blocks, ``"latent"`` without low-rank layers, or LaX layers
            (their cross-block latent stream cannot be recomputed block by block).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; allowed: {list(POLICIES)}")
    if any(hasattr(module, "crossing") for module in model.modules()):
        raise ValueError("checkpoint_ does not support LaX layers: their latents cross block boundaries")
    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of blocks to checkpoint")
    if policy == "latent":
        counts = [_swap_low_rank(block) for _, block in blocks]
        if not any(counts):
            raise ValueError("policy='latent' needs low-rank layers; run convert_ first or use policy='layer'")
    for _, block in blocks:
        block.__class__ = _checkpointed_class(type(block))
        block._tensorslim_policy = policy
    return [name for name, _ in blocks]


def uncheckpoint_(model: nn.Module) -> None:
    """Undo :func:`checkpoint_`: blocks get their original class back (the CoLA-M layers compute the same)."""
    for _, block in find_blocks(model):
        if getattr(type(block), "_tensorslim_original_forward", None) is not None:
            block.__class__ = type(block).__mro__[1]
            del block._tensorslim_policy


def finalize_cola_m(model: nn.Module, config: CoLAMConfig, report: ConversionReport) -> None:
    """``convert_``'s model-level step for :class:`CoLAMConfig`: CoLA's ``only_lr_act``, then :func:`checkpoint_`."""
    drop_glu_activation(model, config, report)
    checkpoint_(model, policy=config.policy)


def describe_cola_m(model: nn.Module, name: str, layer: CoLAMLinear) -> tuple[CoLAMConfig, dict[str, Any]]:
    """The config that rebuilds ``layer``, with the checkpoint policy of the block that holds it."""
    parts = name.split(".")
    owners = (model.get_submodule(".".join(parts[:i])) for i in range(len(parts) - 1, -1, -1))
    policy = next((m._tensorslim_policy for m in owners if hasattr(m, "_tensorslim_policy")), "latent")
    return CoLAMConfig(**low_rank_fields(model, name, layer), policy=policy), {}


register_transform(
    CoLAMConfig,
    Transform(
        is_dense_linear,
        plan_low_rank,
        CoLAMLinear.from_dense,
        finalize_cola_m,
        layer_type=CoLAMLinear,
        describe=describe_cola_m,
    ),
)
