"""``tt-qat``: tensor-train layers with quantization-aware training of their cores (QAT-TT, arXiv 2306.01076).

Every linear layer inside the encoder becomes a :class:`~tensorslim.layers.tt.TTLinear` (by TT-SVD of the trained
weights, or with random cores as the release does), optionally with the word embedding in TTM format, and every core
gets a learnable-scale LSQ quantizer (:func:`~tensorslim.quant.qat.prepare_qat_`). Paired with the ``distill`` task
it is the paper's student; with ``classify`` it is end-to-end QAT-TT training.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.convert import convert_
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.methods.registry import Method, MethodContext, register_method
from tensorslim.options import option
from tensorslim.quant.qat import QAT_MODES, QATConfig, prepare_qat_

QAT_CHOICES = ("none", *QAT_MODES)
INITS = ("tt_svd", "random")


@dataclass(frozen=True, kw_only=True)
class TTQATOptions:
    """The student's shape and precision (release: 4-bit cores, 8-bit intermediates)."""

    rank: int = option(16, "max TT rank of the encoder's linear layers")
    n_cores: int = option(4, "TT cores per linear layer (half input, half output modes)")
    init: str = option(
        "tt_svd", f"one of {INITS}: TT-SVD of the trained weights, or random cores (release)", flag="tt-init"
    )
    tt_embedding: bool = option(False, "also put the word embedding in TTM format")
    embedding_rank: int = option(32, "TTM rank of the word embedding")
    qat: str = option("weight", f"one of {QAT_CHOICES}: what is fake-quantized")
    bits: int = option(4, "core (and input) bits")
    bits_intermediate: int = option(8, "intermediate bits (weight+activation mode)")

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("rank", self.rank)
        require_int("n_cores", self.n_cores, minimum=2)
        require_int("embedding_rank", self.embedding_rank)
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r} is not supported; use one of {INITS}")
        if self.qat not in QAT_CHOICES:
            raise ValueError(f"qat={self.qat!r} is not supported; use one of {QAT_CHOICES}")
        self.qat_config()

    def qat_config(self) -> QATConfig | None:
        """The LSQ settings, or None when ``qat="none"``."""
        if self.qat == "none":
            return None
        return QATConfig(mode=self.qat, bits=self.bits, bits_intermediate=self.bits_intermediate)


def _in_encoder(module: nn.Module, name: str) -> bool:
    return isinstance(module, nn.Linear) and ".encoder." in f".{name}"


def convert_tt_qat(model: nn.Module, context: MethodContext) -> list:
    """TT (+ TTM embedding) layers from the model's weights, then QAT of every core; the conversion reports.

    A meta-device model (the books) has no weights to decompose: it takes random cores of the same shapes.
    """
    options: TTQATOptions = context.options
    decompose = options.init == "tt_svd" and not next(model.parameters()).is_meta
    tt = TTConfig(rank=options.rank, n_cores=options.n_cores, init="tt_svd" if decompose else "random")
    # The ranks are the method's options; a full-rank student (larger than dense) is a supported start.
    reports = [convert_(model, tt, filter_fn=_in_encoder, allow_larger=True)]
    if options.tt_embedding:
        embedding = TTEmbeddingConfig(rank=options.embedding_rank, init="ttm_svd" if decompose else "random")
        words = lambda m, n: n.endswith("word_embeddings")  # noqa: E731
        reports.append(convert_(model, embedding, filter_fn=words, allow_larger=True))
    qat = options.qat_config()
    if qat is not None:
        prepare_qat_(model, qat)
    return reports


register_method(
    Method(
        name="tt-qat",
        help="QAT-TT: encoder linears as TT cores (TT-SVD), LSQ-quantized to --bits (arXiv 2306.01076)",
        convert=convert_tt_qat,
        options=TTQATOptions,
        lr=1e-3,
        families=("hf-bert",),  # its filter names Hugging Face BERT's encoder layers
    )
)
