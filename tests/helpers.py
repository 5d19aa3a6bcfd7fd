"""Shared tiny shapes for tests."""

from __future__ import annotations

from tensorslim.models.llama import LlamaConfig

TINY_LLAMA = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=172, vocab_size=256, max_seq_len=64)


def tiny_hf_bert() -> object:
    """A two-layer Hugging Face ``BertModel`` (hidden 32, no pooler), seeded, in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def train_until_interrupted(config: object, *, after_step: int) -> None:
    """Run ``config`` and stop it with a KeyboardInterrupt once step ``after_step`` is logged (as Ctrl-C would, after
    the step's checkpoint, if any, was written)."""
    import pytest

    from tensorslim.train.trainer import train

    def stop(record: dict) -> None:
        if record["step"] == after_step:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, on_step=stop)
