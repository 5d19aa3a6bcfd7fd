"""Tokenizers: a byte-level BPE trained on (and cached per) corpus, or a local Hugging Face tokenizer.

Both are wrapped in :class:`TextTokenizer`, which encodes plain text only (no special tokens are added, and text
that spells a special token is encoded as ordinary text), so the only end-of-document marks in the token stream
are the ones :func:`tensorslim.data.packing.pack` inserts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tensorslim.data.cache import atomic_path, cache_dir
from tensorslim.data.corpus import Corpus

EOS_TOKEN = "<|endoftext|>"
MIN_BPE_VOCAB = 256 + 1  # the 256 byte tokens plus the end-of-text token
# Part of the cache key: bump it whenever _train_bpe changes, so old cached tokenizers are not reused.
BPE_RECIPE = "bytebpe-v1"
_ENCODE_CHUNK = 64  # documents per encode call: bounds the memory of the intermediate Encoding objects
# Tried in order when a bare tokenizer.json comes without a config naming its eos/sep token.
_EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|im_end|>")
_HF_ALLOWED = "a tokenizer.json file, or a local Hugging Face tokenizer folder"


class TextTokenizer:
    """A thin wrapper giving a `tokenizers.Tokenizer` or a transformers tokenizer one interface.

    Attributes:
        name: Human-readable name, e.g. ``"bpe4096:stdlib"`` or the tokenizer path.
        vocab_size: One more than the largest token id, i.e. the embedding rows a model needs.
        eos_id: Id of the end-of-document token that packing appends to every document.
        identity: Stable string naming the exact tokenization; part of token-cache keys.
        backend: The wrapped tokenizer object.
    """

    def __init__(self, backend: Any, *, name: str, eos_id: int, identity: str) -> None:
        """Wraps ``backend``.

        Args:
            backend: A ``tokenizers.Tokenizer`` or a transformers ``PreTrainedTokenizerBase``.
            name: Human-readable name.
            eos_id: End-of-document token id.
            identity: Stable identity string for cache keys.
        """
        import tokenizers

        self.backend = backend
        self.name = name
        self.eos_id = eos_id
        self.identity = identity
        self._fast = isinstance(backend, tokenizers.Tokenizer)
        vocab = backend.get_vocab(with_added_tokens=True) if self._fast else backend.get_vocab()
        self.vocab_size = max(vocab.values()) + 1

    def __repr__(self) -> str:
        return f"TextTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids of each text, without any special tokens added; ``texts`` is read once, in order."""
        ids: list[list[int]] = []
        remaining = iter(texts)
        while chunk := list(itertools.islice(remaining, _ENCODE_CHUNK)):
            ids += self._encode_chunk(chunk)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens (e.g. eos between packed documents) are kept as text."""
        if self._fast:
            return self.backend.decode(ids, skip_special_tokens=False)
        return self.backend.decode(ids)

    def _encode_chunk(self, texts: list[str]) -> list[list[int]]:
        if not self._fast:
            # verbose=False: long documents are fine here (they are packed), so skip the max-length warning.
            return self.backend(texts, add_special_tokens=False, verbose=False)["input_ids"]
        # encode_batch_fast (tokenizers >= 0.21) skips offset tracking, which we never use.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]


def load_tokenizer(spec: str | None, corpus: Corpus, *, vocab_size: int = 4096) -> TextTokenizer:
    """Loads or trains the tokenizer for ``corpus``.

    Args:
        spec: ``None`` for a byte-level BPE trained on ``corpus.train`` (eos ``<|endoftext|>``), cached as JSON
            under ``<cache>/tokenizers/`` keyed by the corpus fingerprint and ``vocab_size``. Otherwise a local
            path: a ``tokenizer.json`` file, a folder holding one, or a folder that transformers'
            ``AutoTokenizer`` loads with ``local_files_only=True``; its eos token (else its sep token) ends
            documents.
        corpus: The corpus whose train split a BPE is trained on.
        vocab_size: BPE vocabulary size including the 256 bytes and eos; ignored for a path ``spec``.

    Returns:
        The wrapped tokenizer.

    Raises:
        ValueError: ``vocab_size`` below 257, or a path that is missing or holds no usable tokenizer.
    """
    if spec is None:
        return _cached_bpe(corpus, vocab_size=vocab_size)
    return _load_hf(spec)


# --- byte-level BPE ----------------------------------------------------------------------------------------------


def _cached_bpe(corpus: Corpus, *, vocab_size: int) -> TextTokenizer:
    """The corpus's BPE from the cache, training and caching it on a miss."""
    import tokenizers

    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs >= {MIN_BPE_VOCAB}")
    if not corpus.train:
        raise ValueError(f"corpus {corpus.name!r} has no training documents to train a tokenizer on")
    identity = f"{BPE_RECIPE}-{corpus.fingerprint[:24]}-{vocab_size}"
    path = cache_dir("tokenizers") / f"{identity}.json"
    backend = None
    if path.exists():
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception:  # a damaged cache entry is simply rebuilt
            backend = None
    if backend is None:
        backend = _train_bpe(corpus.train, vocab_size=vocab_size)
        with atomic_path(path) as tmp:
            backend.save(str(tmp))
    backend.encode_special_tokens = True
    eos_id = backend.token_to_id(EOS_TOKEN)
    return TextTokenizer(backend, name=f"bpe{vocab_size}:{corpus.name}", eos_id=eos_id, identity=identity)


