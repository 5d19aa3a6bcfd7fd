"""A run folder that never loses work: one run at a time, never written over by another run unless asked.

A run takes its folder (:func:`claim`) before it writes anything there: it locks the folder itself with
``flock`` (the kernel releases the lock when the process ends, so a killed run leaves nothing stuck, and no lock
file is left behind), then checks what the folder holds. A folder with files is refused unless the run resumes it or
``overwrite`` replaces the run it holds; a folder that holds more than a run's outputs is never emptied.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# What a training run writes into its folder (``overwrite`` removes exactly these).
RUN_OUTPUTS = frozenset(
    {"checkpoints", "metrics.jsonl", "summary.json", "loss.png", "tensorboard", "model", "comera_ranks.json"}
)


class RunFolderError(ValueError):
    """The folder cannot take this run (in use, holds another run, or holds files that are not a run's)."""


@dataclass
class RunFolderLock:
    """A held run folder; :meth:`release` (or the end of the process) frees it."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def finished_state(run_dir: str | Path, steps: int) -> dict | None:
    """The state of the latest checkpoint when it reached ``steps`` and the run wrote its summary, else None."""
    from tensorslim.checkpoint import latest_checkpoint, read_state

    folder = Path(run_dir)
    checkpoint = latest_checkpoint(folder / "checkpoints") if (folder / "checkpoints").is_dir() else None
    if checkpoint is None or not (folder / "summary.json").is_file():
        return None
    state = read_state(checkpoint)
    return state if int(state["step"]) >= steps else None


def check(run_dir: str | Path, *, resume: bool, overwrite: bool, outputs_only: bool = False) -> None:
    """Refuse (one line) a run that would write over another run's files, or resume a folder that holds no
    checkpoint; reads the folder, changes nothing.

    ``outputs_only``: count only a run's outputs (the run's own set-up, e.g. a cache folder, may be there).
    """
    folder = Path(run_dir)
    if resume and overwrite:
        raise RunFolderError("resume=True and overwrite=True are both set; allowed: one of them")
    if resume:
        _require_checkpoint(folder)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise RunFolderError(f"out_dir={str(folder)!r} is not a folder; allowed: a folder path")
    entries = sorted(entry.name for entry in folder.iterdir())
    if outputs_only:
        entries = [name for name in entries if name in RUN_OUTPUTS]
    if not entries or resume:
        return
    if not overwrite:
        raise RunFolderError(
            f"out_dir={str(folder)!r} is not empty; allowed: --resume to continue its run, a new folder, or "
            "--overwrite to replace its run"
        )
    foreign = [name for name in entries if name not in RUN_OUTPUTS]
    if foreign:
        raise RunFolderError(
            f"out_dir={str(folder)!r} holds files that are not a run's ({', '.join(foreign[:5])}); --overwrite "
            f"only replaces a run's own outputs ({', '.join(sorted(RUN_OUTPUTS))}); allowed: a new folder"
        )


def _require_checkpoint(folder: Path) -> None:
    """Refuse to resume a folder that holds no checkpoint (before :func:`claim` would create the folder)."""
    from tensorslim.checkpoint import latest_checkpoint

    if latest_checkpoint(folder / "checkpoints") is None:
        raise RunFolderError(f"resume=True but {folder / 'checkpoints'} holds no checkpoint")


def claim(run_dir: str | Path, *, resume: bool, overwrite: bool) -> RunFolderLock:
    """Check the folder (:func:`check`), then create and lock it; with ``overwrite``, remove the old run's outputs.

    Raises:
        RunFolderError: another process holds the folder, or :func:`check` refuses it.
    """
    check(run_dir, resume=resume, overwrite=overwrite)  # before anything is created
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lock = RunFolderLock(folder, _lock(folder))
    try:
        # Again under the lock: another run may have written since (the run's own set-up may have, too).
        check(folder, resume=resume, overwrite=overwrite, outputs_only=True)
        if overwrite:
            for name in RUN_OUTPUTS:
                target = folder / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def _lock(folder: Path) -> int | None:
    """An exclusive ``flock`` on the folder itself (None where the platform has no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the checks above still apply
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunFolderError(
            f"out_dir={str(folder)!r} is in use by another run; allowed: wait for it to end, or a new folder"
        ) from None
    return fd
