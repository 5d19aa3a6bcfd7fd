"""The LLaMA block's elementwise work at the ``350m`` shape (256 tokens, 1024 wide, 16 heads of 64), forward +
backward: our RMSNorm against PyTorch's ``F.rms_norm`` and against a hand-written autograd Function, and our rotary
embedding against a half-split form with a hand-written backward (the rotation by ``-θ``).

fp32 is the plain train step. In bf16 the norm reads the fp32 residual stream and its output is cast to bf16, as the
first GEMM under autocast casts it; the rotary embedding reads and writes bf16, as under autocast. Each variant's time
is the median of ``--repeats`` calls, the variants alternating call by call in one process. Every variant's output
and gradients are checked against ours in fp32 first.

Usage:
    python benchmarks/llama_elementwise.py --threads 1 --timer thread \
        --out benchmarks/results/llama_elementwise_threads1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import table, write

from tensorslim.models.llama import apply_rotary, rotary_cos_sin

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
TOKENS, WIDTH, HEADS, EPS = 256, 1024, 16, 1e-6


def norm_ours(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``RMSNorm.forward`` of ``tensorslim/models/llama.py``."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def norm_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


class _NormFunction(torch.autograd.Function):
    """``y = w ⊙ x·r``, ``r = 1/√(mean x² + ε)``; backward ``dx = r (gw − x̂ mean(gw ⊙ x̂))``, ``dw = Σ g ⊙ x̂``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(EPS))  # (..., 1)
        ctx.save_for_backward(x, weight, r)
        return weight * (x * r)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight, r = ctx.saved_tensors
        normed = x * r
        grad_normed = grad * weight
        grad_x = r * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x, (grad * normed).flatten(0, -2).sum(0)


def norm_function(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return _NormFunction.apply(x, weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[..., :half].to(x.dtype), sin[..., :half].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class _RotaryFunction(torch.autograd.Function):
    """The rotation's transpose is the rotation by ``-θ``: the backward is the forward with ``-sin``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


def rotary_function(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _RotaryFunction.apply(x, cos, sin)


NORMS = {"norm ours": norm_ours, "norm F.rms_norm": norm_torch, "norm autograd Function": norm_function}
ROTARIES = {"rotary ours": apply_rotary, "rotary autograd Function": rotary_function}


def norm_call(fn, dtype: torch.dtype, inputs: tuple[torch.Tensor, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    x0, w0, g = inputs
    x, weight = x0.clone().requires_grad_(), w0.clone().requires_grad_()

    def call() -> tuple[torch.Tensor, ...]:
        x.grad = weight.grad = None
        y = fn(x, weight).to(dtype)  # the GEMM's input under autocast
        y.backward(g.to(dtype))
        return y.detach(), x.grad, weight.grad

    return call


def rotary_call(fn, dtype: torch.dtype, inputs: tuple[torch.Tensor, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    x0, cos, sin, g = inputs
    x = x0.to(dtype, copy=True).requires_grad_()  # a (B, T, H·hd) projection, seen as (B, H, T, hd) in the model

    def call() -> tuple[torch.Tensor, ...]:
        x.grad = None
        y = fn(x.view(1, TOKENS, HEADS, -1).transpose(1, 2), cos, sin)
        y.backward(g.to(dtype))
        return y.detach(), x.grad

    return call


def inputs(dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    norm = (
        torch.randn(1, TOKENS, WIDTH, generator=gen, dtype=dtype),
        1 + 0.1 * torch.randn(WIDTH, generator=gen, dtype=dtype),
        torch.randn(1, TOKENS, WIDTH, generator=gen, dtype=dtype),
    )
    cos, sin = rotary_cos_sin(TOKENS, WIDTH // HEADS, theta=1e4, device=torch.device("cpu"))
    rotary = (
        torch.randn(1, TOKENS, WIDTH, generator=gen, dtype=dtype),
        cos.to(dtype),
        sin.to(dtype),
        torch.randn(1, HEADS, TOKENS, WIDTH // HEADS, generator=gen, dtype=dtype),
    )
    return norm, rotary


def check_float32() -> None:
    """Every variant's output and gradients equal ours in fp32 (ours computes the norm in fp32 whatever the input)."""
    norm_in, rotary_in = inputs(torch.float32)
    for group, make, args in ((NORMS, norm_call, norm_in), (ROTARIES, rotary_call, rotary_in)):
        ref = make(next(iter(group.values())), torch.float32, args)()
        for name, fn in group.items():
            for a, b in zip(make(fn, torch.float32, args)(), ref, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    check_float32()
    clock = CLOCKS[args.timer]
    norm_in, rotary_in = inputs(torch.float32)
    rows = []
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        calls = {name: norm_call(fn, dtype, norm_in) for name, fn in NORMS.items()}
        calls |= {name: rotary_call(fn, dtype, rotary_in) for name, fn in ROTARIES.items()}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for i in range(args.warmup + args.repeats):
            for name, call in calls.items():
                start = clock()
                call()
                if i >= args.warmup:
                    times[name].append(clock() - start)
        rows += [{"dtype": dtype_name, "variant": n, "ms": 1e3 * statistics.median(t)} for n, t in times.items()]
    cells = []
    for row in rows:
        ours = next(
            r["ms"] for r in rows if (r["dtype"], r["variant"]) == (row["dtype"], f"{row['variant'].split()[0]} ours")
        )
        cells.append([row["dtype"], row["variant"], f"{row['ms']:.3f}", f"{ours / row['ms']:.2f}×"])
    lines = table(["precision", "variant", "forward + backward (ms)", "× ours"], cells)
    print("\n".join(lines))
    if args.out:
        note = (
            f"{args.timer} clock, {args.threads} thread(s), median of {args.repeats} calls after {args.warmup}, "
            "variants alternating; every variant equals ours in fp32 within 1e-5 (checked first)"
        )
        title = "LLaMA elementwise work at the 350m shape, forward + backward"
        write(Path(args.out), title, lines, data=rows, notes=[note])


if __name__ == "__main__":
    main()
