"""FLOP books of models whose forward returns a Hugging Face output (``.logits``) rather than a tensor."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from tensorslim.books import count_flops


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))  # (B, T, 4)


class _HuggingFaceStyle(_Plain):
    def forward(self, ids: torch.Tensor) -> SequenceClassifierOutput:  # type: ignore[override]
        return SequenceClassifierOutput(logits=super().forward(ids))


def test_backward_flops_of_a_hugging_face_output_equal_the_plain_models() -> None:
    ids = torch.randint(50, (2, 8))
    forward = 2 * ids.numel() * 16 * 4  # the head's matmul; the embedding lookup is no matmul
    assert count_flops(_Plain(), ids) == count_flops(_HuggingFaceStyle(), ids) == forward
    plain = count_flops(_Plain(), ids, backward=True)
    assert plain > forward
    assert count_flops(_HuggingFaceStyle(), ids, backward=True) == plain  # was an AttributeError: no .float()
