"""Code that runs inside the spawned gloo processes of the distributed tests (importable by ``spawn``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TINY = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 172, "vocab_size": 256}
RANK = 16
LR = 3e-3


@contextlib.contextmanager
def hosted_group(*, timeout_s: float = 600) -> Iterator[dict[str, str]]:
    """The environment of processes that form one process group through a store this process hosts.

    The store listens on a port the kernel picks as it binds (port 0) and holds it until the block ends, so no other
    process can take the port between its choice and its use. (A port found free, closed and handed to a child that
    binds it later can be taken in between: the group then fails to form, or its ranks talk to a stranger.) The
    children join it as torchrun's workers join their agent's store (``TORCHELASTIC_USE_AGENT_STORE``): every rank is
    a client, none binds a port of its own for the rendezvous; gloo's connections use ports the kernel picks.
    """
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    # the store, and so its port, lives until the block ends (the generator's frame holds it)
    yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def init(rank: int, world: int, group: dict[str, str], *, timeout_s: float = 600) -> None:
    """Join a gloo group of ``world`` through the store of :func:`hosted_group` (its environment: ``group``);
    ``timeout_s`` only bounds a hang (a loaded machine can start a rank minutes after its peers)."""
    os.environ.update(group)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def tiny_model(style: str, *, seed: int = 0):
    from tensorslim.convert import convert_
    from tensorslim.layers.lowrank import CoLAConfig
    from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    if style != "megatron":
        convert_(model, CoLAConfig(rank=RANK, init="random"))
    return model


def batches(steps: int, *, batch: int = 4, seq: int = 16) -> list[torch.Tensor]:
    """Learnable sequences (random start and stride, mod V), so the loss falls smoothly instead of wandering."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        start, stride = (torch.randint(0, TINY["vocab_size"], (2, batch, 1), generator=generator)).unbind(0)
        out.append((start + stride * torch.arange(seq)) % TINY["vocab_size"])
    return out


def reference_curve(style: str, data: list[torch.Tensor], *, clip: float = 0.5) -> list[float]:
    model = tiny_model(style)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return single_process_losses(model, optimizer, data, clip=clip)


