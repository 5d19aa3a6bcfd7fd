"""A/B of KV-cache decoding in one process: the cache before the sixth round (``torch.cat`` of the whole cache per
token and layer, a causal mask built per layer even for one new token, rotary tables for every position) against now
(buffers with spare capacity, no mask for one token, tables for the new positions only).

For each method the model prefills one random prompt and decodes ``--new-tokens`` tokens greedily, the two variants
in turn, ``--repeats`` times after ``--warmup``; both must produce the same tokens. Wall clock at torch's thread count.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_ab.py --preset 350m --methods dense,cola --repeats 5 \
        --out benchmarks/results/decode_ab_350m
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

import tensorslim.models.llama as llama
from tensorslim.bench.harness import machine_description
from tensorslim.methods import build_for_method


class _CatKV(llama.LayerKV):
    """The cache before: every append concatenates the whole cache with the new tokens."""

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._keys is not None:
            keys, values = torch.cat([self._keys, keys], dim=2), torch.cat([self._values, values], dim=2)
        self._keys, self._values, self.length = keys, values, keys.shape[2]
        return keys, values


def _attention_before(self, x, cos, sin, kv=None):  # the forward before: a mask for every cached call
    batch, seq, d = x.shape

    def heads(t):
        return t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)

    q, k, v = llama.linear_many(x, (self.q_proj, self.k_proj, self.v_proj))
    q, k, v = llama.apply_rotary(heads(q), cos, sin), llama.apply_rotary(heads(k), cos, sin), heads(v)
    mask = llama.causal_mask(seq, kv.length, device=x.device)
    y = F.scaled_dot_product_attention(q, *kv.append(k, v), attn_mask=mask)
    return self.o_proj(y.transpose(1, 2).reshape(batch, seq, d))


def _rotary_before(seq_len, head_dim, *, theta, device, start=0):  # tables for every position, then sliced
    cos, sin = ROTARY_NOW(seq_len, head_dim, theta=theta, device=device)
    return cos[start:], sin[start:]


ROTARY_NOW = llama.rotary_cos_sin


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    forward, rotary = llama.Attention.forward, llama.rotary_cos_sin
    if name == "before":
        llama.Attention.forward, llama.rotary_cos_sin = _attention_before, _rotary_before
    try:
        yield
    finally:
        llama.Attention.forward, llama.rotary_cos_sin = forward, rotary


@torch.no_grad()
def decode(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, name: str) -> tuple[float, list[int]]:
    """Seconds of ``new_tokens`` greedy decode steps after the prefill, and the tokens."""
    with variant(name):
        cache = model.new_cache()
        if name == "before":
            cache.layers = [_CatKV() for _ in cache.layers]
        token = model(prompt, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = []
        start = time.perf_counter()
        for _ in range(new_tokens):
            token = model(token, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)
            tokens.append(token[0, 0].item())
        return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--methods", default="dense,cola")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    max_seq_len = args.prompt_len + args.new_tokens
    models = {}
    for method in args.methods.split(","):
        torch.manual_seed(0)
        models[method] = build_for_method(args.preset, method, max_seq_len=max_seq_len)[0].eval()
    vocab = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(vocab, (args.batch_size, args.prompt_len), generator=torch.Generator().manual_seed(0))
    names = [f"{m} {v}" for m in models for v in ("before", "now")]
    times: dict[str, list[float]] = {name: [] for name in names}
    tokens: dict[str, list[int]] = {}
    for repeat in range(args.warmup + args.repeats):
        for name in names:
            method, kind = name.split(" ")
            seconds, tokens[name] = decode(models[method], prompt, args.new_tokens, kind)
            if repeat >= args.warmup:
                times[name].append(seconds)
    for method in models:
        assert tokens[f"{method} before"] == tokens[f"{method} now"], f"{method}: the variants decoded differently"
    tps = {name: args.batch_size * args.new_tokens / statistics.median(t) for name, t in times.items()}
    lines = ["| decode | tokens/s (median) | ms/token min / median / max | × own before |", "|---|---|---|---|"]
    for name, t in times.items():
        per = [1e3 * s / args.new_tokens for s in t]
        own = tps[name] / tps[f"{name.split(' ')[0]} before"]
        lines.append(
            f"| {name} | {tps[name]:.2f} | {min(per):.1f} / {statistics.median(per):.1f} / {max(per):.1f} "
            f"| {own:.3f}× |"
        )
    ratios = [
        f"- {m} × dense, {v}: {tps[f'{m} {v}'] / tps[f'dense {v}']:.3f}×"
        for m in models
        if m != "dense"
        for v in ("before", "now")
        if "dense" in models
    ]
    table = "\n".join(lines) + "\n\n" + "\n".join(ratios) + "\n"
    print(table)
    if args.out:
        command = "OMP_WAIT_POLICY=PASSIVE python " + " ".join(sys.argv)
        loads = f"{' '.join(f'{x:.1f}' for x in load_before)} → {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        Path(args.out).with_suffix(".md").write_text(
            f"# Decode A/B, KV cache before vs now ({args.preset}, batch {args.batch_size}, prompt {args.prompt_len}, "
            f"{args.new_tokens} new tokens)\n\n- command: `{command}`\n"
            f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n- wall clock, "
            f"{torch.get_num_threads()} threads; load average (1/5/15 min) {loads}; a shared machine: ratios side by "
            f"side in one run are what count\n- both variants decoded the same tokens\n\n{table}"
        )
        result = {"command": command, "args": vars(args), "machine": machine_description(), "times_s": times}
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
