"""The LLaMA KV cache's buffers: appending returns what a concatenation would, without reallocating per token."""

from __future__ import annotations

import torch

from tensorslim.models.llama import LayerKV


def test_appends_equal_the_concatenation_and_grow_by_doubling() -> None:
    gen = torch.Generator().manual_seed(0)
    kv, appended, buffers = LayerKV(), [], set()
    for size in [5, 1, 1, 3] + [1] * 20:
        keys, values = torch.randn(2, 3, size, 4, generator=gen), torch.randn(2, 3, size, 4, generator=gen)
        appended.append((keys, values))
        got_keys, got_values = kv.append(keys, values)
        buffers.add(kv._keys.data_ptr())
        torch.testing.assert_close(got_keys, torch.cat([k for k, _ in appended], dim=2), rtol=0, atol=0)
        torch.testing.assert_close(got_values, torch.cat([v for _, v in appended], dim=2), rtol=0, atol=0)
    assert kv.length == 30 and kv.keys.shape == (2, 3, 30, 4)
    assert len(buffers) <= 4  # 5 -> 10 -> 20 -> 40 tokens of room, not one buffer per append
    assert kv.nbytes == 2 * kv._keys.numel() * 4 >= 2 * 30 * 2 * 3 * 4 * 4
