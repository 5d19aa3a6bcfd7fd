"""Why does CoMERA's BBC News classifier stay at the majority class? Two cheap checks (CPU, bert-small).

* ``--check gates``: an early-stage CoMERA run on BBC News (arXiv 2405.14377, §3: ``task + γ·R(D)``, γ = 0.01;
  CoMERA's learning rates rest 5e-4 / cores 1e-3 / gates 1e-2, [CLS] pooling), printing every 25 steps the mean
  task loss, ``S(D)/S(start)``, the live gates and the smallest gate: do the rank gates die early and zero the model?
* ``--check overfit``: train on 32 fixed training articles (full batch) and print their training accuracy: can the
  model (TT layers, gates, [CLS] pooling, classifier head) learn at all?

Usage: ``OMP_NUM_THREADS=1 python experiments/comera_classify_diagnostic.py --check gates --method comera --steps 150``
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tensorslim.data import bbcnews_labelled, bbcnews_split, load_corpus, load_tokenizer
from tensorslim.methods.comera import CoMERAConfig, CoMERAObjective, build_optimizer, comera_, model_size
from tensorslim.methods.comera.gates import tt_layers
from tensorslim.models.bert import BertConfig, BertForSequenceClassification, get_bert_preset
from tensorslim.tasks.classify import encode, split_rows


def _data(seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor], int, int]:
    """BBC News as the ``classify`` task encodes it: ``(ids, mask, labels, split, vocab, classes)``."""
    texts, labels, names = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    tokenizer = load_tokenizer(None, load_corpus("bbcnews"), vocab_size=4096)
    rows, pad_id, vocab = encode(texts, labels, tokenizer, seq_len=seq_len)
    ids, mask, y = split_rows(rows, pad_id=pad_id)
    return ids, mask, y, {"train": torch.tensor(train_idx), "test": torch.tensor(test_idx)}, vocab, len(names)


def _model(method: str, *, vocab: int, classes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``bert-small`` with [CLS] pooling (CoMERA's), tensorized with gates for ``comera``, and its optimizer."""
    base = get_bert_preset("bert-small").__dict__
    model = BertForSequenceClassification(
        BertConfig(**{**base, "vocab_size": vocab, "n_classes": classes, "pooling": "cls"})
    )
    if method == "dense":
        return model, torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    comera_(model)
    return model, build_optimizer(model, lr_cores=1e-3, lr_gates=1e-2, lr_other=5e-4)


def _gate_line(model: torch.nn.Module, start: float) -> str:
    gates = torch.cat([g.detach() for _, layer in tt_layers(model) for g in layer.gates])
    alive = int((gates > 1e-2).sum())
    return (
        f"size {float(model_size(model)) / start:.3f} alive {alive}/{gates.numel()} gate min {float(gates.min()):.3f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", choices=("gates", "overfit"), required=True)
    parser.add_argument("--method", choices=("dense", "comera"), default="comera")
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ids, mask, y, split, vocab, classes = _data(128)
    torch.manual_seed(0)
    model, optimizer = _model(args.method, vocab=vocab, classes=classes)
    objective = CoMERAObjective(CoMERAConfig()) if args.method == "comera" else None
    start = float(model_size(model)) if args.method == "comera" else 1.0
    gen = torch.Generator().manual_seed(0)
    fixed = split["train"][:32]
    losses: list[float] = []
    for step in range(1, args.steps + 1):
        pick = (
            fixed
            if args.check == "overfit"
            else split["train"][torch.randint(len(split["train"]), (16,), generator=gen)]
        )
        task = F.cross_entropy(model(ids[pick], attention_mask=mask[pick]), y[pick])
        loss = objective.early(task, model)[0] if objective is not None else task
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(task.item())
        if step % 25 == 0 and args.check == "gates":
            gates = _gate_line(model, start) if objective is not None else ""
            print(f"{args.method} step {step} loss(25-step mean) {sum(losses[-25:]) / 25:.3f} {gates}", flush=True)
        if step % 20 == 0 and args.check == "overfit":
            model.eval()
            with torch.no_grad():
                acc = float((model(ids[fixed], attention_mask=mask[fixed]).argmax(-1) == y[fixed]).float().mean())
            model.train()
            print(f"{args.method} step {step} train loss {task.item():.3f} accuracy on the 32 articles {acc:.3f}")


if __name__ == "__main__":
    main()
