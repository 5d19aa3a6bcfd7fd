"""Random-access reading (arXiv 2405.13216): walk a long document window by window and skip what the model already
predicts well. :mod:`~tensorslim.reading.skip` holds the skip rule, :mod:`~tensorslim.reading.reader` the reader and
its training stream; the tasks that train with it are in :mod:`tensorslim.tasks.reading`."""

from tensorslim.reading.config import POOLINGS, READERS, ReaderConfig
from tensorslim.reading.reader import DocumentRecord, Reader, ReadingLog, ReadingStream, Span
from tensorslim.reading.skip import pool_losses, skip_length

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
