"""Tensor-parallel LLaMA blocks: BOOST's BTP, vanilla low-rank TP and Megatron full-rank TP.

Shapes use B (batch), T (tokens), d (model width), f (MLP width), r (rank), p (TP size), H (heads), hd (head size).
Parameters are created empty; :func:`tensorslim.distributed.parallelize.parallelize` fills them from the TP=1
weights through each block's :meth:`specs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tensorslim.distributed.comm import (
    TPGroup,
    column,
    column_parallel,
    copy_to_tp,
    reduce_from_tp,
    reduce_from_tp_async,
    reduce_latent,
)
from tensorslim.distributed.rmsnorm import online_finish, online_partial, rms_scale, sync_rmsnorm
from tensorslim.distributed.sharding import ShardSpec
from tensorslim.functional.lowrank import activation_fn
from tensorslim.models.llama import RMSNorm, apply_rotary


@dataclass(frozen=True, kw_only=True)
class BlockShape:
    d_model: int
    d_ff: int
    n_heads: int
    rank: int  # 0 for full-rank (Megatron)
    eps: float
    latent_act: str  # CoLA's σ inside every low-rank projection
    tp: int


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos, sin, *, heads: int) -> torch.Tensor:
    """Causal attention over ``heads`` heads: q/k/v ``(B, T, heads·hd)`` → ``(B, T, heads·hd)``."""
    batch, seq, width = q.shape

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, seq, heads, width // heads).transpose(1, 2)  # (B, h, T, hd)

    y = F.scaled_dot_product_attention(
        apply_rotary(split(q), cos, sin), apply_rotary(split(k), cos, sin), split(v), is_causal=True
    )
    return y.transpose(1, 2).reshape(batch, seq, width)


def _names(prefix: str, module: str, *projections: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{module}.{name}" for name in projections)


class BTPBlock(nn.Module):
    """BOOST's bottleneck-aware TP block (BOOST §3.1).

    A chunk runs from a column-parallel B to the next row-parallel A, so every collective sits on an r-wide latent:
    ``qkv`` (3r + 1 with the online-RMSNorm statistic), ``o`` (r), ``gate_up`` (2r + 1), ``down`` (r), each an
    all-reduce forward and backward. The residual stream stays sharded on d; attention runs on the local heads.

    With ``latent_recompute`` the four communication-free chunks between the collectives are recomputed in
    backward (BOOST §3.4, "communication-free low-rank activation checkpointing"): autograd keeps only the chunk
    inputs, i.e. the all-reduced latents and the two residual shards, and no collective runs twice.

    ``overlap`` (see :func:`tensorslim.distributed.parallelize.parallelize`): ``"backward"`` moves each latent's
    backward all-reduce into its B (:func:`column_parallel`, overlapped with B's weight gradient); ``"full"`` also
    all-reduces the q/k/v and gate/up branches apart and asynchronously in forward (:meth:`_branches`).
    """

    def __init__(
        self, shape: BlockShape, tp: TPGroup, *, index: int, norm: str, latent_recompute: bool, overlap: str = "none"
    ) -> None:
        super().__init__()
        self.shape, self.tp, self.index, self.norm = shape, tp, index, norm
        self.latent_recompute, self.overlap = latent_recompute, overlap
        # the per-branch split would keep d-wide B outputs for backward, which latent recomputation exists to avoid
        self.split = overlap == "full" and not latent_recompute
        self.act = activation_fn(shape.latent_act)
        self.mlp_act: nn.Module = nn.SiLU()
        d, f, r = shape.d_model // shape.tp, shape.d_ff // shape.tp, shape.rank
        self.norm1, self.norm2 = _param(d), _param(d)
        self.qkv_a, self.qkv_b = _param(3 * r, d), _param(3, d, r)  # grouped A (§3.3), batched B
        self.o_a, self.o_b = _param(r, d), _param(d, r)
        self.gate_up_a, self.gate_up_b = _param(2 * r, d), _param(2, f, r)
        self.down_a, self.down_b = _param(r, f), _param(d, r)

    @staticmethod
    def specs(prefix: str) -> dict[str, ShardSpec]:
        attn, mlp = "self_attn", "mlp"
        return {
            "norm1": ShardSpec(sources=(f"{prefix}input_layernorm.weight",), dim=0),
            "qkv_a": ShardSpec(
                sources=_names(prefix, attn, *(f"{x}_proj.weight_a" for x in "qkv")), grouping="cat", dim=1
            ),
            "qkv_b": ShardSpec(
                sources=_names(prefix, attn, *(f"{x}_proj.weight_b" for x in "qkv")), grouping="stack", dim=1
            ),
            "o_a": ShardSpec(sources=(f"{prefix}{attn}.o_proj.weight_a",), dim=1),
            "o_b": ShardSpec(sources=(f"{prefix}{attn}.o_proj.weight_b",), dim=0),
            "norm2": ShardSpec(sources=(f"{prefix}post_attention_layernorm.weight",), dim=0),
            "gate_up_a": ShardSpec(
                sources=_names(prefix, mlp, "gate_proj.weight_a", "up_proj.weight_a"), grouping="cat", dim=1
            ),
            "gate_up_b": ShardSpec(
                sources=_names(prefix, mlp, "gate_proj.weight_b", "up_proj.weight_b"), grouping="stack", dim=1
            ),
            "down_a": ShardSpec(sources=(f"{prefix}{mlp}.down_proj.weight_a",), dim=1),
            "down_b": ShardSpec(sources=(f"{prefix}{mlp}.down_proj.weight_b",), dim=0),
        }

    def _run(self, fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        if self.latent_recompute and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _normed_partial(self, x: torch.Tensor, gamma: torch.Tensor, weight_a: torch.Tensor, tag: str) -> torch.Tensor:
        """Partial ``RMSNorm(x) Aᵀ`` (+ the statistic for online norm) ready for the latent all-reduce."""
        if self.norm == "online":
            return online_partial(x, gamma, weight_a, eps=self.shape.eps)  # (B, T, k + 1)
        normed = sync_rmsnorm(x, gamma, self.tp, d_model=self.shape.d_model, eps=self.shape.eps, tag=f"{tag}.stat")
        return F.linear(normed, weight_a)  # (B, T, k)

    def _latent(self, summed: torch.Tensor) -> torch.Tensor:
        """σ of an all-reduced latent; online norm first divides by the global RMS."""
        if self.norm == "online":
            summed = online_finish(summed, d_model=self.shape.d_model, eps=self.shape.eps)
        return self.act(summed)

    def _reduce(self, partial: torch.Tensor, tag: str) -> torch.Tensor:
        """The latent's all-reduce: forward and backward (``overlap="none"``), or forward only when its consumer
        B all-reduces the gradient itself, overlapped with B's weight gradient (:func:`column_parallel`)."""
        if self.overlap == "none":
            return reduce_latent(partial, self.tp, tag=tag)
        return reduce_from_tp(partial, self.tp, tag=tag)

    def _b(self, latent: torch.Tensor, weight: torch.Tensor, tag: str) -> torch.Tensor:
        """Column-parallel B on a replicated latent (batched when ``weight`` is ``(c, n, r)``)."""
        if self.overlap == "none":
            return column(latent, weight)
        return column_parallel(latent, weight, self.tp, tag=tag)

    def _attention_chunk(self, summed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        latent = self._latent(summed)  # (B, T, 3r)
        batch, seq, _ = latent.shape
        q, k, v = self._b(latent.view(batch, seq, 3, -1), self.qkv_b, f"layers.{self.index}.qkv")  # 3 × (B, T, d/p)
        return self._attend(q, k, v, cos, sin)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos, sin) -> torch.Tensor:
        y = _attention(q, k, v, cos, sin, heads=self.shape.n_heads // self.shape.tp)  # local heads
        return F.linear(y, self.o_a)  # (B, T, r), partial over ranks

    def _o_chunk(self, summed: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self._b(self.act(summed), self.o_b, f"layers.{self.index}.o")  # (B, T, d/p)
        return h, self._normed_partial(h, self.norm2, self.gate_up_a, f"layers.{self.index}.gate_up")

    def _mlp_chunk(self, summed: torch.Tensor) -> torch.Tensor:
        latent = self._latent(summed)  # (B, T, 2r)
        batch, seq, _ = latent.shape
        gate, up = self._b(latent.view(batch, seq, 2, -1), self.gate_up_b, f"layers.{self.index}.gate_up")
        return self._down_partial(gate, up)

    def _down_partial(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.linear(self.mlp_act(gate) * up, self.down_a)  # (B, T, r), partial over ranks

    def _down_chunk(self, summed: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return h + self._b(self.act(summed), self.down_b, f"layers.{self.index}.down")  # (B, T, d/p)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x``: the local residual shard ``(B, T, d/p)`` → the next one."""
        if self.split:
            return self._forward_split(x, cos, sin)
        tag = f"layers.{self.index}"
        qkv = self._reduce(
            self._run(lambda t: self._normed_partial(t, self.norm1, self.qkv_a, f"{tag}.qkv"), x), f"{tag}.qkv"
        )
        o = self._reduce(self._run(lambda s: self._attention_chunk(s, cos, sin), qkv), f"{tag}.o")
        h, gate_up = self._run(self._o_chunk, o, x)
        gate_up = self._reduce(gate_up, f"{tag}.gate_up")
        down = self._reduce(self._run(self._mlp_chunk, gate_up), f"{tag}.down")
        return self._run(self._down_chunk, down, h)

    def _forward_split(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with the grouped q/k/v and gate/up latents all-reduced per branch, asynchronously."""
        tag = f"layers.{self.index}"
        q, k, v = self._branches(
            self._normed_partial(x, self.norm1, self.qkv_a, f"{tag}.qkv"), self.qkv_b, tag, ("q", "k", "v")
        )
        o = self._reduce(self._attend(q, k, v, cos, sin), f"{tag}.o")
        h, gate_up = self._o_chunk(o, x)
        gate, up = self._branches(gate_up, self.gate_up_b, tag, ("gate", "up"))
        return self._down_chunk(self._reduce(self._down_partial(gate, up), f"{tag}.down"), h)

    def _branches(
        self, partial: torch.Tensor, weight_b: torch.Tensor, tag: str, names: tuple[str, ...]
    ) -> list[torch.Tensor]:
        """The sibling branches of a grouped partial latent ``(B, T, c·r [+ 1])``, each all-reduced on its own and
        asynchronously; branch i's B runs as soon as its latent has arrived, while branches i+1… are in flight.
        Online norm's statistic travels with the first branch. Returns ``c`` tensors ``(B, T, n)``."""
        r, online = self.shape.rank, self.norm == "online"
        pieces = [partial[..., i * r : (i + 1) * r] for i in range(len(names))]  # (B, T, r) each
        if online:
            pieces[0] = torch.cat([pieces[0], partial[..., -1:]], dim=-1)  # (B, T, r + 1)
        flights = [
            reduce_from_tp_async(piece, self.tp, tag=f"{tag}.{n}") for piece, n in zip(pieces, names, strict=True)
        ]
        out, scale = [], None
        for i, flight in enumerate(flights):
            summed = flight.wait()
            if online and i == 0:  # the global RMS of every branch
                scale = rms_scale(summed[..., -1:], d_model=self.shape.d_model, eps=self.shape.eps)
                summed = summed[..., :-1]
            if online:
                summed = summed * scale
            out.append(self._b(self.act(summed), weight_b[i], f"{tag}.{names[i]}"))
        return out


class VanillaBlock(nn.Module):
    """Low-rank TP as a Megatron plan would apply it (BOOST §2.2, ``vanilla_cola_llama.py``): A column-parallel
    (split r), B row-parallel with an all-reduce of its full d- or f-wide output. The residual stream, norms and
    attention are replicated; forward sends 3d (q, k, v) + d (o) + 2f (gate, up) + d (down) per token."""

    def __init__(self, shape: BlockShape, tp: TPGroup, *, index: int) -> None:
        super().__init__()
        self.shape, self.tp, self.index = shape, tp, index
        self.act = activation_fn(shape.latent_act)
        self.mlp_act: nn.Module = nn.SiLU()
        d, f, r = shape.d_model, shape.d_ff, shape.rank // shape.tp
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps=shape.eps), RMSNorm(d, eps=shape.eps)
        self.factors = nn.ParameterDict()
        for name, d_in, d_out in (("q", d, d), ("k", d, d), ("v", d, d), ("o", d, d), ("gate", d, f), ("up", d, f)):
            self.factors[f"{name}_a"], self.factors[f"{name}_b"] = _param(r, d_in), _param(d_out, r)
        self.factors["down_a"], self.factors["down_b"] = _param(r, f), _param(d, r)

    @staticmethod
    def specs(prefix: str) -> dict[str, ShardSpec]:
        specs = {
            "input_layernorm.weight": ShardSpec(sources=(f"{prefix}input_layernorm.weight",)),
            "post_attention_layernorm.weight": ShardSpec(sources=(f"{prefix}post_attention_layernorm.weight",)),
        }
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            module = "self_attn" if name in "qkvo" else "mlp"
            source = f"{prefix}{module}.{name}_proj"
            specs[f"factors.{name}_a"] = ShardSpec(sources=(f"{source}.weight_a",), dim=0)
            specs[f"factors.{name}_b"] = ShardSpec(sources=(f"{source}.weight_b",), dim=1)
        return specs

    def _project(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Column-parallel A (local r/p latent), row-parallel B, all-reduce of the full output."""
        partial = F.linear(self.act(F.linear(x, self.factors[f"{name}_a"])), self.factors[f"{name}_b"])
        return reduce_from_tp(partial, self.tp, tag=f"layers.{self.index}.{name}")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tag = f"layers.{self.index}"
        n = copy_to_tp(self.input_layernorm(x), self.tp, tag=f"{tag}.qkv_in")  # (B, T, d) replicated
        q, k, v = (self._project(n, name) for name in "qkv")
        y = _attention(q, k, v, cos, sin, heads=self.shape.n_heads)  # replicated over all heads
        h = x + self._project(copy_to_tp(y, self.tp, tag=f"{tag}.o_in"), "o")
        n = copy_to_tp(self.post_attention_layernorm(h), self.tp, tag=f"{tag}.gate_up_in")
        m = self.mlp_act(self._project(n, "gate")) * self._project(n, "up")  # (B, T, f) replicated
        return h + self._project(copy_to_tp(m, self.tp, tag=f"{tag}.down_in"), "down")


class MegatronBlock(nn.Module):
    """Full-rank Megatron TP (Shoeybi et al., 2019, §3): q/k/v and gate/up column-parallel, o and down
    row-parallel; forward sends 2d per token (two all-reduces), backward 2d."""

    def __init__(self, shape: BlockShape, tp: TPGroup, *, index: int) -> None:
        super().__init__()
        self.shape, self.tp, self.index = shape, tp, index
        self.mlp_act: nn.Module = nn.SiLU()
        d, f, p = shape.d_model, shape.d_ff, shape.tp
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps=shape.eps), RMSNorm(d, eps=shape.eps)
        self.qkv, self.o = _param(3, d // p, d), _param(d, d // p)
        self.gate_up, self.down = _param(2, f // p, d), _param(d, f // p)

    @staticmethod
    def specs(prefix: str) -> dict[str, ShardSpec]:
        attn, mlp = f"{prefix}self_attn", f"{prefix}mlp"
        return {
            "input_layernorm.weight": ShardSpec(sources=(f"{prefix}input_layernorm.weight",)),
            "post_attention_layernorm.weight": ShardSpec(sources=(f"{prefix}post_attention_layernorm.weight",)),
            "qkv": ShardSpec(sources=tuple(f"{attn}.{x}_proj.weight" for x in "qkv"), grouping="stack", dim=1),
            "o": ShardSpec(sources=(f"{attn}.o_proj.weight",), dim=1),
            "gate_up": ShardSpec(sources=(f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"), grouping="stack", dim=1),
            "down": ShardSpec(sources=(f"{mlp}.down_proj.weight",), dim=1),
        }

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tag = f"layers.{self.index}"
        n = copy_to_tp(self.input_layernorm(x), self.tp, tag=f"{tag}.qkv_in")  # (B, T, d)
        q, k, v = F.linear(n, self.qkv.flatten(0, 1)).chunk(3, dim=-1)  # 3 × (B, T, d/p), local heads
        y = _attention(q, k, v, cos, sin, heads=self.shape.n_heads // self.shape.tp)
        h = x + reduce_from_tp(F.linear(y, self.o), self.tp, tag=f"{tag}.o")
        n = copy_to_tp(self.post_attention_layernorm(h), self.tp, tag=f"{tag}.gate_up_in")
        gate, up = F.linear(n, self.gate_up.flatten(0, 1)).chunk(2, dim=-1)  # 2 × (B, T, f/p)
        return h + reduce_from_tp(F.linear(self.mlp_act(gate) * up, self.down), self.tp, tag=f"{tag}.down")
