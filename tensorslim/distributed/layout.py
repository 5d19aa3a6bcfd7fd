"""Where a training run's processes are: the seam between the one Trainer and tensor/data parallelism.

The Trainer (:mod:`tensorslim.train.trainer`) asks its layout, at a few fixed points, to shard the built model, to
cut each global batch to this rank's part, to compute and reduce the loss, to clip the global gradient norm, to
gather full checkpoints and to keep logging on rank 0. :class:`SingleProcess` does nothing at each point (the
default); :class:`TensorParallel` runs the same loop on the processes ``torchrun`` started, over a ``(dp, tp)`` mesh
(BOOST, Wang et al., 2025, arXiv 2512.12131, §3 for the TP styles and §4 for the deterministic sharded init).

Every rank draws the same global batch and keeps its data-parallel slice, so the math does not depend on the mesh.
The data-parallel axis is DDP (replicas) or FSDP2 (``dp_shard``: parameters, gradients and AdamW state split over
it; :mod:`tensorslim.distributed.fsdp`). Checkpoints are sharded (``torch.distributed.checkpoint``): each process
writes its rectangles of the single-process tensors (:mod:`tensorslim.distributed.chunks`), so a run may resume at
another world size, TP degree or on one process.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from tensorslim.checkpoint import (
    is_sharded_checkpoint,
    load_checkpoint,
    load_sharded_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
)
from tensorslim.distributed import fsdp, teardown
from tensorslim.distributed.chunks import Holding, prepare_adamw_state, sharded_state
from tensorslim.distributed.comm import CommLog, TPGroup
from tensorslim.distributed.parallelize import (
    DEFAULT_OVERLAP,
    TPCausalLM,
    build_mesh,
    check_world,
    parallelize,
)
from tensorslim.distributed.sharding import ShardSpec

if TYPE_CHECKING:
    from tensorslim.tasks.base import Stream, Task

# Seconds a collective may wait for a peer before the survivors give up (short, so a dead peer cannot hang a run).
TIMEOUT_ENV = "TENSORSLIM_DIST_TIMEOUT"
# gloo reports a dead peer as a plain RuntimeError ("... pair.cc: Read error ...: Connection reset by peer").
_PEER_FAILURE = re.compile(r"gloo|nccl|connection|timed out|timeout|peer", re.IGNORECASE)
_TP_TASKS = ("lm",)
_TP_FAMILIES = ("llama",)


@dataclass(frozen=True, kw_only=True)
class ParallelSetup:
    """What the layout needs to know of a run: the mesh, the batch split, what is sharded and how.

    The fields mean what the :class:`tensorslim.train.config.TrainConfig` fields of the same names mean, and
    ``family`` is the preset's model family (``TrainConfig.model_family``); ``TrainConfig.parallel_setup()`` builds
    one from a validated config, and :func:`check_parallel_config` checks that the setup fits the world.
    """

    tp: int
    tp_style: str
    tp_overlap: str
    dp_shard: int
    batch_size: int
    method: str
    task: str
    preset: str
    family: str
    device: str
    dtype: str


def check_parallel_config(config: ParallelSetup, *, world_size: int) -> None:
    """Raise a one-line ValueError for a bad parallel setup, before any process group, data or model exists.

    With ``tp > 1`` the method must list ``config.tp_style`` among the styles that can shard it (the method
    registry's ``tensor_parallel``); data parallelism alone needs ``ddp`` or ``fsdp`` (``dp_shard > 1``) in its
    ``data_parallel``. Only LLaMA causal-LM models run in parallel.
    """
    from tensorslim.methods import METHODS, get_method

    check_world(config.tp, world_size=world_size)
    dp = world_size // config.tp
    if config.dp_shard not in (1, dp):
        raise ValueError(
            f"dp_shard={config.dp_shard} must be 1 (DDP) or the whole data-parallel size {dp} (world {world_size} / "
            f"tp {config.tp}) for FSDP2"
        )
    if config.batch_size % dp:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the data-parallel size {dp}")
    method = get_method(config.method)
    note = f" ({method.parallel_note})" if method.parallel_note else ""
    if config.tp > 1 and config.tp_style not in method.tensor_parallel:
        allowed = [name for name, m in METHODS.items() if config.tp_style in m.tensor_parallel]
        raise ValueError(
            f"method={config.method!r} does not fit tp_style={config.tp_style!r}{note}; allowed: {allowed}"
        )
    kind = "fsdp" if config.dp_shard > 1 else "ddp"
    if config.tp == 1 and kind not in method.data_parallel:
        allowed = [name for name, m in METHODS.items() if kind in m.data_parallel]
        raise ValueError(f"method={config.method!r} cannot train data-parallel with {kind}{note}; allowed: {allowed}")
    if config.task not in _TP_TASKS:
        raise ValueError(f"task={config.task!r} cannot run in parallel; allowed: {list(_TP_TASKS)}")
    if config.family not in _TP_FAMILIES:
        raise ValueError(
            f"preset={config.preset!r} (family {config.family!r}) cannot run in parallel; allowed families: "
            f"{list(_TP_FAMILIES)}"
        )


@contextlib.contextmanager
def peer_failure_guard(rank: int) -> Iterator[None]:
    """Turn a collective that fails because a peer died or timed out into one clear line and exit code 1.

    Other errors pass through unchanged, so a bug is not reported as a lost peer.
    """
    try:
        yield
    except RuntimeError as error:
        if not (isinstance(error, dist.DistError) or _PEER_FAILURE.search(str(error))):
            raise
        first = str(error).strip().splitlines()[0][:200]
        print(
            f"tensorslim train: error: rank {rank} lost contact with a peer process ({first}); "
            "the last checkpoint is intact",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None


@contextlib.contextmanager
def exit_on_peer_failure(rank: int) -> Iterator[None]:
    """:func:`peer_failure_guard`, ending this process at once (``os._exit(1)``) when a peer is lost.

    ``os._exit`` because tearing down a process group whose peer vanished can abort the interpreter (SIGABRT)
    instead of returning the exit code.
    """
    try:
        with peer_failure_guard(rank):
            yield
    except SystemExit as done:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code if isinstance(done.code, int) else 1)


def _logged_allreduce(state: tuple[dist.ProcessGroup, CommLog], bucket):
    """DDP's own all-reduce hook, plus an entry in the communication log.

    ``bucket`` (a ``dist.GradBucket``) and the returned future stay unannotated: DDP inspects the annotations and
    rejects the string form that ``from __future__ import annotations`` gives them.
    """
    group, log = state
    log.add("dp.grads", "all_reduce", "bwd", bucket.buffer())
    return default_hooks.allreduce_hook(group, bucket)


def data_parallel(model: nn.Module, group: dist.ProcessGroup | None, *, size: int, log: CommLog) -> nn.Module:
    """Wrap ``model`` in DDP over the data-parallel axis of the mesh (the model itself when ``size`` is 1).

    DDP's bucketed gradient all-reduces run on the dp group during backward, next to the TP collectives.
    """
    if size == 1:
        return model
    ddp = DistributedDataParallel(model, process_group=group)
    ddp.register_comm_hook((group, log), _logged_allreduce)
    return ddp


def clip_grad_norm_tp(model: TPCausalLM, max_norm: float, *, dp_group: dist.ProcessGroup | None = None) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over the *unsharded* model: TP-sharded parameters add their squares over
    the TP group, replicated ones count once; FSDP2 shards add over ``dp_group`` first."""
    params = [(param, model.specs[name].sharded) for name, param in model.named_parameters()]
    return fsdp.clip_grad_norm(params, max_norm, tp=model.tp, dp_group=dp_group)


def _dp_slice(batch: Any, rank: int, size: int) -> Any:
    """This data-parallel rank's equal share of a batch (a tensor, or a tuple/list/dict of them), along dim 0."""
    if isinstance(batch, torch.Tensor):
        return batch.chunk(size, dim=0)[rank]
    if isinstance(batch, tuple | list):
        return type(batch)(_dp_slice(item, rank, size) for item in batch)
    if isinstance(batch, dict):
        return {key: _dp_slice(value, rank, size) for key, value in batch.items()}
    return batch


class SingleProcess:
    """The default layout: one process, the model as built; every call is the plain single-process operation."""

    is_main = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Around the run: a lost peer ends the process (nothing to lose here)."""
        yield

    def rank0_first(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, run by rank 0 before the others (they then read the caches it filled)."""
        return fn()

    def shard(self, model: nn.Module) -> nn.Module:
        """The model the optimizer trains (built with the same seed on every rank)."""
        return model

    def micro_batches(self, stream: Stream, count: int) -> Iterator[tuple[Any, contextlib.AbstractContextManager]]:
        """``count`` micro-batches of this rank, each with the context its forward and backward run in."""
        for _ in range(count):
            yield stream.next_batch(), contextlib.nullcontext()

    def loss(self, task: Task, model: nn.Module, batch: Any) -> torch.Tensor:
        """This rank's mean training loss of ``batch``."""
        return task.loss(model, batch)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        """Clip the global gradient norm to ``max_norm`` (``inf``: measure only); returns the norm before."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()

    def mean(self, value: float) -> float:
        """``value`` averaged over the data-parallel ranks."""
        return value

    def any_rank(self, value: int) -> int:
        """The largest ``value`` of any rank (so every rank takes the same decision, e.g. to stop)."""
        return value

    def step_metrics(self) -> dict[str, float]:
        """Extra metrics of the step just run (the TP layout: bytes its collectives carried on this rank)."""
        return {}

    def evaluation_model(self, model: nn.Module) -> nn.Module:
        """What the task's evaluation calls: full logits for every rank."""
        return model

    def save_checkpoint(
        self, root: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> Path:
        """Write checkpoint ``step`` (one process: the single-process safetensors format)."""
        return save_checkpoint(root, step=step, model=model, optimizer=optimizer, state=state)

    def load_checkpoint(
        self,
        path: Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        prepare: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Load either format; a sharded one (written under ``torchrun``) is read whole into this process."""
        if not is_sharded_checkpoint(path):
            return load_checkpoint(path, model=model, optimizer=optimizer, prepare=prepare)
        shapes = {name: p.shape for name, p in model.named_parameters()}
        return _load_sharded(path, optimizer, lambda: _whole_holdings(model), shapes, prepare)

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run on rank 0 alone; every rank gets its result once it is done."""
        return fn()

    def close(self, *, ok: bool) -> None:
        """End of the run (``ok``: it finished, so every rank reaches this point)."""


def _whole_holdings(model: nn.Module) -> list[Holding]:
    """Every parameter of a model that tensor parallelism did not cut: its own single source (and its FSDP2 rows)."""
    return [
        Holding(param, ShardSpec(sources=(name,)), fsdp.dp_split(param)) for name, param in model.named_parameters()
    ]


def _load_sharded(
    path: Path,
    optimizer: torch.optim.Optimizer,
    holdings: Callable[[], list[Holding]],
    shapes: dict[str, torch.Size],
    prepare: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """:func:`load_sharded_checkpoint` into ``holdings()`` (called once ``prepare`` has seen the state) and their
    AdamW state, then AdamW's one step count copied to every parameter's state.

    ``shapes`` are the single-process shapes of the parameters the holdings are rectangles of.
    """
    step: list[torch.Tensor] = []

    def collect() -> dict[str, torch.Tensor]:
        prepare_adamw_state(optimizer)
        tensors = sharded_state(holdings(), optimizer, shapes)
        step.append(tensors["optim.step"])
        return tensors

    state = load_sharded_checkpoint(path, tensors=collect, prepare=prepare)
    for entry in optimizer.state.values():
        entry["step"].copy_(step[0])
    return state


class _GatheredLogits(nn.Module):
    """The TP model as the task's evaluation sees it: token ids → all ``V`` logits."""

    def __init__(self, model: TPCausalLM) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner.full_logits(input_ids)


class TensorParallel:
    """``tp``-way tensor parallelism × data parallelism over the rest of the world, on an initialized process group.

    Args:
        mesh: a ``(dp, tp)`` mesh (:func:`tensorslim.distributed.parallelize.build_mesh`).
        style: ``btp``, ``vanilla`` or ``megatron`` (see :func:`tensorslim.distributed.parallelize.parallelize`).
        device: where this rank's shards live.
        dp_shard: FSDP2 (``fully_shard``) on the dp axis instead of DDP: parameters, gradients and optimizer state
            split over it.
        precision: FSDP2's mixed-precision policy, ``fp32`` or ``bf16`` (:func:`tensorslim.distributed.fsdp.
            mixed_precision`).
        overlap: how BTP's latent all-reduces overlap computation (see :func:`tensorslim.distributed.parallelize.
            parallelize`).
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        *,
        style: str,
        device: torch.device,
        dp_shard: bool = False,
        precision: str = "fp32",
        overlap: str = DEFAULT_OVERLAP,
    ) -> None:
        self.mesh, self.style, self.device, self.overlap = mesh, style, device, overlap
        self.rank = dist.get_rank()
        self.is_main = self.rank == 0
        dp = mesh["dp"]
        self.dp_group, self.dp_rank, self.dp_size = dp.get_group(), dp.get_local_rank(), dp.size()
        self.fsdp = dp_shard and self.dp_size > 1
        self.precision = precision
        self.model: TPCausalLM | None = None
        self.runner: nn.Module | None = None  # the TP model (FSDP2-sharded or not), or its DDP wrapper
        self.full_shapes: dict[str, torch.Size] = {}
        self.log = CommLog()

    @classmethod
    def launch(cls, config: ParallelSetup, *, world_size: int) -> TensorParallel:  # or the subclass
        """Join the process group ``torchrun`` describes in the environment and build the mesh."""
        cuda = config.device == "cuda"
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
        with exit_on_peer_failure(dist.get_rank()):
            mesh = build_mesh(config.tp, world_size=world_size, device_type=device.type)
        precision = "bf16" if config.dtype == "bf16" else "fp32"
        return cls(
            mesh,
            style=config.tp_style,
            device=device,
            dp_shard=config.dp_shard > 1,
            precision=precision,
            overlap=config.tp_overlap,
        )

    def guarded(self) -> contextlib.AbstractContextManager:
        return exit_on_peer_failure(self.rank)

    def rank0_first(self, fn: Callable[[], Any]) -> Any:
        """Rank 0 fills the tokenizer/token caches alone; the others then read them (no concurrent writers)."""
        if self.is_main:
            out = fn()
            dist.barrier()
            return out
        dist.barrier()
        return fn()

    def shard(self, model: nn.Module) -> TPCausalLM:
        """This rank's slices of ``model`` (every rank built the same TP=1 weights from the same seed)."""
        self.full_shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
        self.model = parallelize(
            model, self.mesh, self.style, dp_shard=self.fsdp, precision=self.precision, overlap=self.overlap
        )
        self.log = self.model.tp.log  # one log for the TP and the dp collectives
        self.runner = (
            self.model if self.fsdp else data_parallel(self.model, self.dp_group, size=self.dp_size, log=self.log)
        )
        return self.model

    def micro_batches(self, stream: Stream, count: int) -> Iterator[tuple[Any, contextlib.AbstractContextManager]]:
        self.log.reset()  # a step starts: tally its collectives alone (not the evaluation's)
        for i in range(count):
            batch = _dp_slice(stream.next_batch(), self.dp_rank, self.dp_size)
            # DDP and FSDP2 reduce gradients once, on the last micro-batch
            last = i == count - 1
            if self.fsdp:
                self.model.set_requires_gradient_sync(last)
                yield batch, contextlib.nullcontext()
            else:
                yield batch, contextlib.nullcontext() if last or self.runner is self.model else self.runner.no_sync()

    def loss(self, task: Task, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        # The vocabulary-parallel cross-entropy of the causal-LM task (the only one allowed): full logits never exist.
        return self.model.loss_from_logits(self.runner(batch), batch)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        return clip_grad_norm_tp(self.model, max_norm, dp_group=self.dp_group if self.fsdp else None)

    def mean(self, value: float) -> float:
        if self.dp_size == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.dp_group)
        return total.item() / self.dp_size

    def any_rank(self, value: int) -> int:
        flag = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def step_metrics(self) -> dict[str, float]:
        return {"comm_bytes": self.log.total().bytes}

    def evaluation_model(self, model: nn.Module) -> nn.Module:
        return _GatheredLogits(self.model)

    def holdings(self) -> list[Holding]:
        """Every local parameter with its TP=1 sources, its FSDP2 rows and this rank's TP coordinate."""
        fsdp.reshard(self.model)
        tp = self.model.tp
        return [
            Holding(param, self.model.specs[name], fsdp.dp_split(param), tp.rank, tp.size)
            for name, param in self.model.named_parameters()
        ]

    def save_checkpoint(
        self, root: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> Path:
        """Every rank writes its own rectangles (a collective)."""
        tensors = sharded_state(self.holdings(), optimizer, self.full_shapes)
        return save_sharded_checkpoint(
            root, step=step, tensors=tensors, state=state, is_main=self.is_main, barrier=dist.barrier
        )

    def load_checkpoint(
        self,
        path: Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        prepare: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Read this rank's rectangles of a sharded checkpoint written by any layout (a collective)."""
        if not is_sharded_checkpoint(path):
            raise ValueError(
                f"checkpoint {path} was written by one process; a parallel run resumes from the sharded checkpoints "
                "parallel runs write (resume it on one process, or start the parallel run from --init)"
            )
        return _load_sharded(path, optimizer, self.holdings, self.full_shapes, prepare)

    def on_main(self, fn: Callable[[], Any]) -> Any:
        result = [fn() if self.is_main else None]
        dist.broadcast_object_list(result, src=0)
        return result[0]

    def close(self, *, ok: bool) -> None:
        """Leave the process group: after a barrier when the run finished, so no rank tears down while a peer
        still talks to it, then release every group so its gloo threads end here, not at interpreter shutdown
        (:mod:`tensorslim.distributed.teardown`)."""
        if not dist.is_initialized():
            return
        if ok:
            with exit_on_peer_failure(self.rank):
                dist.barrier()
        groups = [dist.group.WORLD, *self.mesh.get_all_groups()]
        self.runner = self.dp_group = None  # DDP's reducer holds the dp group from C++
        teardown.leave(groups, meshes=[self.mesh, self.mesh["dp"], self.mesh["tp"]])


class DataParallel(TensorParallel):
    """Data parallelism alone (``tp = 1``) on the method's own model, DDP or FSDP2: for the methods whose layers the
    TP blocks do not know (CoLA-M, LaX, TT, GaLore under DDP; the method registry's ``data_parallel``)."""

    def shard(self, model: nn.Module) -> nn.Module:
        self.full_shapes = {name: p.shape for name, p in model.named_parameters()}
        self.model = model
        if self.fsdp:
            fsdp.shard_blocks(model, self.mesh["dp"], blocks=model.layers, precision=self.precision, log=self.log)
            self.runner = model
        else:
            self.runner = data_parallel(model, self.dp_group, size=self.dp_size, log=self.log)
        return model

    def loss(self, task: Task, model: nn.Module, batch: Any) -> torch.Tensor:
        return task.loss(self.runner, batch)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        params = [(param, False) for param in self.model.parameters() if param.requires_grad]
        return fsdp.clip_grad_norm(params, max_norm, tp=TPGroup.single(), dp_group=self.dp_group if self.fsdp else None)

    def evaluation_model(self, model: nn.Module) -> nn.Module:
        return self.model

    def holdings(self) -> list[Holding]:
        fsdp.reshard(self.model)
        return _whole_holdings(self.model)

    def save_checkpoint(
        self, root: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> Path:
        """Sharded for AdamW; another optimizer (GaLore, DDP only) is replicated, so rank 0 writes the
        single-process format."""
        if type(optimizer) is torch.optim.AdamW:
            return super().save_checkpoint(root, step=step, model=model, optimizer=optimizer, state=state)
        return self.on_main(
            lambda: save_checkpoint(root, step=step, model=self.model, optimizer=optimizer, state=state)
        )

    def load_checkpoint(
        self,
        path: Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        prepare: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        if not is_sharded_checkpoint(path) and not self.fsdp:  # DDP replicas load the whole state each
            return load_checkpoint(path, model=self.model, optimizer=optimizer, prepare=prepare)
        return super().load_checkpoint(path, model=model, optimizer=optimizer, prepare=prepare)


Layout = SingleProcess | TensorParallel | DataParallel


def parallel_layout(config: ParallelSetup) -> Layout:
    """The layout of this process: :class:`TensorParallel` under ``torchrun`` (``WORLD_SIZE > 1``) or with
    ``config.tp > 1``, else :class:`SingleProcess`. The setup is checked before any process group work."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if config.tp == 1 and world_size == 1:
        return SingleProcess(torch.device(config.device))
    if "RANK" not in os.environ:
        raise ValueError(
            f"tp={config.tp} needs one process per rank: torchrun --nproc-per-node {config.tp} -m tensorslim train ..."
        )
    check_parallel_config(config, world_size=world_size)
    from tensorslim.methods import get_method

    if config.tp == 1 and config.tp_style not in get_method(config.method).tensor_parallel:
        return DataParallel.launch(config, world_size=world_size)
    return TensorParallel.launch(config, world_size=world_size)
