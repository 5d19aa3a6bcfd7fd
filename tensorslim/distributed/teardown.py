"""Leaving the process group so that none of its threads outlives it.

``dist.destroy_process_group()`` unregisters the groups, but a gloo group's worker threads (``pt_gloo_runloop``) and
its transport thread (``gloo_tcp_loop``) stop only when the last reference to the group is dropped. After a run,
references remain: FSDP2's state on every sharded module (its mesh info keeps the data-parallel group), the device
mesh's own registry (reachable from DTensor's sharding caches, module globals that live until the interpreter
shuts down), the tensor-parallel model's :class:`~tensorslim.distributed.comm.TPGroup` and DDP's reducer. Those
threads then run on into interpreter shutdown, where a worker that drops its last finished collective (and with
it a tensor whose Python object it must release) tries to take the GIL of a finalizing interpreter: the thread is
ended by forced unwinding, which C++ turns into ``std::terminate`` — the "terminate called without an active
exception" abort of a run that had finished. A loaded machine widens the window (the worker is descheduled between
completing the collective and releasing it), so the abort came and went with the load.

:func:`leave` drops those references after a barrier, so each group's destructor joins its threads while this
process is whole.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import _redistribute as redistribute
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

# Thread names given by gloo's transport loop and by the c10d gloo backend's workers (Linux ``/proc`` only).
_GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def gloo_threads() -> list[str]:
    """The names of this process's live gloo threads (empty where ``/proc/self/task`` does not exist)."""
    names = []
    for task in sorted(Path("/proc/self/task").glob("*")):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(_GLOO_THREADS):
            names.append(name)
    return names


def _forget_meshes(meshes: list[DeviceMesh]) -> None:
    """Empty the device meshes' group registries and DTensor's caches that keep meshes (torch keeps no public way
    to do either; both are refilled on demand, so a later run in this process is unaffected)."""
    for mesh in meshes:
        getattr(mesh, "_pg_registry", {}).clear()
    _clear_sharding_prop_cache()
    getattr(redistribute, "_planner_cache", {}).clear()


def leave(groups: list[dist.ProcessGroup], *, meshes: list[DeviceMesh]) -> None:
    """Destroy every process group and release ``groups`` (this run's groups, WORLD included), so their threads
    are joined now rather than at interpreter shutdown.

    A reference to a destroyed group can only raise, so every object attribute or dictionary entry that still
    holds one (FSDP2's mesh info, a TPGroup) gets ``None`` in its place, the meshes forget theirs, and the
    collector frees the cycles (DDP's reducer, FSDP2's hooks) that keep groups alive from C++.

    Args:
        groups: the groups to release (the list is emptied: it must not keep them either).
        meshes: this run's device meshes, the root and its slices.
    """
    dist.destroy_process_group()
    _forget_meshes(meshes)
    for group in groups:
        for holder in gc.get_referrers(group):
            if isinstance(holder, dict):
                for key in [key for key, value in holder.items() if value is group]:
                    holder[key] = None
            elif hasattr(holder, "__dict__"):  # an object whose attributes are stored inline (no dict referrer)
                for name in [name for name, value in vars(holder).items() if value is group]:
                    setattr(holder, name, None)
    groups.clear()
    gc.collect()