def _train_bpe(texts: Sequence[str], *, vocab_size: int) -> Any:
    """Trains a GPT-2-style byte-level BPE (lossless: ``decode(encode(x)) == x`` for any text).

    No normalizer and no prefix space, so nothing is changed on the way in; the 256-byte initial alphabet means
    there is never an unknown token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


# --- Hugging Face tokenizers -------------------------------------------------------------------------------------


def _load_hf(spec: str) -> TextTokenizer:
    """A tokenizer from a local tokenizer.json file or Hugging Face folder."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"tokenizer {spec!r} does not exist; expected {_HF_ALLOWED}")
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"tokenizer {spec!r} is not a .json file; expected {_HF_ALLOWED}")
        return _load_tokenizer_json(path, name=spec)
    if (path / "tokenizer.json").is_file():
        return _load_tokenizer_json(path / "tokenizer.json", name=spec)
    return _load_auto_tokenizer(path, name=spec)


def _load_tokenizer_json(path: Path, *, name: str) -> TextTokenizer:
    """A tokenizer.json through the `tokenizers` library: faster to load than transformers, and no import of it."""
    import tokenizers

    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for bad files
        raise ValueError(f"tokenizer {name!r}: cannot read {path.name} ({err}); expected {_HF_ALLOWED}") from None
    # Hub tokenizer.json files often switch on truncation/padding (MiniLM: 128), which would cut documents.
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True
    eos = _declared_eos(path.parent) or next((t for t in _EOS_CANDIDATES if backend.token_to_id(t) is not None), None)
    eos_id = None if eos is None else backend.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"tokenizer {name!r} has no eos or sep token to end documents with")
    identity = "hf-" + hashlib.sha256(f"{backend.to_str()}\0{eos}".encode()).hexdigest()[:24]
    return TextTokenizer(backend, name=name, eos_id=eos_id, identity=identity)


def _declared_eos(folder: Path) -> str | None:
    """The eos (else sep) token named by a Hugging Face folder's tokenizer_config/special_tokens_map, if any."""
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            config = json.loads((folder / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for field in ("eos_token", "sep_token"):
            token = config.get(field) if isinstance(config, dict) else None
            if isinstance(token, dict):  # AddedToken serialised as {"content": ..., ...}
                token = token.get("content")
            if isinstance(token, str) and token:
                return token
    return None


def _load_auto_tokenizer(path: Path, *, name: str) -> TextTokenizer:
    """A folder without tokenizer.json (e.g. vocab.txt + config) through transformers' AutoTokenizer."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"tokenizer {name!r} has no tokenizer.json; loading it needs `transformers`") from None
    try:
        backend = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"tokenizer {name!r} cannot be loaded ({reason}); expected {_HF_ALLOWED}") from None
    eos_id = backend.eos_token_id if backend.eos_token_id is not None else backend.sep_token_id
    if eos_id is None:
        raise ValueError(f"tokenizer {name!r} has no eos or sep token to end documents with")
    return TextTokenizer(backend, name=name, eos_id=eos_id, identity=_folder_identity(path, eos_id=eos_id))


def _folder_identity(path: Path, *, eos_id: int) -> str:
    """Hash of a tokenizer folder's small files (vocab, merges, configs), skipping model weights."""
    digest = hashlib.sha256(f"{eos_id}".encode())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        if file.suffix in {".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt", ".gguf"}:
            continue
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return "hf-" + digest.hexdigest()[:24]
