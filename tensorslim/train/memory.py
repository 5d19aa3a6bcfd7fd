"""Training-memory accounting that works on CPU, where there is no allocator high-water mark to read.

Peak training memory is taken as the bytes of parameters + gradients + optimizer state + the activations autograd
saves for backward. Saved activations are measured exactly with ``torch.autograd.graph.saved_tensors_hooks``:
every tensor packed during the forward is recorded once per underlying storage, and storages that belong to
parameters are left out (they are already counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class SavedTensorTally:
    """Unique storages saved for backward while the context was active."""

    exclude: set[int] = field(default_factory=set)
    storages: dict[int, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def record(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()


@contextmanager
def count_saved_tensors(model: nn.Module) -> Iterator[SavedTensorTally]:
    """Count the bytes of activations saved for backward during the block (parameters excluded)."""
    # an FSDP2 parameter is a DTensor: its storage is its local shard's
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    tally = SavedTensorTally(exclude={p.untyped_storage().data_ptr() for p in local})

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        tally.record(tensor)
        # Detached, so the packed tensor holds no grad_fn: a node saving its own output (tanh, softmax, ...) would
        # otherwise own a tensor that owns the node, a C++ cycle gc cannot see. Backward frees it, but the graph of
        # an output the loss never reaches (BERT's pooler under a distillation loss) then lived on, one per step.
        # Autograd re-attaches the grad_fn on unpack; the storage, hence the tally, is the same.
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield tally


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer state (moments, GaLore projection matrices, ...)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
            elif hasattr(value, "ortho_matrix") and isinstance(value.ortho_matrix, torch.Tensor):
                total += value.ortho_matrix.numel() * value.ortho_matrix.element_size()
    return total


@dataclass(frozen=True)
class MemoryBreakdown:
    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


def training_memory(model: nn.Module, optimizer: torch.optim.Optimizer, activations: int) -> MemoryBreakdown:
    """The breakdown after at least one optimizer step (so that the optimizer state exists)."""
    params = [p for p in model.parameters()]
    return MemoryBreakdown(
        params=tensor_bytes(params),
        grads=tensor_bytes([p for p in params if p.requires_grad]),
        optimizer=optimizer_state_bytes(optimizer),
        activations=activations,
    )
