"""Checkpoints: safetensors for tensors, JSON for the rest, written atomically.

Layout of ``<run>/checkpoints/step_000123/``: ``model.safetensors`` (the model alone, loadable by any safetensors
reader), ``state.safetensors`` (optimizer tensors and RNG state) and ``state.json`` (step, config, data position and
the optimizer's non-tensor state). A checkpoint is written to a temporary folder and renamed into place, and the
``latest`` pointer is replaced atomically afterwards, so an interruption never leaves a half-written checkpoint
behind. Nothing is unpickled on load. Each safetensors file records the SHA-256 of its tensors in its own metadata
and reading it refuses a file whose bytes changed since (:mod:`tensorslim.tensor_files`): a flipped bit in the
weights is an error, not a silently different model.

Optimizer tensors come back with the strides they were saved with, not just their values: a resumed run must do the
same arithmetic as an uninterrupted one, and BLAS picks its kernel by layout. GaLore's projector is a strided view of
the SVD's column-major output (``Vh[:rank]`` or ``U[:, :rank]``); a contiguous copy of it makes ``grad @ P.T`` an
MKL ``sgemm`` with a transposed operand instead of a plain one, which sums in another order and changes the low bits
of every step that reuses the projector.

Parallel runs (``torchrun``) write *sharded* checkpoints with ``torch.distributed.checkpoint`` (DCP) instead: every
process writes the rectangles of the single-process tensors it holds (:mod:`tensorslim.distributed.chunks`), rank 0
adds ``state.json`` (with the SHA-256 of every file the ranks wrote, checked before they are read back), and the
folder is committed the same way (temporary folder, rename, ``latest``). DCP reads any other layout's rectangles back,
so a run resumes at another world size, TP degree or on one process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tensorslim.tensor_files import load_tensors, save_tensors

_TENSOR = "__tensor__"
_DCP_METADATA = ".metadata"  # what torch.distributed.checkpoint's coordinator writes last
_PROJECTOR = "__galore_projector__"


def _flatten(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace tensors in a nested optimizer state by references into ``tensors``; GaLore's projector objects are
    stored by their attributes."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().contiguous().cpu()
        if obj.is_contiguous():
            return {_TENSOR: key}
        return {_TENSOR: key, "stride": list(obj.stride()), "offset": obj.storage_offset()}
    if isinstance(obj, dict):
        return {
            "__dict__": [
                [_flatten(k, f"{key}.k{i}", tensors), _flatten(v, f"{key}.{i}", tensors)]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if isinstance(obj, list | tuple):
        return [_flatten(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]
    if type(obj).__name__ == "GaLoreProjector":
        return {_PROJECTOR: _flatten(dict(vars(obj)), key, tensors)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot checkpoint optimizer state of type {type(obj).__name__}")


def _strided(values: torch.Tensor, stride: list[int], offset: int) -> torch.Tensor:
    """``values`` in a fresh storage, laid out with ``stride`` and ``offset`` as the tensor it was saved from."""
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(values.shape, stride, strict=True))
    storage = values.new_empty(extent)
    storage[torch.arange(extent).as_strided(values.shape, stride, offset)] = values  # also right for overlaps
    return storage.as_strided(values.shape, stride, offset)


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _TENSOR in obj:
        values = tensors[obj[_TENSOR]]
        return _strided(values, obj["stride"], obj["offset"]) if "stride" in obj else values
    if _PROJECTOR in obj:
        from galore_torch.galore_projector import GaLoreProjector

        attrs = _unflatten(obj[_PROJECTOR], tensors)
        projector = GaLoreProjector(attrs["rank"])
        vars(projector).update(attrs)
        return projector
    return {_unflatten(k, tensors): _unflatten(v, tensors) for k, v in obj["__dict__"]}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unique_tensors(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``state`` with each shared tensor (tied weights, e.g. GPT-2's ``lm_head`` and ``wte``) kept once, as
    contiguous CPU copies, plus ``{alias: kept name}`` for the others (safetensors refuses shared storage)."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if tensor.device.type != "meta" and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = tensor.detach().contiguous().cpu()
    return kept, aliases


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically and keep the newest ``keep`` of them.

    Args:
        root: the run's ``checkpoints`` folder.
        step: optimizer steps completed.
        model: its ``state_dict()`` goes to ``model.safetensors``.
        optimizer: its ``state_dict()`` is split into tensors and JSON.
        state: any JSON-serializable run state (config, data position, ...).
        keep: how many checkpoints to keep.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
    optimizer_tree = _flatten(optimizer.state_dict(), "optim", tensors)
    weights, aliases = unique_tensors(model.state_dict())
    save_tensors(weights, tmp / "model.safetensors")
    save_tensors(tensors, tmp / "state.safetensors")
    with open(tmp / "state.json", "w") as f:
        json.dump({"format": 1, "step": step, "optimizer": optimizer_tree, "aliases": aliases, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    _commit(tmp, final, keep=keep)
    return final


def _commit(tmp: Path, final: Path, *, keep: int) -> None:
    """Rename a complete checkpoint folder into place, then point ``latest`` at it; drop all but ``keep``."""
    _fsync_dir(tmp)
    root = final.parent
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    _fsync_dir(root)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    # Temporary folders of writes that a killed process left behind (the run folder has one writer: its lock).
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _single_process_is_meant() -> Iterator[None]:
    """Silence DCP's warning that it runs without a process group: one process reading or writing is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` was written by :func:`save_sharded_checkpoint` (DCP) rather than :func:`save_checkpoint`."""
    return (path / _DCP_METADATA).is_file()


