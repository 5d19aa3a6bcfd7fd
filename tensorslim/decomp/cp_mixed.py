"""Mixed-precision block SGD for the CP decomposition.

Reference: Z. Yang, J. Shan, Z. Zhang, "Hardware-Efficient Mixed-Precision CP Tensor Decomposition",
arXiv:2209.04003 (2022). The abstract fixes the structure: block SGD, two stages (SignSGD, then
mixed-precision SGD), low-precision arithmetic. The details below come from the first author's earlier MATLAB
code (``ziyangjoy/mix_mix_mix``, branch ``SGD``: ``SGD_epoch.m``, ``gradient_full_sto_fp_j.m``, ``chop.m``) and
are marked as our reconstruction where the paper's text was not available (see ``docs/tensor_methods.md``).

Objective: ``min ||X - [[U_1, ..., U_N]]||_F^2`` for a dense tensor ``X`` of shape ``(s_1, ..., s_N)``.

* Blocks: every epoch, each mode's indices are permuted at random and cut into ``n_blocks`` blocks (block
  fraction 1/n_blocks, 0.1 in the reference code). One epoch visits every tuple of blocks once.
* Step on a block tuple: for each mode j in turn (factor-by-factor "block" updates), the gradient of the
  sub-tensor loss on the sampled rows, ``G_j = 2 (M_T - M_X) V_j / p_j`` with ``V_j`` the Khatri-Rao product of
  the other modes' sampled rows and ``p_j`` the number of sub-tensor entries per row.
* Stage 1 (SignSGD): ``U_j[rows] -= lr_sign * sign(G_j)``. Stage 2 (SGD with clipped momentum, as
  ``SGD_epoch.m``): ``v = clip(lr * G_j + momentum * v, -1, 1)``, ``U_j[rows] -= v``.
* Precision: factors, momentum and gradients are *stored* in the chosen format; the sub-tensor, the Khatri-Rao
  product, the residual and the gradient are rounded to it (stochastic rounding, ``chop`` ``round=5``); matrix
  products accumulate in float32.

Tuples of blocks that share no block in any mode touch disjoint rows, so we run ``n_blocks`` of them at once
(a batched step). This is exactly a sequential visit in which those tuples are consecutive, so it changes the
visiting order only, not the algorithm.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tensorslim.decomp._lowprec import FloatFormat, ScaledBuffer, get_format, quantize_scaled

__all__ = ["CPMixedResult", "EpochLog", "cp_mixed_precision"]


@dataclass(frozen=True)
class EpochLog:
    """One line of the convergence log.

    Attributes:
        epoch: Epoch number, counting both stages from 1 (0 is the initial point).
        stage: ``"init"``, ``"sign"`` (stage 1) or ``"sgd"`` (stage 2).
        rel_error: ``||X - [[U]]||_F / ||X||_F`` with the stored (rounded) factors.
        lr: Step size used in the epoch.
        seconds: Wall-clock time since the start of the run.
    """

    epoch: int
    stage: str
    rel_error: float
    lr: float
    seconds: float


@dataclass
class CPMixedResult:
    """Output of :func:`cp_mixed_precision`, in tensorly's CP convention.

    ``weights, factors = result`` unpacks like a tensorly ``CPTensor``; ``result.cp_tensor`` is the plain
    ``(weights, factors)`` tuple accepted by ``tensorly.cp_to_tensor``.

    Attributes:
        weights: Column weights, shape ``(rank,)``.
        factors: Factor matrices with unit-norm columns, shapes ``(s_j, rank)``.
        log: Convergence log, one entry per epoch.
        memory: Bytes of the stored buffers: ``factors``, ``gradients`` (per-step gradient buffers),
            ``momentum`` and ``data`` (the rounded copy of the tensor), each in its storage format.
        precision: Name of the storage/compute format.
    """

    weights: torch.Tensor | np.ndarray
    factors: list[torch.Tensor] | list[np.ndarray]
    log: list[EpochLog]
    memory: dict[str, int]
    precision: str

    def __iter__(self) -> Iterator[object]:
        yield self.weights
        yield self.factors

    @property
    def cp_tensor(self) -> tuple[object, list[object]]:
        """``(weights, factors)`` for tensorly."""
        return self.weights, self.factors

    @property
    def rel_error(self) -> float:
        """Relative error after the last epoch."""
        return self.log[-1].rel_error

    def to_tensor(self) -> torch.Tensor:
        """Dense reconstruction ``sum_r w_r u_r^(1) o ... o u_r^(N)`` as a float32 torch tensor."""
        factors = [torch.as_tensor(f) for f in self.factors]
        return _reconstruct([factors[0] * torch.as_tensor(self.weights), *factors[1:]])


def cp_mixed_precision(
    tensor: torch.Tensor | np.ndarray,
    rank: int,
    *,
    precision: str = "fp16",
    sign_epochs: int = 5,
    epochs: int = 40,
    n_blocks: int = 10,
    lr_sign: float = 2e-2,
    lr: float = 0.05,
    momentum: float = 0.8,
    lr_decay: float = 0.5,
    decay_after: float = 0.5,
    stochastic_rounding: bool = True,
    master_factors: bool = False,
    compensated: bool = False,
    init: tuple[object, Sequence[object]] | None = None,
    tol: float = 0.0,
    random_state: int | None = 0,
) -> CPMixedResult:
    """Rank-``rank`` CP decomposition by two-stage mixed-precision block SGD (arXiv:2209.04003).

    The two stages and the low-precision block SGD are the paper's (abstract); the paper's section text was not
    available to us, so the update rules, block sampling and rounding follow the first author's MATLAB code
    (see the module docstring) and the defaults were tuned on our benchmark (``docs/tensor_methods.md``).

    The input is scaled to unit RMS and a random start is drawn so that the model has unit RMS too; the step
    sizes are therefore scale-free (our choice; the paper's settings were not available). Stage 2 multiplies
    the step size by ``lr_decay`` whenever an epoch increases the error (the rule of ``ADAM_epoch_unbiased_j.m``),
    but only after the first ``decay_after`` fraction of its epochs: earlier, the small increases that happen
    inside a "swamp" of slow CP progress would shrink the step and delay the escape (measured in the benchmark).

    Args:
        tensor: Dense tensor, shape ``(s_1, ..., s_N)`` with ``N >= 2``; NumPy or torch (CPU or GPU).
        rank: Number of rank-one terms, a positive integer.
        precision: Storage and multiply format: ``"fp32"``, ``"fp16"``, ``"bf16"`` or ``"fp8_e4m3"``.
        sign_epochs: Epochs of stage 1 (SignSGD).
        epochs: Epochs of stage 2 (mixed-precision SGD with clipped momentum).
        n_blocks: Blocks per mode (block fraction ``1 / n_blocks``); capped at the smallest mode size.
        lr_sign: Stage 1 step size.
        lr: Stage 2 initial step size.
        momentum: Stage 2 momentum (``eta`` in ``SGD_epoch.m``).
        lr_decay: Factor applied to ``lr`` when an epoch increases the error.
        decay_after: Fraction of the stage-2 epochs run at constant ``lr`` before decays may happen.
        stochastic_rounding: Round stochastically (the reference setting) or to nearest.
        master_factors: Keep float32 master factors and round a copy for every product (classic mixed
            precision; more accurate, but the factors then take fp32 memory). By default the factors are
            stored in ``precision`` themselves, which is what gives the memory saving.
        compensated: Kahan-compensated factor updates: a second buffer in ``precision`` carries the part of each
            update that rounding the factor to nearest lost (our addition, see ``docs/tensor_methods.md``).
            The products still read the stored low-precision factors. Not combinable with ``master_factors``.
        init: Optional starting point ``(weights, factors)`` in tensorly's convention; random otherwise.
        tol: Stop stage 2 early when the relative error changes by less than ``tol`` (relative) in an epoch.
        random_state: Seed for the block order, the start and the stochastic rounding.

    Returns:
        A :class:`CPMixedResult` with NumPy arrays for NumPy input and torch tensors otherwise.

    Raises:
        TypeError: If ``rank`` is not an integer or ``tensor`` is not an array.
        ValueError: For a non-positive rank, an unknown precision, a tensor of order < 2, non-finite values, or
            ``compensated`` together with ``master_factors``.
    """
    fmt = get_format(precision)
    _check_rank(rank)
    x, was_numpy = _as_float_tensor(tensor)
    _check_positive_int("n_blocks", n_blocks)
    if compensated and master_factors:
        raise ValueError("compensated=True needs master_factors=False (the master copy needs no compensation)")
    for name, value in (("sign_epochs", sign_epochs), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative integer")

    gen = torch.Generator(device=x.device)
    # Hash the seed: with a plain manual_seed(s) the random start would replay the stream of a user's
    # torch.Generator().manual_seed(s) -- i.e. start at the true factors of a tensor built from that seed.
    gen.manual_seed(int(np.random.SeedSequence(0 if random_state is None else int(random_state)).generate_state(1)[0]))
    rms = float(x.pow(2).mean().sqrt())
    x_scaled = x / rms  # unit RMS: the step sizes do not depend on the data scale
    state = _State.create(
        x_scaled,
        rank,
        fmt,
        init=init,
        rms=rms,
        stochastic=stochastic_rounding,
        master=master_factors,
        compensated=compensated,
        gen=gen,
    )

    start = time.perf_counter()
    log = [EpochLog(0, "init", state.rel_error(x_scaled), 0.0, 0.0)]
    blocks = min(n_blocks, *x.shape)
    for epoch in range(1, sign_epochs + 1):
        _run_epoch(state, blocks, stage="sign", lr=lr_sign, momentum=0.0)
        log.append(EpochLog(epoch, "sign", state.rel_error(x_scaled), lr_sign, time.perf_counter() - start))
    step = lr
    for epoch in range(sign_epochs + 1, sign_epochs + epochs + 1):
        _run_epoch(state, blocks, stage="sgd", lr=step, momentum=momentum)
        err = state.rel_error(x_scaled)
        log.append(EpochLog(epoch, "sgd", err, step, time.perf_counter() - start))
        if err > log[-2].rel_error and epoch - sign_epochs > decay_after * epochs:
            step *= lr_decay
        if tol > 0 and abs(log[-2].rel_error - err) <= tol * max(log[-2].rel_error, 1e-300):
            break
    weights, factors = state.normalized(rms)
    if was_numpy:
        weights, factors = weights.cpu().numpy(), [f.cpu().numpy() for f in factors]
    return CPMixedResult(weights, factors, log, state.memory(blocks), fmt.name)


# ------------------------------------------------------------------------------------------------ validation


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an integer, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def _check_rank(rank: object) -> None:
    _check_positive_int("rank", rank)


def _as_float_tensor(tensor: object) -> tuple[torch.Tensor, bool]:
    """float32 torch copy of the input plus whether it came from NumPy."""
    if isinstance(tensor, np.ndarray):
        x, was_numpy = torch.from_numpy(np.ascontiguousarray(tensor, dtype=np.float32)), True
    elif isinstance(tensor, torch.Tensor):
        x, was_numpy = tensor.detach().to(torch.float32), False
    else:
        raise TypeError(f"tensor must be a numpy.ndarray or torch.Tensor, got {type(tensor).__name__}")
    if x.ndim < 2:
        raise ValueError(f"tensor must have order >= 2, got shape {tuple(x.shape)}")
    if x.numel() == 0 or not bool(torch.isfinite(x).all()):
        raise ValueError("tensor must be non-empty with finite entries")
    if float(x.abs().max()) == 0.0:
        raise ValueError("tensor is identically zero; its CP decomposition is trivial")
    return x, was_numpy


# ------------------------------------------------------------------------------------------------ algebra


def _khatri_rao(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Row-wise Khatri-Rao product of batched factor rows ``(B, q_k, R)`` -> ``(B, prod q_k, R)``.

    The row index runs over the modes in the given order, last mode fastest (matches a C-order unfolding).
    """
    out = rows[0]
    for f in rows[1:]:
        out = (out[:, :, None, :] * f[:, None, :, :]).reshape(out.shape[0], -1, out.shape[-1])
    return out


def _reconstruct(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dense tensor from factors ``(s_j, R)`` (weights folded into the first)."""
    kr = _khatri_rao([f[None] for f in factors[1:]])[0]  # (prod_{j>0} s_j, R)
    return (factors[0] @ kr.T).reshape([f.shape[0] for f in factors])


# ------------------------------------------------------------------------------------------------ state


@dataclass
class _State:
    """Everything the epochs mutate: stored data, factors, momentum, format and RNG."""

    data: torch.Tensor  # (s_1, ..., s_N), float32 values representable in fmt
    data_dtype_bytes: int
    factors: list[ScaledBuffer]  # each (s_j, R)
    velocity: list[ScaledBuffer]  # each (s_j, R)
    fmt: FloatFormat
    stochastic: bool
    master: bool  # factors kept in float32, rounded to fmt on every read
    compensation: list[ScaledBuffer] | None  # Kahan terms of the factors, each (s_j, R), or None
    gen: torch.Generator

    @classmethod
    def create(
        cls,
        x: torch.Tensor,
        rank: int,
        fmt: FloatFormat,
        *,
        init: tuple[object, Sequence[object]] | None,
        rms: float,
        stochastic: bool,
        master: bool,
        compensated: bool,
        gen: torch.Generator,
    ) -> _State:
        start = _initial_factors(x, rank, init=init, rms=rms, gen=gen)
        # The tensor is stored once in the low format (round to nearest: a deterministic copy of the data).
        data = quantize_scaled(x, fmt, stochastic=False)
        factor_fmt = get_format("fp32") if master else fmt
        factors = [ScaledBuffer(f, factor_fmt, generator=gen) for f in start]
        velocity = [ScaledBuffer(torch.zeros_like(f), fmt, generator=gen) for f in start]
        compensation = None
        if compensated and not fmt.is_full:
            compensation = [ScaledBuffer(torch.zeros_like(f), fmt, generator=gen) for f in start]
        return cls(data, fmt.nbytes, factors, velocity, fmt, stochastic, master, compensation, gen)

    def read_factor(self, j: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows of factor j as the low-precision operand of the next products."""
        values = self.factors[j].read(rows)
        if self.compensation is not None:  # the running sum stored − compensation, rounded once per product
            return self.quantize(values - self.compensation[j].read(rows))
        return self.quantize(values) if self.master else values

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        return quantize_scaled(values, self.fmt, stochastic=self.stochastic, generator=self.gen)

    def rel_error(self, x: torch.Tensor) -> float:
        model = _reconstruct([f.dequantize() for f in self.factors])
        return float(torch.linalg.vector_norm(x - model) / torch.linalg.vector_norm(x))

    def normalized(self, rms: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Tensorly convention: unit-norm columns, norms (and the data scale) in the weights."""
        factors = [f.dequantize() for f in self.factors]
        norms = [torch.linalg.vector_norm(f, dim=0) for f in factors]
        weights = torch.stack(norms).prod(dim=0) * rms  # (R,)
        return weights, [f / torch.where(n > 0, n, 1.0) for f, n in zip(factors, norms, strict=True)]

    def memory(self, blocks: int) -> dict[str, int]:
        shapes = [f.data.shape for f in self.factors]
        # One gradient buffer per mode covering the rows of one batched step: blocks * ceil(s_j / blocks) rows.
        grad_rows = [blocks * math.ceil(s / blocks) for s, _ in shapes]
        scale_bytes = 0 if self.fmt.is_full else 4
        memory = {
            "factors": sum(f.nbytes for f in self.factors),
            "gradients": sum(r * shapes[0][1] * self.fmt.nbytes + scale_bytes for r in grad_rows),
            "momentum": sum(v.nbytes for v in self.velocity),
            "data": self.data.numel() * self.data_dtype_bytes,
        }
        if self.compensation is not None:
            memory["compensation"] = sum(c.nbytes for c in self.compensation)
        return memory


def _initial_factors(
    x: torch.Tensor, rank: int, *, init: tuple[object, Sequence[object]] | None, rms: float, gen: torch.Generator
) -> list[torch.Tensor]:
    """Random factors with unit-RMS model (entries ~ N(0, R^(-1/N))), or a user start rescaled to unit RMS data."""
    n = x.ndim
    if init is None:
        std = rank ** (-1.0 / (2 * n))
        return [torch.randn(s, rank, generator=gen, device=x.device) * std for s in x.shape]
    weights, factors = init
    factors = [torch.as_tensor(np.asarray(f) if not isinstance(f, torch.Tensor) else f).float() for f in factors]
    if len(factors) != n or any(f.shape != (s, rank) for f, s in zip(factors, x.shape, strict=False)):
        shapes = [tuple(f.shape) for f in factors]
        raise ValueError(f"init factors have shapes {shapes}; expected {[(s, rank) for s in x.shape]}")
    w = torch.ones(rank) if weights is None else torch.as_tensor(np.asarray(weights)).float().reshape(rank)
    # Spread weights / rms evenly over the modes so no factor is far out of range.
    per_mode = (w / rms).abs().pow(1.0 / n)
    sign = torch.sign(w / rms)
    out = [f.to(x.device) * per_mode.to(x.device) for f in factors]
    out[0] = out[0] * sign.to(x.device)
    return out


# ------------------------------------------------------------------------------------------------ epochs


def _block_partition(size: int, blocks: int, gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random permutation of ``range(size)`` cut into ``blocks`` near-equal blocks, padded to equal length.

    Returns:
        ``(index, mask)``, both ``(blocks, ceil(size / blocks))``; padded slots hold index 0 and mask False.
    """
    q = math.ceil(size / blocks)
    perm = torch.randperm(size, generator=gen, device=gen.device).to(device)
    index = torch.zeros(blocks * q, dtype=torch.long, device=device)
    mask = torch.zeros(blocks * q, dtype=torch.bool, device=device)
    # Block b gets positions b, b + blocks, ...: sizes then differ by at most one.
    slots = torch.arange(size, device=device)
    slot_pos = (slots % blocks) * q + slots // blocks
    index[slot_pos] = perm
    mask[slot_pos] = True
    return index.view(blocks, q), mask.view(blocks, q)


def _run_epoch(state: _State, blocks: int, *, stage: str, lr: float, momentum: float) -> None:
    """One pass over every tuple of blocks, ``blocks`` disjoint tuples per batched step."""
    n = state.data.ndim
    device = state.data.device
    parts = [_block_partition(s, blocks, state.gen, device) for s in state.data.shape]
    for which in _disjoint_block_tuples(blocks, n, state.gen):
        which = [w.to(device) for w in which]
        rows = [parts[j][0][which[j]] for j in range(n)]  # each (B, q_j)
        masks = [parts[j][1][which[j]] for j in range(n)]
        _step(state, rows, masks, stage=stage, lr=lr, momentum=momentum)


def _disjoint_block_tuples(blocks: int, n: int, gen: torch.Generator) -> Iterator[list[torch.Tensor]]:
    """All ``blocks^n`` block tuples, grouped into ``blocks^(n-1)`` steps of ``blocks`` mutually disjoint tuples.

    Step ``c = (c_2, ..., c_n)`` holds the tuples ``(b, b + c_2, ..., b + c_n) mod blocks`` for every b: no two
    share a block in any mode, and every tuple appears in exactly one step. Steps come in random order.

    Yields:
        ``n`` index tensors of shape ``(blocks,)``: the block of each mode for each tuple of the step.
    """
    shifts = list(itertools.product(range(blocks), repeat=n - 1))
    base = torch.arange(blocks)
    for t in torch.randperm(len(shifts), generator=gen, device=gen.device).tolist():
        yield [base, *[(base + c) % blocks for c in shifts[t]]]


def _gather(data: torch.Tensor, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sub-tensors ``data[rows_1[b], ..., rows_N[b]]`` for every batch b -> ``(B, q_1, ..., q_N)``."""
    n = len(rows)
    index = []
    for j, r in enumerate(rows):
        shape = [r.shape[0]] + [1] * n
        shape[1 + j] = r.shape[1]
        index.append(r.view(shape))
    return data[tuple(index)]


def _step(
    state: _State,
    rows: list[torch.Tensor],
    masks: list[torch.Tensor],
    *,
    stage: str,
    lr: float,
    momentum: float,
) -> None:
    """Factor-by-factor updates on one batch of disjoint block tuples."""
    n = len(rows)
    sub = _gather(state.data, rows)  # (B, q_1, ..., q_N)
    sub_mask = _gather_mask(masks)  # (B, q_1, ..., q_N) bool
    current = [state.read_factor(j, rows[j]) for j in range(n)]  # each (B, q_j, R)
    for j in range(n):
        grad = _mode_gradient(current, j, sub, sub_mask, state.quantize)  # (B, q_j, R)
        valid = masks[j]
        flat_rows = rows[j][valid]
        stored = state.factors[j].read(rows[j])  # master copy when master_factors, else == current[j]
        if stage == "sign":
            delta = -lr * torch.sign(grad)
        else:
            vel = (lr * grad + momentum * state.velocity[j].read(rows[j])).clamp(-1.0, 1.0)
            state.velocity[j].write(flat_rows, vel[valid])
            delta = -state.velocity[j].read(rows[j])
        if state.compensation is None:
            state.factors[j].write(flat_rows, (stored + delta)[valid])
        else:
            state.factors[j].add_compensated(flat_rows, delta[valid], state.compensation[j])
        current[j] = state.read_factor(j, rows[j])


def _mode_gradient(
    current: Sequence[torch.Tensor],
    j: int,
    sub: torch.Tensor,
    sub_mask: torch.Tensor,
    quantize: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Gradient of ``sum_rows ||mask (model - X)||^2_row / p_row`` w.r.t. the sampled rows of factor j.

    ``G_j = 2 (M_T - M_X) V_j / p_j`` (``gradient_full_sto_fp_j.m``), with the Khatri-Rao product ``V_j``, the
    residual and the result rounded by ``quantize`` and the two products accumulated in float32.

    Args:
        current: Sampled rows of every factor, each ``(B, q_k, R)``.
        j: Mode to differentiate.
        sub: Sub-tensors ``(B, q_1, ..., q_N)``; ``sub_mask`` marks the real (unpadded) entries.
        quantize: Rounding applied to each low-precision operand.

    Returns:
        ``(B, q_j, R)`` gradient.
    """
    b, q_j = sub.shape[0], sub.shape[1 + j]
    others = [current[k] for k in range(len(current)) if k != j]
    kr = quantize(_khatri_rao(others))  # (B, P, R), P = prod_{k != j} q_k
    x_unf = sub.movedim(1 + j, 1).reshape(b, q_j, -1)  # (B, q_j, P)
    m_unf = sub_mask.movedim(1 + j, 1).reshape(b, q_j, -1)
    model = current[j] @ kr.transpose(1, 2)  # (B, q_j, P), float32 accumulation
    resid = quantize(torch.where(m_unf, model - x_unf, 0.0))
    per_row = m_unf.sum(-1, keepdim=True).clamp(min=1)  # p_j: sampled entries per row, (B, q_j, 1)
    return quantize(2.0 * (resid @ kr) / per_row)


def _gather_mask(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Outer product of per-mode row masks ``(B, q_j)`` -> ``(B, q_1, ..., q_N)``."""
    n = len(masks)
    out = None
    for j, m in enumerate(masks):
        shape = [m.shape[0]] + [1] * n
        shape[1 + j] = m.shape[1]
        out = m.view(shape) if out is None else out & m.view(shape)
    return out
