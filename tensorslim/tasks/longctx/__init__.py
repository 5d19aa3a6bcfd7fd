"""Long-context tasks and evaluation: the ``longctx`` language model with needles, Attendre's ``lookahead``
classification, random-access reading (``readlm``, ``longqa``), streaming reads through a bounded attention memory
and the long-document evaluation of ``tensorslim longeval``. Importing this package registers the three task modules.

The memory layer family is :mod:`tensorslim.layers.memory`; the long documents and the reader are
:mod:`tensorslim.data.longctx`.
"""

from tensorslim.tasks.longctx import lm as lm
from tensorslim.tasks.longctx import lookahead as lookahead
from tensorslim.tasks.longctx import reading as reading
from tensorslim.tasks.longctx.streaming import StreamResult, generate, stream_logits, stream_nll

__all__ = ["StreamResult", "generate", "stream_logits", "stream_nll"]
