"""``parallelize(model, mesh, style)``: shard a built LLaMA for tensor parallelism, from outside the model.

Styles (BOOST, Wang et al., 2025, arXiv 2512.12131):

- ``btp``: BOOST's bottleneck-aware TP (§3.1) for low-rank (CoLA/SVD) models: A row-parallel with an all-reduce on
  the r-wide latent, B column-parallel without communication, residual stream sharded on d, local heads, online
  RMSNorm (§3.2), grouped A / batched B (§3.3), optional communication-free latent recomputation (§3.4), one
  all-gather after the last layer, vocabulary-parallel head and cross-entropy.
- ``vanilla``: low-rank TP with Megatron's column/row plan applied per factor (A column, B row), the §2.2 baseline.
- ``megatron``: full-rank TP for dense models (Shoeybi et al., 2019).

The TP model is a new module; the single-process model is only read. Every rank must hold the same TP=1 weights
(same seed, or loaded from one checkpoint): each local parameter is sliced from them (§4 of the paper's setup).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils.checkpoint import checkpoint

from tensorslim.distributed.blocks import BlockShape, BTPBlock, MegatronBlock, VanillaBlock
from tensorslim.distributed.comm import TPGroup, copy_to_tp, gather_last, gather_untracked
from tensorslim.distributed.fsdp import shard_blocks
from tensorslim.distributed.head import vocab_parallel_cross_entropy
from tensorslim.distributed.sharding import ShardSpec, full_tensors, local_shard
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM, RMSNorm, rotary_cos_sin

STYLES = ("btp", "vanilla", "megatron")
NORMS = ("online", "sync")
RECOMPUTE = ("none", "latent", "layer")
OVERLAPS = ("none", "backward", "full")
DEFAULT_OVERLAP = "none"
_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_PROJECTIONS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """What the model looks like, read once before anything is allocated."""

    config: LlamaConfig
    rank: int  # 0: dense projections
    latent_act: str


def build_mesh(tp: int, *, world_size: int, device_type: str = "cpu") -> DeviceMesh:
    """A ``(dp, tp)`` mesh over an initialized process group; TP ranks are adjacent (same host first).

    Raises:
        ValueError: ``tp`` is not a positive divisor of ``world_size``.
    """
    check_world(tp, world_size=world_size)
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def check_world(tp: int, *, world_size: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp!r} must be a positive divisor of the world size {world_size}")


def _inspect(model: nn.Module, style: str) -> _Plan:
    """Read rank and activation from the model; raise ValueError if ``style`` cannot shard it."""
    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"parallelize() takes a LlamaForCausalLM, got {type(model).__name__}")
    layers = [block.get_submodule(name) for block in model.layers for name in _PROJECTIONS]
    if style == "megatron":
        if not all(type(layer) is nn.Linear and layer.bias is None for layer in layers):
            raise ValueError(
                "style='megatron' needs a dense model (method 'dense'); use 'btp' or 'vanilla' for low rank"
            )
        return _Plan(config=model.config, rank=0, latent_act="identity")
    if not all(type(layer) is LowRankLinear and layer.bias is None for layer in layers):
        raise ValueError(
            f"style={style!r} needs every projection as a bias-free LowRankLinear (method 'cola' or 'svd')"
        )
    ranks, acts = {layer.rank for layer in layers}, {layer.activation for layer in layers}
    if len(ranks) != 1 or len(acts) != 1:
        raise ValueError(f"style={style!r} needs one rank and one activation for all projections, got {ranks}, {acts}")
    return _Plan(config=model.config, rank=ranks.pop(), latent_act=acts.pop())


def check_divisibility(config: LlamaConfig, *, tp: int, style: str, rank: int) -> None:
    """Raise ValueError unless ``tp`` splits everything ``style`` splits."""
    sizes = {"n_heads": config.n_heads, "d_model": config.d_model, "d_ff": config.d_ff}
    sizes["vocab_size"] = config.vocab_size
    if style == "vanilla":
        sizes["rank"] = rank  # vanilla splits r; BTP never does (§3.1)
    for name, value in sizes.items():
        if value % tp:
            raise ValueError(f"tp={tp} does not divide {name}={value}; allowed tp: divisors of {name}")


class TPCausalLM(nn.Module):
    """The tensor-parallel model of one rank: token ids ``(B, T)`` → local logits ``(B, T, V/p)``.

    ``specs`` maps each local parameter name to its :class:`ShardSpec` in the TP=1 state dict.
    """

    def __init__(
        self, config: LlamaConfig, blocks: list[nn.Module], tp: TPGroup, *, style: str, recompute_layers: bool = False
    ) -> None:
        super().__init__()
        self.config, self.tp, self.style, self.recompute_layers = config, tp, style, recompute_layers
        width = config.d_model // tp.size if style == "btp" else config.d_model  # BTP shards embeddings on d
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, width))
        self.layers = nn.ModuleList(blocks)
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Parameter(torch.empty(config.vocab_size // tp.size, config.d_model))
        self.specs: dict[str, ShardSpec] = {
            "embed_tokens": ShardSpec(sources=("embed_tokens.weight",), dim=1 if style == "btp" else None),
            "norm.weight": ShardSpec(sources=("norm.weight",)),
            "lm_head": ShardSpec(sources=("lm_head.weight",), dim=0),
        }
        for i, block in enumerate(blocks):
            self.specs.update({f"layers.{i}.{k}": v for k, v in type(block).specs(f"layers.{i}.").items()})

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        cos, sin = rotary_cos_sin(seq, self.config.head_dim, theta=self.config.rope_theta, device=input_ids.device)
        x = F.embedding(input_ids, self.embed_tokens)  # (B, T, d/p) for btp, (B, T, d) otherwise
        for block in self.layers:
            if self.recompute_layers and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, use_reentrant=False)  # re-runs the block's collectives too
            else:
                x = block(x, cos, sin)
        if self.style == "btp":
            x = gather_last(x, self.tp, tag="head.gather")  # the only d-wide collective of BTP
        x = copy_to_tp(self.norm(x), self.tp, tag="head.in")
        return F.linear(x, self.lm_head)  # (B, T, V/p)

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy, as ``tensorslim.train.trainer.causal_lm_loss`` on one process."""
        return self.loss_from_logits(self(input_ids), input_ids)

    def loss_from_logits(self, logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """The loss of local logits ``(B, T, V/p)`` (for a wrapper such as DDP that owns the forward call)."""
        return vocab_parallel_cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), self.tp, tag="head.ce"
        )

    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """All ``V`` logits (gathered; for evaluation and tests)."""
        return gather_untracked(self(input_ids), self.tp, dim=-1)

    def local_tensors(self, *, grads: bool = False) -> dict[str, torch.Tensor]:
        """Local parameters (or their gradients, zeros where none) by name."""
        if not grads:
            return {name: p.detach() for name, p in self.named_parameters()}
        return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in self.named_parameters()}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The TP=1 state dict (a collective over the TP group)."""
        return full_tensors(self.local_tensors(), self.specs, self.tp)

    @torch.no_grad()
    def load_full_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        """Copy this rank's slices of a TP=1 state dict into the local parameters."""
        for name, param in self.named_parameters():
            param.copy_(local_shard(full, self.specs[name], rank=self.tp.rank, size=self.tp.size))


