"""CoMERA's tensorization of a BERT-layout model (arXiv 2405.14377, §5: the table of tensorization settings).

Every attention and FFN projection and the classifier's ``fc1`` become 6-core TT layers (max rank 30), the word
embedding a 4-core TTM (rank 32, vocabulary 30,522 padded to 16·20·10·10); position/type embeddings, norms and the
classifier's ``fc2`` stay dense. CoMERA releases no MLM head; we tensorize its ``transform`` and ``lm_head`` decoder
with the same TT settings, which needs a vocabulary that factors (the MLM task pads it; ids never reach the padding
rows).
"""

from __future__ import annotations

from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.methods.lowrank import TT_RANK

EMBEDDING_RANK = 32  # hard-coded upstream
PAPER_VOCAB = (30522, 32000)  # the paper's vocabulary, possibly padded: rows factor as 16·20·10·10


def comera_filter(module: nn.Module, name: str) -> bool:
    """The layers CoMERA tensorizes: encoder projections and the classifier's ``fc1`` (not the 768×3 ``fc2``), plus
    (our addition, CoMERA releases no MLM head) the MLM head's ``transform`` and ``lm_head`` decoder."""
    return name.startswith("encoder.layers.") or name in ("classifier.fc1", "transform", "lm_head")


def comera_embedding_config(
    vocab_size: int, dim: int, *, rank: int = EMBEDDING_RANK, init: str = "random", rank_gates: bool = False
) -> TTEmbeddingConfig:
    """CoMERA's TTM embedding config: [16,20,10,10]×[4,4,8,6] for 30,522×768; automatic 4-mode factors otherwise."""
    rows = (16, 20, 10, 10) if PAPER_VOCAB[0] <= vocab_size <= PAPER_VOCAB[1] else None
    cols = (4, 4, 8, 6) if dim == 768 else None
    return TTEmbeddingConfig(rank=rank, row_factors=rows, col_factors=cols, init=init, rank_gates=rank_gates, n_cores=4)


def comera_(
    model: nn.Module,
    *,
    rank: int = TT_RANK,
    emb_rank: int = EMBEDDING_RANK,
    init: str = "random",
    rank_gates: bool = True,
) -> tuple[object, object]:
    """Tensorize a ``bert``-family model in place as CoMERA does; returns the two ``convert_`` reports.

    Args:
        model: a :class:`~tensorslim.models.bert.BertForMaskedLM` or
            :class:`~tensorslim.models.bert.BertForSequenceClassification`.
        rank: TT max rank of the linear layers (CoMERA ``--max-rank``, 30).
        emb_rank: TTM rank of the word embedding (hard-coded 32 upstream).
        init: ``"random"`` (CoMERA, training from scratch) or ``"tt_svd"`` (decompose existing weights).
        rank_gates: attach rank gates (§3) to every tensorized layer.
    """
    linear = convert_(model, TTConfig(rank=rank, init=init, rank_gates=rank_gates), filter_fn=comera_filter)
    embedding = model.encoder.embeddings
    emb_config = comera_embedding_config(
        embedding.word.num_embeddings,
        embedding.word.embedding_dim,
        rank=emb_rank,
        init="ttm_svd" if init == "tt_svd" else "random",
        rank_gates=rank_gates,
    )
    word = convert_(embedding, emb_config, filter_fn=lambda module, name: name == "word")
    return linear, word
