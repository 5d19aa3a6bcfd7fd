"""Why does CoMERA's BBC News classifier stay at the majority class? Two cheap checks (CPU, bert-small).

* ``--check gates``: the early-stage run of ``comera_experiment --parts classify`` (same data, lrs, γ, seed and batch
  order), printing every 25 steps the mean task loss, ``S(D)/S(start)``, the live gates and the smallest gate: do the
  rank gates die early and zero the model?
* ``--check overfit``: train on 32 fixed training articles (full batch) and print their training accuracy: can the
  model (TT layers, gates, [CLS] pooling, classifier head) learn at all?

Usage: ``OMP_NUM_THREADS=1 python benchmarks/comera_classify_diagnostic.py --check gates --method comera --steps 150``
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tensorslim.comera import CoMERAConfig, CoMERAObjective, model_size
from tensorslim.comera.gates import tt_layers
from tensorslim.comera_experiment import _classification_data, build, optimizer_for


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
    ids, mask, y, split, vocab, names = _classification_data(128)
    torch.manual_seed(0)
    model = build("bert-small", args.method, vocab_size=vocab, head="classify", n_classes=len(names))
    optimizer = optimizer_for(model, args.method, lr=5e-4, lr_cores=1e-3, lr_gates=1e-2)  # the experiment's lrs
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