def save_sharded_checkpoint(
    root: Path,
    *,
    step: int,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    is_main: bool,
    barrier: Callable[[], None],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` with every process writing its own shards; a collective, called by every rank.

    All ranks write into one temporary folder with ``torch.distributed.checkpoint.save`` (on a file system they
    share); once every rank is done, rank 0 adds ``state.json`` and renames the folder into place. A crash before
    the rename leaves only the temporary folder, and ``latest`` still names the previous, complete checkpoint.

    Args:
        root: the run's ``checkpoints`` folder.
        step: optimizer steps completed.
        tensors: this rank's DCP state dict (:func:`tensorslim.distributed.chunks.sharded_state`).
        state: JSON-serializable run state, written by rank 0.
        is_main: this is rank 0.
        barrier: waits for every rank.
        keep: how many checkpoints to keep.
    """
    import torch.distributed.checkpoint as dcp

    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-{final.name}"
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    with _single_process_is_meant():
        dcp.save({**tensors, "rng.torch": torch.get_rng_state()}, checkpoint_id=tmp, no_dist=not dist.is_initialized())
    barrier()  # every rank's shards are on disk
    if is_main:
        digests = {file.name: _file_sha256(file) for file in sorted(tmp.iterdir()) if file.is_file()}
        with open(tmp / "state.json", "w") as f:
            json.dump({"format": "dcp", "step": step, **state, "sha256": digests}, f)
            f.flush()
            os.fsync(f.fileno())
        _commit(tmp, final, keep=keep)
    barrier()
    return final


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # streamed, in blocks


def _check_files(path: Path, digests: object) -> None:
    """Refuse a sharded checkpoint whose files are not the ones its ``state.json`` recorded (``digests``: ``{file
    name: SHA-256}``; None for a checkpoint written before they were recorded, which is read unchecked)."""
    if digests is None:
        return
    if not isinstance(digests, dict) or not all(
        isinstance(name, str) and "/" not in name and name not in ("", ".", "..") and isinstance(digest, str)
        for name, digest in digests.items()
    ):
        raise ValueError(f"checkpoint {path} has sha256={str(digests)[:80]!r}; allowed: an object of file names")
    for name, expected in digests.items():
        file = path / name
        if not file.is_file() or file.is_symlink():
            raise ValueError(f"checkpoint {path} is corrupt or incomplete: {name} is missing")
        found = _file_sha256(file)
        if found != expected:
            raise ValueError(
                f"checkpoint {path} is corrupt: {file} has SHA-256 {found[:16]}…, it was written with "
                f"{expected[:16]}…; allowed: the file as saved (it was damaged or edited since)"
            )


def load_sharded_checkpoint(
    path: Path,
    *,
    tensors: Callable[[], dict[str, torch.Tensor]],
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Read this rank's part of a sharded checkpoint into the views ``tensors()`` returns; returns its JSON state.

    ``prepare`` receives the JSON state first (as in :func:`load_checkpoint`); ``tensors`` is called after it.

    Raises:
        ValueError: the checkpoint is incomplete or does not hold what ``tensors()`` asks for.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException

    state = read_state(path)
    _check_files(path, state.get("sha256"))
    if prepare is not None:
        prepare(state)
    wanted = {**tensors(), "rng.torch": torch.get_rng_state()}
    try:
        with _single_process_is_meant():
            dcp.load(wanted, checkpoint_id=path, no_dist=not dist.is_initialized())
    except (CheckpointException, RuntimeError, ValueError) as error:
        if isinstance(error, CheckpointException):  # one failure per rank; rank order, first one
            error = next(iter(error.failures.values()))[0]
        first = str(error).strip().splitlines()[0][:300]
        raise ValueError(f"checkpoint {path} does not match this run's model/optimizer: {first}") from None
    torch.set_rng_state(wanted["rng.torch"])
    return state


def read_state(path: Path) -> dict[str, Any]:
    """The JSON state (step, config, ...) of the checkpoint folder ``path``.

    Raises:
        ValueError: ``state.json`` is missing or unreadable.
    """
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"checkpoint {path} is corrupt or incomplete: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ValueError(f"checkpoint {path} has a state.json without an integer step; it was edited or is not ours")
    aliases = state.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ValueError(f"checkpoint {path} has aliases={aliases!r}; allowed: an object of tensor names")
    return state


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint that ``latest`` points to, or None when the run has none."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    if not re.fullmatch(r"step_\d+", name):  # an edited pointer never leads out of the folder
        raise ValueError(f"checkpoint pointer {pointer} names {name[:80]!r}; allowed: a step_N folder beside it")
    path = root / name
    if not path.is_dir() or path.is_symlink():
        raise ValueError(f"checkpoint pointer {pointer} names {path.name}, which does not exist")
    return path


def load_checkpoint(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` and ``optimizer``, restore the RNG, and return its JSON state.

    ``prepare`` receives the JSON state before anything is loaded, e.g. to cut a freshly built model to the
    truncated shapes the checkpoint holds.

    Raises:
        ValueError: the checkpoint is corrupt or does not fit the model/optimizer.
    """
    try:
        weights = load_tensors(path / "model.safetensors")
        tensors = load_tensors(path / "state.safetensors")
    except ValueError as error:
        raise ValueError(f"checkpoint {path} is corrupt or incomplete: {error}") from None
    state = read_state(path)
    if "rng.torch" not in tensors:
        raise ValueError(f"checkpoint {path} is corrupt or incomplete: state.safetensors holds no 'rng.torch'")
    if prepare is not None:
        prepare(state)
    weights.update({alias: weights[name] for alias, name in state.get("aliases", {}).items() if name in weights})
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [k for k in expected.keys() & weights.keys() if expected[k].shape != weights[k].shape]
    if missing or extra or wrong:
        detail = f"missing {missing[:3]}, unexpected {extra[:3]}, wrong shape {wrong[:3]}"
        raise ValueError(f"checkpoint {path} does not match the model: {detail}")
    model.load_state_dict(weights)
    try:
        optimizer.load_state_dict(_unflatten(state["optimizer"], tensors))
    except (KeyError, ValueError, RuntimeError, TypeError, AttributeError) as error:  # an edited optimizer record
        raise ValueError(f"checkpoint {path} does not match the optimizer: {error}") from None
    torch.set_rng_state(tensors["rng.torch"])
    return state
