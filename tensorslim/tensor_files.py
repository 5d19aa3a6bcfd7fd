"""Safetensors files that know their own contents: each records the SHA-256 of its tensors in its metadata, and
reading one checks it, so a flipped bit or a cut file is an error rather than a silently different model. Every
weights file tensorslim writes (saved models, run models, checkpoints, adapters) goes through here; nothing is
unpickled."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

_DIGEST = "tensorslim.sha256"  # safetensors metadata key: the weights_fingerprint of the file's tensors


def weights_fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of ``tensors``: their names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, *, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (contiguous, no shared storage) to the safetensors file ``path``, their
    :func:`weights_fingerprint` in its metadata beside ``metadata``, for :func:`load_tensors` to check."""
    save_file(tensors, path, metadata={**(metadata or {}), _DIGEST: weights_fingerprint(tensors)})


def load_tensors(path: Path, *, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path``, checked against the SHA-256 its metadata records (a file written
    without one, by an older version or another tool, is read unchecked). Read once; never unpickled.

    Raises:
        ValueError: the file is missing, unreadable or truncated, or its tensors are not the ones it was written with.
    """
    try:
        with safe_open(path, framework="pt") as handle:
            expected = (handle.metadata() or {}).get(_DIGEST)
            tensors = handle.get_tensors()
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{path} is missing or corrupt: {error}") from None
    if expected is not None and (found := weights_fingerprint(tensors)) != expected:
        raise ValueError(
            f"{path} is corrupt: its tensors have SHA-256 {found[:16]}…, the file was written with {expected[:16]}…; "
            "allowed: the file as saved (it was damaged or edited since)"
        )
    return {name: tensor.to(device) for name, tensor in tensors.items()}
