"""On-disk cache location and atomic writes shared by the tokenizer and token-id caches."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "TENSORSLIM_CACHE"


def cache_dir(*parts: str) -> Path:
    """Returns (and creates) a folder in the tensorslim cache.

    Args:
        *parts: Sub-folder names under the cache root, e.g. ``("tokenizers",)``.

    Returns:
        ``$TENSORSLIM_CACHE/<parts>`` when that variable is set, else the platform's user cache dir
        (``~/.cache/tensorslim`` on Linux) joined with ``parts``.
    """
    root = os.environ.get(CACHE_ENV)
    if not root:
        # Imported here so that importing tensorslim.data does no work beyond defining names.
        import platformdirs

        root = platformdirs.user_cache_dir("tensorslim")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yields a temporary path next to ``target`` that replaces ``target`` only if the block succeeds.

    Readers therefore never see a half-written cache file, even when two runs fill the same entry at once
    (the last ``os.replace`` wins, and both wrote the same content).

    Args:
        target: The final file path.

    Yields:
        A fresh temporary path in the same folder (same filesystem, so ``os.replace`` is atomic).
    """
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
