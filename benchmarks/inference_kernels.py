"""One weight-only quantized linear layer at decode shapes: which CPU kernel multiplies fastest, and how exactly.

For each weight shape ``(N, K)`` (default: the matrices of the ``350m`` LLaMA: attention ``1024×1024``, MLP
``2736×1024`` and ``1024×2736``, output head ``32000×1024``) and each batch of ``M`` rows, the arms multiply the same
activations by the same weight:

* ``dense-fp32`` / ``dense-bf16``: ``F.linear`` with the float weight (the reference speed);
* ``int8pack-fp32`` / ``int8pack-bf16``: ``torch.ops.aten._weight_int8pack_mm`` (int8 weight, one scale per row)
  with fp32 or bf16 activations;
* ``int4pack-bf16``: ``_weight_int4pack_mm_for_cpu`` (after ``_convert_weight_to_int4pack_for_cpu``, groups of 128);
* ``fbgemm-dynamic``: ``torch.ops.quantized.linear_dynamic`` (fbgemm: int8 weight with per-row scale and zero
  point, activations quantized to uint8 per tensor on the fly, int32 accumulation);
* ``tensorslim-w8`` / ``tensorslim-w4``: :class:`tensorslim.quant.QuantLinear` as a model runs it (its default W8
  and W4 kernels, with its own padding, scale tables and zero-point terms);
* ``torchao-int8wo``: torchao's ``Int8WeightOnlyConfig`` in eager mode, when torchao is importable.

The weight is rounded to nearest on the per-row min/max grid that ``RTNConfig`` uses (8 bits; 4 bits for the int4
arms), and each arm's output is compared with ``x Ŵᵀ`` for its own dequantized ``Ŵ`` in fp64: the error column is
``max |y − y_ref| / max |y_ref|``. Arms alternate within each repeat so that a shared machine's noise hits them alike;
each timing is the mean of ``--calls`` calls, and the table holds the median over ``--repeats``.

Usage:
    python benchmarks/inference_kernels.py --out benchmarks/results/inference_kernels_2026-12-04
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

from tensorslim.quant import QuantLinear, kernels
from tensorslim.quant.quantizer import dequantize, minmax_grid, quantize_codes
from tensorslim.quant.rtn import RTNConfig, rtn_quantize

SHAPES_350M = "1024x1024,2736x1024,1024x2736,32000x1024"


def _fbgemm_arm(weight: torch.Tensor, bits: int) -> tuple[Callable, torch.Tensor]:
    """fbgemm's dynamic int8 linear on the per-row grid (codes − 128 as int8 with zero point ``z − 128``)."""
    grid = minmax_grid(weight.double(), bits=bits)
    codes = quantize_codes(weight.double(), grid)
    scale, zero = grid.scale.reshape(-1), grid.zero.reshape(-1).long()
    qweight = torch.quantize_per_channel(
        dequantize(codes, grid, dtype=torch.float32), scale.double(), zero - 128, 0, torch.qint8
    )
    packed = torch.ops.quantized.linear_prepack(qweight, None)
    reference = dequantize(codes, grid, dtype=torch.float64)
    return (lambda x: torch.ops.quantized.linear_dynamic(x, packed, False)), reference


def _torchao_arm(weight: torch.Tensor) -> tuple[Callable, torch.Tensor] | None:
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data.copy_(weight)
    quantize_(layer, Int8WeightOnlyConfig())
    reference = layer.weight.dequantize().double()
    return (lambda x: layer(x)), reference