def tp_group(mesh: DeviceMesh | None) -> TPGroup:
    """The ``tp`` axis of ``mesh`` (or its only axis); None means a single process."""
    if mesh is None:
        return TPGroup.single()
    sub = mesh["tp"] if mesh.mesh_dim_names and "tp" in mesh.mesh_dim_names else mesh
    return TPGroup(group=sub.get_group(), rank=sub.get_local_rank(), size=sub.size())


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh | None,
    style: str,
    *,
    norm: str = "online",
    recompute: str = "none",
    dp_shard: bool = False,
    precision: str = "fp32",
    overlap: str = DEFAULT_OVERLAP,
) -> TPCausalLM:
    """Shard ``model`` over the ``tp`` axis of ``mesh`` in ``style`` (and, with ``dp_shard``, over its ``dp`` axis
    with FSDP2); ``model`` is left untouched.

    Args:
        model: a built ``LlamaForCausalLM``: converted to CoLA/SVD for ``btp``/``vanilla``, dense for ``megatron``.
        mesh: a 1-D mesh, or a mesh with a ``tp`` axis (see :func:`build_mesh`); None for one process.
        style: ``"btp"``, ``"vanilla"`` or ``"megatron"``.
        norm: BTP only: ``"online"`` (BOOST §3.2) or ``"sync"`` (the synchronized reference).
        recompute: activation recomputation in backward. ``"latent"`` (BTP only, BOOST §3.4): keep the
            all-reduced latents and residual shards, recompute the communication-free chunks between them.
            ``"layer"``: classic whole-block recomputation, which re-runs the block's forward collectives.
        dp_shard: then ``fully_shard`` every block and the root over ``mesh["dp"]`` (torchtitan's order: TP, then
            FSDP2; :func:`tensorslim.distributed.fsdp.shard_blocks`), its all-gathers and reduce-scatters logged in
            the model's communication log.
        precision: FSDP2's mixed-precision policy, ``fp32`` or ``bf16`` (:func:`tensorslim.distributed.fsdp.
            mixed_precision`).
        overlap: BTP only: how the latent all-reduces overlap computation. ``"none"``: each one blocks, forward and
            backward. ``"backward"``: the backward all-reduce of a latent's gradient runs while its B's weight
            gradient is computed. ``"full"``: that, and the grouped q/k/v and gate/up latents are all-reduced per
            branch asynchronously in forward, each branch's B computed while its siblings are in flight (not with
            ``recompute="latent"``, whose chunks keep the grouped latents: there it acts as ``"backward"``).

    Raises:
        ValueError: an unknown style or norm, a model the style cannot shard, or a TP size that does not divide
            the heads, d, d_ff, the vocabulary or (vanilla) the rank. Raised before anything is allocated.
    """
    if style not in STYLES:
        raise ValueError(f"style={style!r} is unknown; allowed: {list(STYLES)}")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is unknown; allowed: {list(NORMS)}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} is unknown; allowed: {list(RECOMPUTE)}")
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: {list(OVERLAPS)}")
    if style != "btp" and (norm != "online" or recompute == "latent"):
        raise ValueError(f"norm and recompute='latent' apply to style='btp' only, got style={style!r}")
    if recompute == "latent" and norm != "online":
        raise ValueError("recompute='latent' needs norm='online' (sync norm has a collective inside a chunk)")
    if dp_shard and (mesh is None or "dp" not in (mesh.mesh_dim_names or ())):
        raise ValueError("dp_shard=True needs a (dp, tp) mesh from build_mesh()")
    plan = _inspect(model, style)
    tp = tp_group(mesh)
    check_divisibility(plan.config, tp=tp.size, style=style, rank=plan.rank)
    config = plan.config
    shape = BlockShape(
        d_model=config.d_model,
        d_ff=config.d_ff,
        n_heads=config.n_heads,
        rank=plan.rank,
        eps=config.norm_eps,
        latent_act=plan.latent_act,
        tp=tp.size,
    )
    blocks: list[nn.Module] = []
    for i, source in enumerate(model.layers):
        if style == "btp":
            block: nn.Module = BTPBlock(
                shape, tp, index=i, norm=norm, latent_recompute=recompute == "latent", overlap=overlap
            )
        else:
            block = (VanillaBlock if style == "vanilla" else MegatronBlock)(shape, tp, index=i)
        block.mlp_act = source.mlp.act_fn  # SiLU, or Identity under CoLA's only_lr_act
        blocks.append(block)
    tp_model = TPCausalLM(config, blocks, tp, style=style, recompute_layers=recompute == "layer")
    device = next(model.parameters()).device
    tp_model.to(device)
    tp_model.load_full_state_dict(dict(model.state_dict()))
    if dp_shard:
        shard_blocks(tp_model, mesh["dp"], blocks=tp_model.layers, precision=precision, log=tp.log)
    return tp_model
