"""The one result writer of the benchmark scripts: every result file says what ran, on which CPU, when, and how busy
the machine was, then holds its Markdown tables (and, beside it, the raw figures as JSON).

A script builds its body with :func:`table` and writes it with :func:`write`::

    from _results import table, write

    lines = table(["case", "median ms"], [["dense", "1.20"], ["cola", "0.80"]])
    write(Path(args.out), "TT layer vs dense", lines, data=result)

Scripts run as ``python benchmarks/<script>.py``, so this file is importable by its bare name.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CPU_FLAGS = ("avx512_bf16", "amx_tile")  # what decides whether bf16 matmuls are fast on a CPU


def cpu_kind() -> str:
    """The CPU's model name and which of :data:`CPU_FLAGS` it has, e.g. ``"AMD EPYC 9R14 (avx512_bf16)"``."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = text.splitlines()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    found = [flag for flag in CPU_FLAGS if flag in flags]
    return (
        f"{name or platform.processor() or platform.machine()} ({', '.join(found) or 'no ' + ', no '.join(CPU_FLAGS)})"
    )


def machine() -> dict[str, Any]:
    """Where and when a measurement ran: CPU kind, cores, load average, versions, UTC date."""
    import torch

    return {
        "cpu": cpu_kind(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
    }


# Environment variables that change what a benchmark measures; a command line names those that are set.
COMMAND_ENV = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "LD_PRELOAD",
    "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE",
    "HF_HUB_OFFLINE",
    # these three limit the instructions PyTorch, oneDNN and MKL use: an AVX-512 machine measures as an AVX2 one
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
)


def command() -> str:
    """The command line that started this process, as a user would type it: the :data:`COMMAND_ENV` that are set,
    then ``python`` or ``torchrun --nproc-per-node N``, then the script and its arguments."""
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in COMMAND_ENV if name in os.environ]
    launcher = "python"
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun, which sets these for every process it starts
        launcher = f"torchrun --nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', '?')}"
    return " ".join([*env, launcher, shlex.join(sys.argv)])


def header(title: str, *, info: dict[str, Any] | None = None, notes: Sequence[str] = ()) -> list[str]:
    """The opening lines of a result file: title, command, date, CPU kind, load (the machine may be shared)."""
    info = info or machine()
    return [
        f"# {title}",
        "",
        f"- command: `{command()}`",
        f"- date: {info['date']}; torch {info['torch']}, Python {info['python']}",
        f"- CPU: {info['cpu']}; {info['cores']} cores, {info['torch_threads']} torch threads",
        f"- load average (1, 5, 15 min) when written: {info['load_average']} (other jobs may share the machine)",
        *(f"- {note}" for note in notes),
        "",
    ]


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table: one header row, then one row per entry of ``rows`` (cells shown with ``str``)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def result_stem(path: Path | str) -> Path:
    """The stem of a result that ``path`` names: the ``.md`` file, the ``.json`` file or the stem itself."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".md", ".json") else path


def read(path: Path | str) -> dict[str, Any] | None:
    """The JSON record (command, machine, result) that :func:`write` left for the result ``path`` names, or None."""
    stem = result_stem(path)
    record = stem.with_name(stem.name + ".json")
    return json.loads(record.read_text()) if record.is_file() else None


def write(path: Path, title: str, body: Sequence[str], *, data: Any = None, notes: Sequence[str] = ()) -> Path:
    """Write ``<path>.md`` (header + ``body``) and, when ``data`` is given, ``<path>.json`` with the machine record.

    ``path`` may name the ``.md`` file or its stem; its folder is made if missing. Returns the Markdown file.
    """
    stem = result_stem(path)
    stem.parent.mkdir(parents=True, exist_ok=True)
    info = machine()
    markdown = stem.with_name(stem.name + ".md")
    markdown.write_text("\n".join([*header(title, info=info, notes=notes), *body]).rstrip("\n") + "\n")
    if data is not None:
        record = {"command": command(), "machine": info, "result": data}
        stem.with_name(stem.name + ".json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return markdown
