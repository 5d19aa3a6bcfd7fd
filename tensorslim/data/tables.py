"""Tables of documents: a Hugging Face ``datasets`` folder, parquet files, or Arrow IPC files, read with pyarrow.

A ``Dataset.save_to_disk`` folder holds Arrow IPC stream files (``data-00000-of-0000N.arrow``, listed in its
``state.json``) next to ``dataset_info.json``; ``Dataset.to_parquet`` writes parquet. Either way only the text
column is read, and only :data:`BATCH_ROWS` rows at a time become Python strings, so a table larger than memory is
never loaded whole. Reading needs ``pyarrow`` only (a dependency of ``datasets``), not ``datasets`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BATCH_ROWS = 1024  # rows converted to Python strings at a time


def dataset_folder_files(folder: Path, *, data: str) -> list[Path] | None:
    """The data files a ``save_to_disk`` folder lists in its ``state.json``, or None for any other folder.

    Raises:
        ValueError: ``folder`` holds a whole ``DatasetDict`` (one sub-folder per split), or a listed file is missing.
    """
    splits_file = folder / "dataset_dict.json"
    if splits_file.is_file():
        splits = _json(splits_file).get("splits") or sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise ValueError(
            f"data {data!r} is a DatasetDict with splits {', '.join(map(repr, splits))}; "
            f"pass one split's folder, e.g. {str(folder / splits[0])!r}"
        )
    state_file = folder / "state.json"
    if not state_file.is_file():
        return None
    listed = _json(state_file).get("_data_files")
    if not isinstance(listed, list) or not listed:
        return None
    files = [folder / entry["filename"] for entry in listed]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        raise ValueError(f"data {data!r}: state.json lists {missing[0]!r}, which is missing")
    return files


def check_text_field(files: list[tuple[str, Path]], *, text_field: str, data: str) -> None:
    """Checks that every table has a string column ``text_field``.

    Raises:
        ValueError: A file is unreadable, or lacks that string column; the message lists its string columns.
    """
    pa = _pyarrow()
    for key, path in files:
        schema = _schema(path, data=data)
        strings = [f.name for f in schema if _is_string(pa, f.type)]
        if text_field in strings:
            continue
        have = f"its string columns are {', '.join(map(repr, strings))}" if strings else "it has no string column"
        raise ValueError(
            f"data {data!r}: table {key!r} has no string column {text_field!r}; {have} (choose one as the text field)"
        )


def text_batches(files: list[tuple[str, Path]], *, text_field: str) -> Iterator[tuple[str, list[str | None]]]:
    """The ``text_field`` column of each table in turn, at most :data:`BATCH_ROWS` values at a time.

    Args:
        files: ``(key, path)`` of each table, read in this order.
        text_field: A string column present in every table (see :func:`check_text_field`).

    Yields:
        ``(key, texts)``: the file's key and the next values of its column, None for a null.
    """
    for key, path in files:
        for column in _columns(path, text_field):
            for start in range(0, len(column), BATCH_ROWS):
                yield key, column.slice(start, BATCH_ROWS).to_pylist()


# --- pyarrow -----------------------------------------------------------------------------------------------------


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ValueError("reading parquet or a datasets folder needs pyarrow: pip install datasets") from None
    return pyarrow


def _is_string(pa: Any, type_: Any) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_)


def _schema(path: Path, *, data: str) -> Any:
    """The table's schema, read from the parquet footer or the Arrow IPC header (no data is read)."""
    pa = _pyarrow()
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).schema_arrow
        with pa.memory_map(str(path)) as source:
            return _arrow_reader(pa, source).schema
    except (pa.ArrowException, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"data {data!r}: cannot read {str(path)!r} as a table ({reason})") from None


def _columns(path: Path, text_field: str) -> Iterator[Any]:
    """The column ``text_field``, one record batch at a time."""
    pa = _pyarrow()
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=[text_field]):
            yield batch.column(0)
        return
    # Memory-mapped: a record batch's other columns are never paged in.
    with pa.memory_map(str(path)) as source:
        reader = _arrow_reader(pa, source)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        for batch in batches:
            yield batch.column(text_field)


def _arrow_reader(pa: Any, source: Any) -> Any:
    """A reader for the IPC stream format (what ``save_to_disk`` writes), else the IPC file format (Feather v2)."""
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
