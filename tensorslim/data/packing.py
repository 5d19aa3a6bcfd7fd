"""Packing token streams into fixed-length blocks, the cached LM data set, and a resumable batch stream."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tensorslim.data.cache import atomic_path, cache_dir
from tensorslim.data.corpus import Corpus, load_corpus
from tensorslim.data.tokenizer import TextTokenizer, load_tokenizer

SPLITS = ("train", "validation")
_PACK_CHUNK = 4096  # documents tokenized at a time: bounds the memory of Python token lists


def pack(token_lists: list[list[int]], seq_len: int, *, eos_id: int) -> torch.Tensor:
    """Concatenates documents, each followed by ``eos_id``, and cuts the stream into full blocks.

    Blocks cross document boundaries (no padding); the tail shorter than ``seq_len`` is dropped.

    Args:
        token_lists: Token ids of each document.
        seq_len: Block length, > 0.
        eos_id: Token appended after every document.

    Returns:
        ``(N, seq_len)`` int64 blocks, ``N = total_tokens // seq_len`` (possibly 0).
    """
    _check_positive(seq_len=seq_len)
    return _blocks(_concat_with_eos(token_lists, eos_id=eos_id), seq_len)


@dataclass
class LMData:
    """Packed language-modelling data.

    Attributes:
        train: ``(N_train, seq_len)`` int64 training blocks.
        validation: ``(N_val, seq_len)`` int64 held-out blocks: the first ``max_val_blocks`` of the validation
            split, so the same fixed set is evaluated every time.
        tokenizer: The tokenizer that produced the ids.
        corpus: The source corpus.
    """

    train: torch.Tensor
    validation: torch.Tensor
    tokenizer: TextTokenizer
    corpus: Corpus


def build_lm_data(
    data: str,
    *,
    tokenizer: str | None,
    vocab_size: int,
    seq_len: int,
    max_val_blocks: int | None = None,
    batch_size: int | None = None,
    text_field: str = "text",
) -> LMData:
    """Loads a corpus, tokenizes both splits (cached) and packs them into blocks.

    Token ids of each split (documents joined by eos, independent of ``seq_len``) are cached as ``.npy`` under
    ``<cache>/tokens/`` keyed by the corpus fingerprint and the tokenizer identity, so only the first run pays for
    tokenization. Documents are tokenized a chunk at a time, so a table corpus is streamed from disk.

    Args:
        data: Corpus name or path (text files, a ``datasets`` folder, parquet), as for
            :func:`~tensorslim.data.corpus.load_corpus`.
        tokenizer: Tokenizer spec, as for :func:`~tensorslim.data.tokenizer.load_tokenizer`.
        vocab_size: BPE vocabulary size (ignored for a Hugging Face tokenizer).
        seq_len: Block length, > 0.
        max_val_blocks: Keep only the first this many validation blocks (> 0); ``None`` keeps all.
        batch_size: If given, also check that the train split fills at least one batch of this size.
        text_field: The .jsonl field or table column holding the text.

    Returns:
        The packed data.

    Raises:
        ValueError: Non-positive sizes, data that cannot be read (see ``load_corpus``), or a split too small for
            one validation block / one training batch.
    """
    _check_positive(seq_len=seq_len)
    if max_val_blocks is not None:
        _check_positive(max_val_blocks=max_val_blocks)
    if batch_size is not None:
        _check_positive(batch_size=batch_size)
    corpus = load_corpus(data, text_field=text_field)
    text_tokenizer = load_tokenizer(tokenizer, corpus, vocab_size=vocab_size)
    streams = _token_streams(corpus, text_tokenizer)
    _check_enough_tokens(data, streams, seq_len=seq_len, batch_size=batch_size or 1)
    validation = _blocks(streams["validation"], seq_len)
    if max_val_blocks is not None:
        validation = validation[:max_val_blocks]
    return LMData(
        train=_blocks(streams["train"], seq_len), validation=validation, tokenizer=text_tokenizer, corpus=corpus
    )


class BatchStream:
    """Deterministic, resumable stream of training batches.

    Epoch ``e`` visits the blocks in the order of ``torch.randperm(N)`` drawn from a generator seeded with
    ``seed + e``. The state is ``(epoch, position)``, so resuming from :meth:`state_dict` gives exactly the
    batches an uninterrupted run would have seen. A batch that runs past the end of an epoch is completed from
    the start of the next one, so every batch is full and no block is skipped.
    """

    def __init__(self, blocks: torch.Tensor, *, batch_size: int, seed: int) -> None:
        """Creates a stream at epoch 0, position 0.

        Args:
            blocks: ``(N, seq_len)`` token blocks.
            batch_size: Blocks per batch, ``0 < batch_size <= N``.
            seed: Base seed of the per-epoch permutations.

        Raises:
            ValueError: ``blocks`` not 2-D, ``batch_size <= 0``, or fewer than ``batch_size`` blocks.
        """
        _check_positive(batch_size=batch_size)
        if blocks.dim() != 2:
            raise ValueError(f"blocks must be 2-D (N, seq_len), got shape {tuple(blocks.shape)}")
        num_blocks, seq_len = blocks.shape
        if num_blocks < batch_size:
            raise ValueError(
                f"too few blocks for one batch: found {num_blocks} blocks of {seq_len} tokens "
                f"({num_blocks * seq_len} tokens); batch_size={batch_size} needs {batch_size * seq_len} tokens"
            )
        self.blocks = blocks
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order: torch.Tensor | None = None
        self._order_epoch = -1

    def next_batch(self) -> torch.Tensor:
        """The next ``(batch_size, seq_len)`` batch; crosses epoch boundaries seamlessly."""
        parts = []
        needed = self.batch_size
        while needed:
            taken = self._permutation()[self.position : self.position + needed]  # (<= needed,)
            parts.append(taken)
            needed -= len(taken)
            self.position += len(taken)
            if self.position == len(self.blocks):
                self.epoch, self.position = self.epoch + 1, 0
        return self.blocks[torch.cat(parts)]

    def state_dict(self) -> dict[str, int]:
        """Position in the stream, plus the seed and block count it is only valid for."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_blocks": len(self.blocks)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Moves to a position saved by :meth:`state_dict`.

        Raises:
            ValueError: The state is out of range, or was saved for another seed or number of blocks (resuming
                would then silently train on a different sequence of batches).
        """
        for key, expected in (("seed", self.seed), ("num_blocks", len(self.blocks))):
            if key in state and int(state[key]) != expected:
                raise ValueError(f"batch stream state has {key}={state[key]}, but this stream has {key}={expected}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self.blocks):
            raise ValueError(
                f"batch stream state epoch={epoch}, position={position} is out of range "
                f"(epoch >= 0, 0 <= position < {len(self.blocks)})"
            )
        self.epoch, self.position = epoch, position

    def _permutation(self) -> torch.Tensor:
        """This epoch's block order, drawn once per epoch."""
        if self._order_epoch != self.epoch:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            self._order = torch.randperm(len(self.blocks), generator=generator)
            self._order_epoch = self.epoch
        assert self._order is not None
        return self._order


