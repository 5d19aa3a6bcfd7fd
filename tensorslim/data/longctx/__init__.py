"""Long-context data: long documents with needles (:mod:`~tensorslim.data.longctx.documents`), the synthetic
long-document QA set (:mod:`~tensorslim.data.longctx.qa`), and random-access reading (arXiv 2405.13216), which walks a
long document window by window and skips what the model already predicts well: the skip rule
(:mod:`~tensorslim.data.longctx.skip`), the reader and its training stream (:mod:`~tensorslim.data.longctx.reader`).
The tasks that train on them are in :mod:`tensorslim.tasks.longctx`."""

from tensorslim.data.longctx.reader import DocumentRecord, Reader, ReadingLog, ReadingStream, Span
from tensorslim.data.longctx.reader_config import POOLINGS, READERS, ReaderConfig
from tensorslim.data.longctx.skip import pool_losses, skip_length

__all__ = [
    "POOLINGS",
    "READERS",
    "DocumentRecord",
    "Reader",
    "ReaderConfig",
    "ReadingLog",
    "ReadingStream",
    "Span",
    "pool_losses",
    "skip_length",
]
