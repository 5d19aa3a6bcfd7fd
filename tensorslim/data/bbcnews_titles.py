"""BBC News topic classification from article titles (the first line of each article), duplicates dropped.

Full articles are too easy for a few-shot comparison (TF-IDF + logistic regression reaches 85 % at 100 examples and
97 % at 1,000); titles leave headroom. The corpus holds 98 articles whose text repeats another's; they are dropped
(the first copy is kept) before the fixed stratified split of :func:`tensorslim.data.bbcnews_split`, so no title
is both trained on and tested.
"""

from __future__ import annotations

import torch

from tensorslim.data.corpus import bbcnews_labelled, bbcnews_split


def bbcnews_titles() -> tuple[list[str], list[int], list[str], list[int], list[int]]:
    """``(titles, labels, class_names, train_indices, test_indices)`` of the 2,127 distinct BBC articles."""
    texts, labels, names = bbcnews_labelled()
    train, test = bbcnews_split()
    seen: set[str] = set()
    kept: list[int] = []
    for i, text in enumerate(texts):
        key = " ".join(text.split())
        if key not in seen:
            seen.add(key)
            kept.append(i)
    new_index = {old: new for new, old in enumerate(kept)}
    titles = [texts[i].strip().split("\n", 1)[0].strip() for i in kept]
    return (
        titles,
        [labels[i] for i in kept],
        names,
        [new_index[i] for i in train if i in new_index],
        [new_index[i] for i in test if i in new_index],
    )


def low_resource_split(pool: list[int], *, train_size: int, dev_size: int, seed: int) -> tuple[list[int], list[int]]:
    """``(train, dev)`` drawn from ``pool`` by a permutation seeded with ``seed``: the first ``dev_size`` go to dev,
    the next ``train_size`` (0: all the rest) to train (UniPELT's low-resource protocol, arXiv 2110.07577 §4.1)."""
    if dev_size + train_size > len(pool) or dev_size < 0 or train_size < 0:
        raise ValueError(
            f"train_size={train_size} + dev_size={dev_size} is invalid; allowed: sizes >= 0 summing to at most "
            f"{len(pool)} (the training pool)"
        )
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [pool[i] for i in order]
    dev = shuffled[:dev_size]
    rest = shuffled[dev_size:]
    return (rest[:train_size] if train_size else rest), dev
