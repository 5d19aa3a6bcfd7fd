"""Healing: distill a compressed model from the original one, so that it recovers what the conversion lost.

Follows QAT-TT's layer-by-layer curriculum (arXiv 2306.01076, :mod:`tensorslim.quant.distill`): the hidden states of
the first encoder layers are matched first, one more layer joins every ``steps_per_layer`` steps, and once all are on,
the sentence-embedding loss is added (end to end).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tensorslim.compression.calibration import Batch
from tensorslim.quant.distill import distill_loss, embedding_loss, layers_in_use


def heal(
    model: nn.Module,
    teacher: nn.Module,
    batches: Sequence[Batch],
    *,
    steps: int,
    lr: float = 1e-4,
    steps_per_layer: int | None = None,
    progress: bool = True,
) -> None:
    """Distill ``model`` from ``teacher`` for ``steps`` AdamW steps on ``batches`` (cycled), layer by layer then end
    to end (QAT-TT's curriculum, arXiv 2306.01076, the loss of :mod:`tensorslim.quant.distill`).

    Args:
        steps_per_layer: steps before one more encoder layer joins the loss; default: the first half of ``steps``
            walks through the layers, the second half trains end to end.
    """
    from tqdm.auto import tqdm

    n_layers = teacher.config.num_hidden_layers
    per_layer = steps_per_layer or max(1, steps // (2 * (n_layers + 1)))
    for net in (model, teacher):  # only eager attention returns attention probabilities
        if net.config._attn_implementation != "eager":
            net.set_attn_implementation("eager")
    teacher.eval().requires_grad_(False)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    for step in tqdm(range(steps), desc="healing", unit="step", disable=not progress):
        layer_use = layers_in_use(step, steps_per_layer=per_layer, n_layers=n_layers)
        batch = batches[step % len(batches)]
        student = model(**batch, output_hidden_states=True, output_attentions=True)
        with torch.no_grad():
            target = teacher(**batch, output_hidden_states=True, output_attentions=True)
        loss = distill_loss(
            student.hidden_states, target.hidden_states, student.attentions, target.attentions, layer_use=layer_use
        )
        if layer_use > n_layers:
            loss = loss + embedding_loss(student.hidden_states[-1], target.hidden_states[-1], batch["attention_mask"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
