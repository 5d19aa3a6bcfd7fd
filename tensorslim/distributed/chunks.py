"""Which rectangle of each single-process (TP=1) tensor a rank holds: the index of a sharded checkpoint.

A parameter of the parallel model is one :class:`~tensorslim.distributed.sharding.ShardSpec` (its TP=1 sources,
how they are grouped, the dimension TP splits), possibly split again along dim 0 by FSDP2 over the data-parallel
ranks. Whatever the layout, the part of every TP=1 source that one rank holds is a single rectangle (or nothing):

- TP cuts the grouped tensor into ``p`` equal slabs along ``spec.dim``;
- FSDP2 cuts this slab into ``ceil(n / dp)``-wide pieces along one dimension
  (:func:`tensorslim.distributed.fsdp.even_split`);
- a ``cat`` group (sources concatenated along dim 0) meets a range of dim 0 in one range per source, a ``stack``
  group (a new leading dim) in whole sources; a range of another dimension cuts every source alike.

:class:`Chunk` presents such a rectangle to ``torch.distributed.checkpoint`` (DCP) with its offsets in the TP=1
tensor, so every rank writes only what it holds and DCP reads back any other layout's rectangles: a checkpoint
written at ``(dp, tp) = (2, 2)`` loads at ``(2, 1)``, ``(1, 2)`` or into one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from tensorslim.distributed.sharding import ShardSpec


class Chunk(torch.Tensor):
    """A view of this rank's rectangle of a TP=1 tensor, with its offsets there (DCP's ``_Checkpointable``
    protocol). Writes through the view (DCP's load) land in the parameter or optimizer moment it views."""

    offsets: tuple[int, ...]
    global_shape: torch.Size

    @staticmethod
    def of(data: torch.Tensor, offsets: tuple[int, ...], global_shape: torch.Size) -> Chunk:
        chunk = torch.Tensor._make_subclass(Chunk, data)  # shares data's storage
        chunk.offsets, chunk.global_shape = tuple(offsets), torch.Size(global_shape)
        return chunk

    def size(self, dim: int | None = None) -> torch.Size | int:  # noqa: D102 - DCP's load planner compares the
        # *global* size with the checkpoint's; the rectangle's own shape stays in ``.shape``
        return self.global_shape if dim is None else self.global_shape[dim]

    def _storage_chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=torch.Size(self.offsets), sizes=self.shape)

    def __create_write_items__(self, fqn: str, _obj: object) -> list[WriteItem]:
        local = self.as_subclass(torch.Tensor)
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(self.offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=self._storage_chunk(),
                    properties=TensorProperties.create_from_tensor(local),
                    size=self.global_shape,
                ),
            )
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self._storage_chunk()]

    def __get_tensor_shard__(self, _index: MetadataIndex) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)


@dataclass(frozen=True)
class Rectangle:
    """One TP=1 source's part held by this rank: ``data`` (a view) sits at ``offsets`` of a ``shape`` tensor."""

    source: str
    offsets: tuple[int, ...]
    shape: torch.Size
    data: torch.Tensor

    def chunk(self) -> Chunk:
        return Chunk.of(self.data, self.offsets, self.shape)


def grouped_shape(spec: ShardSpec, shapes: dict[str, torch.Size]) -> torch.Size:
    """The shape of the grouped TP=1 tensor of ``spec`` (see :func:`tensorslim.distributed.sharding.group`)."""
    first = shapes[spec.sources[0]]
    count = len(spec.sources)
    if spec.grouping == "cat":
        return torch.Size([first[0] * count, *first[1:]])
    if spec.grouping == "stack":
        return torch.Size([count, *first])
    return torch.Size(first)


