"""Data: built-in corpora, tokenizers, packing into fixed-length sequences."""

from tensorslim.data.corpus import Corpus, bbcnews_labelled, bbcnews_split, load_corpus
from tensorslim.data.packing import BatchStream, LMData, build_lm_data, pack
from tensorslim.data.tokenizer import TextTokenizer, load_tokenizer

__all__ = [
    "BatchStream",
    "Corpus",
    "LMData",
    "TextTokenizer",
    "bbcnews_labelled",
    "bbcnews_split",
    "build_lm_data",
    "load_corpus",
    "load_tokenizer",
    "pack",
]