def single_process_losses(model, optimizer, data: list[torch.Tensor], *, clip: float = 0.5) -> list[float]:
    """The loss curve of plain one-process steps (causal LM, clipping at ``clip``): the reference of every layout."""
    from tensorslim.tasks.lm import causal_lm_loss

    losses = []
    for batch in data:
        loss = causal_lm_loss(model(batch), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


class ListStream:
    """The global batches of ``data`` in order, as a task's training stream."""

    def __init__(self, data: list[torch.Tensor]) -> None:
        self.data, self.position = data, 0

    def next_batch(self) -> torch.Tensor:
        self.position += 1
        return self.data[self.position - 1]


def tp_curve(
    style: str, mesh, data: list[torch.Tensor], *, grad_accum: int = 1, dp_shard: bool = False, overlap: str = "none"
):
    """Losses of ``len(data) // grad_accum`` AdamW steps through the tensor-parallel layout, making the calls the
    Trainer makes in each step (micro-batches cut to this rank, loss, backward, global clipping, dp mean), and the
    elements DDP all-reduced over the dp axis in all steps together."""
    from tensorslim.distributed.layout import TensorParallel

    layout = TensorParallel(mesh, style=style, device=torch.device("cpu"), dp_shard=dp_shard, overlap=overlap)
    model = layout.shard(tiny_model(style))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return layout_steps(layout, model, optimizer, data, grad_accum=grad_accum)


def layout_steps(layout, model, optimizer, data: list[torch.Tensor], *, grad_accum: int = 1, bf16: bool = False):
    """The steps of :func:`tp_curve` on a built layout, model and optimizer (``bf16``: under autocast, as the
    Trainer runs ``dtype='bf16'``)."""
    import contextlib

    from tensorslim.tasks.lm import CausalLM

    task, stream = CausalLM(), ListStream(data)
    losses, dp_elements = [], 0
    for _ in range(len(data) // grad_accum):
        total = 0.0
        for batch, sync in layout.micro_batches(stream, grad_accum):
            with sync:
                with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                    loss = layout.loss(task, model, batch)
                (loss / grad_accum).backward()
            total += loss.item()
        layout.clip_grad_norm(model, 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(layout.mean(total / grad_accum))
        dp_elements += layout.log.total(prefix="dp.").elements  # the layout restarts the tally at each step
    return losses, dp_elements


def per_token(log, prefix: str, phase: str, tokens: int) -> dict[str, float]:
    tally = log.total(prefix=prefix, phase=phase)
    return {"elements_per_token": tally.elements / tokens, "count": tally.count}


def parity(style: str, *, mesh, norm: str = "online", recompute: str = "none", overlap: str = "none") -> dict:
    """Forward, gradients and communication of one step, against the single-process model."""
    from tensorslim.distributed import parallelize
    from tensorslim.distributed.sharding import full_tensors
    from tensorslim.tasks.lm import causal_lm_loss

    reference = tiny_model(style)
    tp_model = parallelize(reference, mesh, style, norm=norm, recompute=recompute, overlap=overlap)
    ids = batches(1)[0]
    ref_loss = causal_lm_loss(reference(ids), ids)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    tp_model.tp.log.reset()
    loss = tp_model.loss(ids)
    loss.backward()
    log = tp_model.tp.log
    tp_model.tp.log.enabled = False
    full_grads = full_tensors(tp_model.local_tensors(grads=True), tp_model.specs, tp_model.tp)
    with torch.no_grad():
        logits_err = (tp_model.full_logits(ids) - reference(ids)).abs().max().item()
    full_state = tp_model.full_state_dict()
    tokens = ids.numel()
    return {
        "logits_err": logits_err,
        "loss_err": abs(loss.item() - ref_loss.item()),
        "grad_err": max((full_grads[n] - g).abs().max().item() for n, g in ref_grads.items()),
        "grad_scale": max(g.abs().max().item() for g in ref_grads.values()),
        "grad_keys_match": sorted(full_grads) == sorted(ref_grads),
        "state_exact": all(torch.equal(full_state[n], t) for n, t in reference.state_dict().items()),
        "layer_fwd": per_token(log, "layers.0.", "fwd", tokens),
        "layer_bwd": per_token(log, "layers.0.", "bwd", tokens),
        "head_fwd": per_token(log, "head.", "fwd", tokens),
        "head_bwd": per_token(log, "head.", "bwd", tokens),
        "rows": log.as_rows(),
    }


def _write(path: str, payload: dict) -> None:
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(payload, f)


def tp2_worker(rank: int, world: int, group: dict[str, str], path: str) -> None:
    """Everything the 2-process tests check, in one process start-up."""
    from tensorslim.distributed import build_mesh

    init(rank, world, group)
    mesh = build_mesh(world, world_size=world)
    out: dict = {}
    for style in ("btp", "vanilla", "megatron"):
        out[style] = parity(style, mesh=mesh)
    out["btp_sync"] = parity("btp", mesh=mesh, norm="sync")
    out["btp_ckpt"] = parity("btp", mesh=mesh, recompute="latent")
    out["btp_layer_ckpt"] = parity("btp", mesh=mesh, recompute="layer")
    for overlap in ("backward", "full"):
        out[f"btp_overlap_{overlap}"] = parity("btp", mesh=mesh, overlap=overlap)
    out["btp_overlap_full_sync"] = parity("btp", mesh=mesh, norm="sync", overlap="full")
    out["btp_overlap_full_ckpt"] = parity("btp", mesh=mesh, recompute="latent", overlap="full")
    data = batches(20)
    for style in ("btp", "vanilla", "megatron"):
        curve = tp_curve(style, mesh, data)[0]
        out[f"curve_{style}"] = {"tp": curve, "ref": reference_curve(style, data)}
    out["curve_btp_overlap"] = {"tp": tp_curve("btp", mesh, data, overlap="full")[0]}
    out["rmsnorm"] = rmsnorm_check(mesh)
    _write(path, out)
    dist.destroy_process_group()


def rmsnorm_check(mesh) -> dict:
    """Online and synchronized RMSNorm (+ row-parallel A) against single-process RMSNorm, values and gradients."""
    from tensorslim.distributed.parallelize import tp_group
    from tensorslim.distributed.rmsnorm import online_rmsnorm_linear, sync_rmsnorm_linear
    from tensorslim.models.llama import RMSNorm

    tp = tp_group(mesh)
    generator = torch.Generator().manual_seed(3)
    d, k = 64, 24
    x = (torch.randn(3, 5, d, generator=generator) * 4).requires_grad_()  # far from unit scale on purpose
    gamma = (torch.rand(d, generator=generator) + 0.5).requires_grad_()
    weight = torch.randn(k, d, generator=generator).requires_grad_()
    norm = RMSNorm(d)
    with torch.no_grad():
        norm.weight.copy_(gamma)
    expected = norm(x) @ weight.T
    expected.square().sum().backward()
    ref_grads = [x.grad.clone(), norm.weight.grad.clone(), weight.grad.clone()]
    out = {}
    for name, fn in (("online", online_rmsnorm_linear), ("sync", sync_rmsnorm_linear)):
        w = d // tp.size
        cut = slice(tp.rank * w, (tp.rank + 1) * w)
        xs, gs, ws = (t.detach()[..., cut].clone().requires_grad_() for t in (x, gamma, weight))
        y = fn(xs, gs, ws, tp, d_model=d, eps=norm.eps, tag=f"test.{name}")
        # Each rank's loss term counts once: the output is replicated, so rank 0 alone carries the loss.
        (y.square().sum() * (tp.rank == 0)).backward()
        errs = [
            (g - r[..., cut]).abs().max().item() for g, r in zip((xs.grad, gs.grad, ws.grad), ref_grads, strict=True)
        ]
        out[name] = {"value_err": (y - expected).abs().max().item(), "grad_err": max(errs)}
    return out


def tp4_worker(rank: int, world: int, group: dict[str, str], path: str) -> None:
    """TP=4 parity, and a (dp=2, tp=2) mesh against one process on the global batch."""
    from tensorslim.distributed import build_mesh, parallelize

    init(rank, world, group)
    out: dict = {}
    mesh = build_mesh(4, world_size=world)
    out["btp_tp4"] = parity("btp", mesh=mesh)
    out["btp_tp4_overlap"] = parity("btp", mesh=mesh, overlap="full")
    data = batches(20)
    out["curve_btp_tp4"] = {"tp": tp_curve("btp", mesh, data)[0]}
    mesh = build_mesh(2, world_size=world)
    curve, dp_elements = tp_curve("btp", mesh, data)
    out["curve_btp_dp2tp2"] = {"tp": curve, "ref": reference_curve("btp", data)}
    out["curve_btp_dp2tp2_overlap"] = {"tp": tp_curve("btp", mesh, data, overlap="full")[0]}
    # Two micro-batches of half the batch per step: DDP skips its all-reduce on the first (no_sync), same math.
    halves = [part for batch in data for part in batch.chunk(2)]
    accumulated, accumulated_elements = tp_curve("btp", mesh, halves, grad_accum=2)
    out["curve_btp_dp2tp2_accum"] = {"tp": accumulated}
    local_params = sum(p.numel() for p in parallelize(tiny_model("btp"), mesh, "btp").parameters())
    out["dp_grads"] = {"elements": dp_elements, "accumulated": accumulated_elements, "local_params": local_params}
    out["curve_btp_tp4"]["ref"] = out["curve_btp_dp2tp2"]["ref"]
    _write(path, out)
    dist.destroy_process_group()


def fault_main(rank: str, corpus: str, out_dir: str) -> None:
    """The Trainer with TP=2 on rank ``rank``, as torchrun starts it (arguments as on its command line, the group's
    store in the environment: :func:`hosted_group`); rank 1 dies abruptly after step 3. Rank 0 must leave with a
    clear error, not hang."""
    world = 2
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    # A dead peer is seen at once (its connection resets); the timeout only bounds a hang, and a rank that a loaded
    # machine starts minutes late must not be taken for a dead one.
    os.environ["TENSORSLIM_DIST_TIMEOUT"] = "600"
    torch.set_num_threads(1)
    config = TrainConfig(
        preset="tiny",
        steps=50,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        data=corpus,
        eval_every=50,
        eval_blocks=4,
        checkpoint_every=50,
        out_dir=out_dir,
        progress=False,
        tensorboard=False,
        tp=world,
    )

    def die(record: dict) -> None:
        if rank == "1" and record["step"] == 3:
            os._exit(3)

    train(config, on_step=die)


def local_numel(model, optimizer) -> dict[str, int]:
    """Elements this rank holds of parameters and AdamW moments (FSDP2 shards count locally; gradients, freed
    after each step, have the parameters' shapes)."""
    from tensorslim.distributed.fsdp import local

    params = list(model.parameters())
    moments = [local(t) for p in params for k, t in optimizer.state.get(p, {}).items() if k != "step"]
    return {"params": sum(local(p).numel() for p in params), "moments": sum(t.numel() for t in moments)}


def checkpoints(path: str) -> Path:
    """The checkpoint folder of the worker that writes its results to ``path`` (next to it, named after it)."""
    return Path(path).parent / f"{Path(path).name.split('.')[0]}-checkpoints"


def fsdp4_worker(rank: int, world: int, group: dict[str, str], path: str) -> None:
    """FSDP2 on (dp 2, tp 2) and (dp 4, tp 1) against one process; DDP's memory next to FSDP2's; a sharded
    checkpoint of the (2, 2) run after 10 of its 20 steps (in ``path``'s folder)."""
    from tensorslim.distributed import build_mesh
    from tensorslim.distributed.layout import TensorParallel

    init(rank, world, group)
    data = batches(20)
    out: dict = {"ref": reference_curve("btp", data)}
    mesh = build_mesh(2, world_size=world)
    memory = {}
    for name, shard in (("ddp", False), ("fsdp", True)):
        layout = TensorParallel(mesh, style="btp", device=torch.device("cpu"), dp_shard=shard)
        model = layout.shard(tiny_model("btp"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        first = layout_steps(layout, model, optimizer, data[: 10 if shard else 1])[0]  # DDP: for its memory only
        memory[name] = local_numel(model, optimizer)
        if shard:
            log = model.tp.log
            out["fsdp_dp_log"] = {
                "gathered": log.total(prefix="dp.params").elements,
                "reduced": log.total(prefix="dp.grads").elements,
            }
            layout.save_checkpoint(checkpoints(path), step=10, model=model, optimizer=optimizer, state={"note": "test"})
            second = layout_steps(layout, model, optimizer, data[10:])[0]
            out["dp2tp2"] = first + second
            out["tp_local_params"] = sum(p.numel() for p in model.parameters())
    out["memory"] = memory
    out["dp4"] = tp_curve("btp", build_mesh(1, world_size=world), data, dp_shard=True)[0]
    _write(path, out)
    dist.destroy_process_group()


def resume2_worker(checkpoint: str, rank: int, world: int, group: dict[str, str], path: str) -> None:
    """Resume the (dp 2, tp 2) checkpoint at (dp 2 FSDP2, tp 1) for steps 11-15, write a checkpoint at 15, finish."""
    from tensorslim.distributed import build_mesh
    from tensorslim.distributed.layout import TensorParallel

    init(rank, world, group)
    data = batches(20)
    layout = TensorParallel(build_mesh(1, world_size=world), style="btp", device=torch.device("cpu"), dp_shard=True)
    model = layout.shard(tiny_model("btp", seed=7))  # other weights: everything must come from the checkpoint
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    state = layout.load_checkpoint(Path(checkpoint), model=model, optimizer=optimizer, prepare=lambda _: None)
    first = layout_steps(layout, model, optimizer, data[10:15])[0]
    layout.save_checkpoint(checkpoints(path), step=15, model=model, optimizer=optimizer, state={})
    second = layout_steps(layout, model, optimizer, data[15:])[0]
    _write(path, {"losses": first + second, "note": state["note"], "step": state["step"]})
    dist.destroy_process_group()


DATA_PARALLEL_METHODS = ("cola-m", "lax-cola", "tt")


def method_model(method: str, *, seed: int = 0):
    """The ``tiny`` preset (vocabulary 256) built for ``method``, as the Trainer builds it."""
    from tensorslim.methods import build_for_method

    torch.manual_seed(seed)
    return build_for_method("tiny", method, vocab_size=TINY["vocab_size"])[0]


def method_reference(method: str, data: list[torch.Tensor]) -> list[float]:
    model = method_model(method)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return single_process_losses(model, optimizer, data)


def methods_worker(rank: int, world: int, group: dict[str, str], path: str) -> None:
    """The methods TP cannot shard, FSDP2-sharded on their own models over 2 ranks, against one process."""
    from tensorslim.distributed import build_mesh
    from tensorslim.distributed.chunks import sharded_state
    from tensorslim.distributed.layout import DataParallel, TensorParallel

    init(rank, world, group)
    data = batches(5)
    mesh = build_mesh(1, world_size=world)
    out = {}
    for method in DATA_PARALLEL_METHODS:
        layout = DataParallel(mesh, style="btp", device=torch.device("cpu"), dp_shard=True)
        model = layout.shard(method_model(method))
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        losses = layout_steps(layout, model, optimizer, data)[0]
        out[method] = {"dp": losses, "ref": method_reference(method, data), "log": layout.log.as_rows()}
        with torch.no_grad():  # an evaluation leaves FSDP2's root group gathered; a checkpoint must still see shards
            layout.evaluation_model(model)(data[0])
        state = sharded_state(layout.holdings(), optimizer, layout.full_shapes)
        out[method]["moments_saved"] = sum(key.startswith("optim.exp_avg.") for key in state)
        out[method]["trainable"] = sum(p.requires_grad for p in model.parameters())
    # FSDP2's bf16 policy on the TP model: gathered weights in bf16, gradients reduced and AdamW kept in fp32
    layout = TensorParallel(mesh, style="btp", device=torch.device("cpu"), dp_shard=True, precision="bf16")
    model = layout.shard(tiny_model("btp"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    out["bf16"] = {
        "dp": layout_steps(layout, model, optimizer, data, bf16=True)[0],
        "ref": reference_curve("btp", data),
        "master_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    }
    _write(path, out)
    dist.destroy_process_group()


TEARDOWN_LAYOUTS = {
    "dp": {"tp": 1},
    "tp": {"tp": 2},
    "dp-shard": {"tp": 1, "dp_shard": 2},
    "tp-overlap": {"tp": 2, "tp_overlap": "full"},
}


def teardown_main(rank: str, corpus: str, out_dir: str, layout: str) -> None:
    """Two steps of the Trainer on rank ``rank`` of 2 in ``layout`` (a key of :data:`TEARDOWN_LAYOUTS`), as torchrun
    starts it (the group's store in the environment: :func:`hosted_group`); then the names of the gloo threads still
    alive in this process go to ``threads_<rank>.json``."""
    from tensorslim.distributed.teardown import gloo_threads
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import train

    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2")
    os.environ["TENSORSLIM_DIST_TIMEOUT"] = "600"  # a slow peer on a loaded machine is not a dead one
    torch.set_num_threads(1)
    config = TrainConfig(
        preset="tiny",
        steps=2,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        data=corpus,
        eval_every=2,
        eval_blocks=4,
        checkpoint_every=2,
        out_dir=out_dir,
        progress=False,
        tensorboard=False,
        **TEARDOWN_LAYOUTS[layout],
    )
    train(config)
    (Path(out_dir) / f"threads_{rank}.json").write_text(json.dumps({"gloo_threads": gloo_threads()}))