def rectangles(
    local: torch.Tensor,
    spec: ShardSpec,
    shapes: dict[str, torch.Size],
    *,
    split: tuple[int, int, int],
    tp_rank: int,
    tp_size: int,
) -> list[Rectangle]:
    """The rectangles of ``spec``'s sources that ``local`` holds.

    Args:
        local: this rank's tensor (a parameter's or a moment's local shard).
        spec: where the parameter comes from in the TP=1 state dict.
        shapes: TP=1 shapes by name.
        split: ``(dim, start, stop)``: the range of the TP slab's dimension ``dim`` that ``local`` holds (FSDP2's
            shard; the whole slab otherwise).
        tp_rank, tp_size: this rank's TP coordinate.
    """
    full = grouped_shape(spec, shapes)
    if not full:  # a 0-dim tensor: whole on every rank
        return [Rectangle(spec.sources[0], (), full, local)]
    start, size = [0] * len(full), list(full)
    if spec.dim is not None:
        size[spec.dim] = full[spec.dim] // tp_size
        start[spec.dim] = tp_rank * size[spec.dim]
    dim, lo, hi = split
    start[dim] += lo
    size[dim] = hi - lo
    if not all(size):
        return []
    if spec.grouping == "none":
        return [Rectangle(spec.sources[0], tuple(start), full, local)]
    top, bottom = start[0], start[0] + size[0]  # dim 0 of the group: which sources, which of their rows
    out = []
    if spec.grouping == "cat":
        rows = full[0] // len(spec.sources)
        for i, source in enumerate(spec.sources):
            first, last = max(top, i * rows), min(bottom, (i + 1) * rows)
            if first < last:
                data = local[first - top : last - top]
                out.append(Rectangle(source, (first - i * rows, *start[1:]), shapes[source], data))
        return out
    for i in range(top, bottom):  # stack: whole sources along the new leading dim
        out.append(Rectangle(spec.sources[i], tuple(start[1:]), shapes[spec.sources[i]], local[i - top]))
    return out


ADAMW_MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Holding:
    """One local parameter and where it sits: its spec, its FSDP2 split, this rank's TP coordinate."""

    param: torch.nn.Parameter
    spec: ShardSpec
    split: tuple[int, int, int]  # (dim, start, stop) of the TP slab held here
    tp_rank: int = 0
    tp_size: int = 1


def prepare_adamw_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of an AdamW its (zero) moments and step before a checkpoint loads into them, as
    ``torch.optim.AdamW`` creates them at its first step."""
    if type(optimizer) is not torch.optim.AdamW:
        raise ValueError(f"sharded checkpoints hold AdamW state only; this run trains with {type(optimizer).__name__}")
    from tensorslim.distributed.fsdp import local

    for group in optimizer.param_groups:
        on_device = group.get("fused") or group.get("capturable")  # where torch.optim.AdamW puts its step count
        for param in group["params"]:
            if param.requires_grad and not optimizer.state[param]:
                device = local(param).device if on_device else torch.device("cpu")
                optimizer.state[param] = {
                    "step": torch.zeros((), dtype=torch.float32, device=device),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }


def sharded_state(
    holdings: list[Holding], optimizer: torch.optim.Optimizer, shapes: dict[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """The DCP state dict of this rank: ``model.<TP=1 name>`` and ``optim.<moment>.<TP=1 name>`` as
    :class:`Chunk` views of what it holds, and AdamW's ``optim.step``.

    Raises:
        ValueError: the optimizer is not AdamW, or holds a state this format does not know.
    """
    from tensorslim.distributed.fsdp import local

    if type(optimizer) is not torch.optim.AdamW:
        raise ValueError(f"sharded checkpoints hold AdamW state only; this run trains with {type(optimizer).__name__}")
    out: dict[str, torch.Tensor] = {}
    step = None
    for holding in holdings:
        tensors = {"model": holding.param}
        state = optimizer.state.get(holding.param, {})
        unknown = set(state) - {"step", *ADAMW_MOMENTS}
        if unknown:
            raise ValueError(f"sharded checkpoints hold AdamW state only; found {sorted(unknown)}")
        tensors.update({f"optim.{key}": state[key] for key in ADAMW_MOMENTS if key in state})
        step = state.get("step", step)
        for prefix, tensor in tensors.items():
            for rect in rectangles(
                local(tensor).detach(),
                holding.spec,
                shapes,
                split=holding.split,
                tp_rank=holding.tp_rank,
                tp_size=holding.tp_size,
            ):
                out[f"{prefix}.{rect.source}"] = rect.chunk()
    if step is not None:
        out["optim.step"] = step
    return out