def arms(weight: torch.Tensor) -> dict[str, tuple[Callable, torch.Tensor]]:
    """Each arm's function of fp32 activations and the fp64 weight it multiplies by."""
    n, k = weight.shape
    found: dict[str, tuple[Callable, torch.Tensor]] = {}
    bf16 = weight.bfloat16()
    found["dense-fp32"] = (lambda x: F.linear(x, weight), weight.double())
    found["dense-bf16"] = (lambda x: F.linear(x.bfloat16(), bf16), bf16.double())
    # a symmetric per-row int8 weight: what _weight_int8pack_mm takes (one scale per row, no zero point)
    scale = weight.abs().amax(dim=1) / 127
    int8 = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    sym = int8.double() * scale.double()[:, None]
    found["int8pack-fp32"] = (lambda x: torch.ops.aten._weight_int8pack_mm(x, int8, scale), sym)
    scale_bf16 = scale.bfloat16()
    found["int8pack-bf16"] = (
        lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), int8, scale_bf16),
        int8.double() * scale_bf16.double()[:, None],
    )
    found["fbgemm-dynamic"] = _fbgemm_arm(weight, 8)
    for bits in (8, 4):
        result = rtn_quantize(weight, None, RTNConfig(bits=bits))
        layer = QuantLinear.from_result(result, bias=None).eval()
        found[f"tensorslim-w{bits}"] = (layer, dequantize(result.codes, result.grid, dtype=torch.float64))
    # the int4 kernel alone, on the operands QuantLinear builds (the blocked layout, the per-group (s, m) table)
    operands = found["tensorslim-w4"][0]._kernel_operands(torch.bfloat16)
    if operands.weight.shape == (n, k // 2):  # no padding: the kernel's shape is the layer's
        found["int4pack-bf16"] = (
            lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.bfloat16(), operands.weight, kernels.int4_group(k), operands.table
            ),
            found["tensorslim-w4"][1],
        )
    torchao = _torchao_arm(weight)
    if torchao is not None:
        found["torchao-int8wo"] = torchao
    return found


# wall: what a user sees; cpu: this process's CPU time, which a shared machine disturbs less (with --threads 1, the
# single core's time)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_arms(
    funcs: dict[str, Callable], x: torch.Tensor, *, calls: int, repeats: int, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Milliseconds per call of each arm, ``repeats`` samples, arms alternating."""
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for repeat in range(repeats + 1):  # the first round warms up
        for name, func in funcs.items():
            start = clock()
            for _ in range(calls):
                func(x)
            if repeat:
                times[name].append((clock() - start) / calls * 1e3)
    return times


@torch.no_grad()
def measure(shape: tuple[int, int], m: int, *, calls: int, repeats: int, clock: Callable[[], float]) -> list[dict]:
    torch.manual_seed(0)
    n, k = shape
    weight = torch.randn(n, k) * 0.02
    x = torch.randn(m, k)
    found = arms(weight)
    times = time_arms({name: func for name, (func, _) in found.items()}, x, calls=calls, repeats=repeats, clock=clock)
    rows = []
    dense = statistics.median(times["dense-fp32"])
    for name, (func, reference) in found.items():
        expected = x.double() @ reference.T
        error = (func(x).double() - expected).abs().max() / expected.abs().max()
        median = statistics.median(times[name])
        rows.append(
            {
                "shape": f"{n}x{k}",
                "m": m,
                "arm": name,
                "ms": times[name],
                "median_ms": median,
                "vs_dense": dense / median,
                "rel_error": error.item(),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES_350M, help="comma-separated NxK weight shapes")
    parser.add_argument("--rows", default="1,8", help="comma-separated activation rows M")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timer", default="wall", choices=sorted(CLOCKS), help="wall clock or process CPU time")
    parser.add_argument("--out", default=None, help="output stem for .md/.json")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    rows = [
        row
        for shape in shapes
        for m in (int(v) for v in args.rows.split(","))
        for row in measure(shape, m, calls=args.calls, repeats=args.repeats, clock=CLOCKS[args.timer])
    ]
    lines = table(
        ["shape N×K", "M", "arm", "ms min / median / max", "× dense fp32", "max error / max |y|"],
        [
            [
                r["shape"],
                r["m"],
                r["arm"],
                f"{min(r['ms']):.3f} / **{r['median_ms']:.3f}** / {max(r['ms']):.3f}",
                f"{r['vs_dense']:.2f}×",
                f"{r['rel_error']:.1e}",
            ]
            for r in rows
        ],
    )
    print("\n".join(lines))
    if args.out:
        notes = [f"timer: {args.timer}; {args.calls} calls a sample, median of {args.repeats}, arms alternating"]
        write(Path(args.out), "Weight-only quantized linear kernels at decode shapes", lines, data=rows, notes=notes)


if __name__ == "__main__":
    main()