# --- helpers -----------------------------------------------------------------------------------------------------


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name}={value} must be a positive integer")


def _concat_with_eos(token_lists: list[list[int]], *, eos_id: int, dtype: type = np.int64) -> np.ndarray:
    """One flat stream: every document followed by ``eos_id``."""
    stream = np.empty(sum(len(ids) + 1 for ids in token_lists), dtype=dtype)
    start = 0
    for ids in token_lists:
        stream[start : start + len(ids)] = ids
        start += len(ids)
        stream[start] = eos_id
        start += 1
    return stream


def _blocks(stream: np.ndarray, seq_len: int) -> torch.Tensor:
    """``(len(stream) // seq_len, seq_len)`` int64 blocks (a copy, so cached uint16 arrays become writable int64)."""
    num_blocks = len(stream) // seq_len
    return torch.from_numpy(stream[: num_blocks * seq_len].astype(np.int64).reshape(num_blocks, seq_len))


def _token_streams(corpus: Corpus, tokenizer: TextTokenizer) -> dict[str, np.ndarray]:
    """Each split's eos-joined token stream, from the cache or tokenized and cached."""
    key = hashlib.sha256(f"{corpus.fingerprint}\0{tokenizer.identity}".encode()).hexdigest()[:24]
    folder = cache_dir("tokens")
    # uint16 halves the cache (and its load time) whenever the ids fit, which they do for vocabularies <= 65,536.
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
    streams = {}
    for split in SPLITS:
        path = folder / f"{key}-{split}.npy"
        stream = _load_npy(path)
        if stream is None:
            stream = _encode_stream(tokenizer, getattr(corpus, split), dtype=dtype)
            with atomic_path(path) as tmp, open(tmp, "wb") as file:
                np.save(file, stream)
        streams[split] = stream
    return streams


def _encode_stream(tokenizer: TextTokenizer, documents: Iterable[str], *, dtype: type) -> np.ndarray:
    """The eos-joined token stream of ``documents``, tokenized :data:`_PACK_CHUNK` documents at a time."""
    remaining = iter(documents)
    parts = [np.empty(0, dtype=dtype)]
    while chunk := list(itertools.islice(remaining, _PACK_CHUNK)):
        parts.append(_concat_with_eos(tokenizer.encode_batch(chunk), eos_id=tokenizer.eos_id, dtype=dtype))
    return np.concatenate(parts)


def _load_npy(path: Path) -> np.ndarray | None:
    """A cached array, or None when missing or unreadable (a damaged entry is rebuilt, not fatal)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None


def _check_enough_tokens(data: str, streams: dict[str, np.ndarray], *, seq_len: int, batch_size: int) -> None:
    """Fails with the token counts when a split cannot fill its first batch / block."""
    for split, needed in (("train", batch_size * seq_len), ("validation", seq_len)):
        found = len(streams[split])
        if found < needed:
            what = f"one batch ({batch_size} x seq_len {seq_len})" if split == "train" else f"one block of {seq_len}"
            raise ValueError(
                f"data {data!r}: the {split} split has {found} tokens, but {what} needs {needed}; "
                "use more data or a smaller seq_len/batch_size"
            )
