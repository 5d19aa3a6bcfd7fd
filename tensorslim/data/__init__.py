"""Data: built-in corpora, tokenizers, packing into fixed-length sequences."""

from tensorslim.data.bbcnews_titles import bbcnews_titles, low_resource_split
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
    "bbcnews_titles",
    "build_lm_data",
    "load_corpus",
    "load_tokenizer",
    "low_resource_split",
    "pack",
]
