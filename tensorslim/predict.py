"""Predictions from a trained model: ``predictor(path)`` reads a run folder, its ``model/`` folder or a checkpoint and
returns a :class:`Predictor` for the run's task.

* ``classify`` and ``lookahead``: texts → the most likely label and every label's probability (``lookahead``'s labels
  are its cue words, ``false`` and ``true``);
* ``mlm``: texts with ``[MASK]`` → each mask's most likely token, and the text with the masks filled;
* ``lm`` (and the other causal-LM tasks: ``longctx``, ``readlm``): a prompt → its continuation
  (:func:`tensorslim.generation.generate`);
* ``longqa``: documents and a question → the answer word, read window by window with the run's reader
  (:func:`tensorslim.tasks.longctx.reading.answer_documents`);
* ``distill``: texts → the student's sentence embeddings (mean-pooled last hidden states, unit length, as
  all-MiniLM-L6-v2 embeds);
* ``segment``: images ``(H, W)`` in [0, 1] → foreground masks, with the network inputs the run trained on.

Inputs are encoded exactly as the run's task encoded its data (the same tokenizer, ``[CLS]``/``[PAD]``/``[MASK]`` ids
and sequence length), so a loaded model predicts what the trained one does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tensorslim.methods.build  # noqa: F401 - lets load_pretrained build the bases that training runs save
from tensorslim.pretrained import load_pretrained, locate_model

__all__ = ["Predictor", "load_pretrained", "predictor"]  # load_pretrained: with every training method's base known

MASK = "[MASK]"
QUESTION_PREFIX = "Question:"  # how the longqa task asks
LM_TASKS = ("lm", "longctx", "readlm")
CLASSIFY_TASKS = ("classify", "lookahead")
HF_TOKENIZER_TASKS = ("distill",)  # tasks that encode with a transformers tokenizer itself (special tokens, padding)


class Predictor:
    """A trained model with what its task needs to read raw inputs.

    Args:
        model: the model (in eval mode while predicting).
        task: the task it was trained on.
        tokenizer: the run's :class:`~tensorslim.data.tokenizer.TextTokenizer` (text tasks).
        labels: a classifier's class names, in logit order.
        seq_len: the run's sequence length (text is cut to it).
        task_options: the run's task options as a mapping (a segmentation run's ``inputs`` and ``image_size``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        task: str,
        tokenizer: Any = None,
        labels: list[str] | None = None,
        seq_len: int | None = None,
        task_options: dict[str, Any] | None = None,
    ) -> None:
        self.model = model.eval()
        self.task = task
        self.tokenizer = tokenizer
        self.labels = labels
        self.seq_len = seq_len
        self.task_options = task_options or {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _needs(self, *tasks: str) -> None:
        if self.task not in tasks:
            raise ValueError(f"this model was trained for task={self.task!r}; this prediction needs one of {tasks}")

    @torch.no_grad()
    def class_probabilities(self, texts: list[str]) -> torch.Tensor:
        """Class probabilities ``(N, n_classes)`` of ``texts``, encoded as the classify task encodes its data."""
        from tensorslim.tasks.base import logits_of
        from tensorslim.tasks.classify import encode, split_rows

        self._needs(*CLASSIFY_TASKS)
        rows, pad_id, _ = encode(list(texts), [0] * len(texts), self.tokenizer, seq_len=self.seq_len)
        ids, mask, _ = (t.to(self.device) for t in split_rows(rows, pad_id=pad_id))
        return torch.softmax(logits_of(self.model(ids, attention_mask=mask)).float(), dim=-1).cpu()

    def classify(self, texts: list[str]) -> list[dict[str, Any]]:
        """``{"text", "label", "probabilities": {label: p}}`` per text."""
        probabilities = self.class_probabilities(texts)
        names = self.labels or [str(i) for i in range(probabilities.shape[-1])]
        return [
            {
                "text": text,
                "label": names[int(row.argmax())],
                "probabilities": {name: round(float(p), 6) for name, p in zip(names, row, strict=True)},
            }
            for text, row in zip(texts, probabilities, strict=True)
        ]

    def _mask_id(self) -> int:
        from tensorslim.tasks.base import special_id

        own = special_id(self.tokenizer, MASK)
        return self.tokenizer.vocab_size if own is None else own  # as the mlm task: one id past the vocabulary

    @torch.no_grad()
    def fill_mask(self, texts: list[str]) -> list[dict[str, Any]]:
        """``{"text", "tokens": [each mask's most likely token], "filled"}`` per text holding ``[MASK]``."""
        from tensorslim.tasks.base import logits_of

        self._needs("mlm")
        mask_id, results = self._mask_id(), []
        for text in texts:
            pieces = text.split(MASK)
            if len(pieces) < 2:
                raise ValueError(f"text {text!r} holds no {MASK}; allowed: a text with at least one {MASK}")
            encoded = self.tokenizer.encode_batch(pieces)
            ids = list(encoded[0])
            for piece in encoded[1:]:
                ids += [mask_id, *piece]
            ids = torch.tensor([ids[: self.seq_len]], device=self.device)
            logits = logits_of(self.model(ids))[0]  # (T, V)
            positions = (ids[0] == mask_id).nonzero().flatten()
            vocab = self.tokenizer.vocab_size  # never predict the mask id itself
            tokens = [self.tokenizer.decode([int(logits[p, :vocab].argmax())]) for p in positions]
            filled = pieces[0] + "".join(t + rest for t, rest in zip(tokens, pieces[1 : len(tokens) + 1], strict=True))
            results.append({"text": text, "tokens": tokens, "filled": filled})
        return results

    def generate(self, prompt: str, **sampling: Any) -> str:
        """The continuation of ``prompt`` (``sampling``: :func:`tensorslim.generation.generate`'s settings)."""
        from tensorslim.generation import generate

        self._needs(*LM_TASKS)
        return generate(self.model, self.tokenizer, prompt, **sampling)

    @torch.no_grad()
    def answer(self, documents: list[str], question: str) -> list[dict[str, Any]]:
        """``{"question", "answer", "probabilities": {word: p}}`` per document: each answer word's highest probability
        in the windows the run's reader read, and the most probable word (see
        :func:`~tensorslim.tasks.longctx.reading.answer_documents`). The question is asked as the task asks it,
        ``"Question: what is the code word of John?"`` (``"Question: "`` is added when it is missing)."""
        from tensorslim.data.longctx.qa import answering_set
        from tensorslim.tasks.longctx.reading import LongQAOptions, answer_documents

        self._needs("longqa")
        if not question.startswith(QUESTION_PREFIX):
            question = f"{QUESTION_PREFIX} {question.strip()}"
        qa = answering_set(self.tokenizer, self.labels or [])
        found = answer_documents(
            self.model, qa, documents, question, LongQAOptions(**self.task_options), window=self.seq_len
        )
        return [
            {
                "question": question,
                "answer": qa.answer_words[choice],
                "probabilities": {word: round(p, 6) for word, p in zip(qa.answer_words, scores, strict=True)},
            }
            for choice, scores in zip(found.predictions, found.scores, strict=True)
        ]

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """Sentence embeddings ``(N, D)`` of ``texts``: the mean of the last hidden states over the text's tokens (cut
        to the run's ``seq_len``), scaled to unit length, as all-MiniLM-L6-v2 embeds and the distill task compares."""
        from tensorslim.quant.distill import mean_pooled
        from tensorslim.tasks.distill import encode_texts, split_rows

        self._needs("distill")
        rows = encode_texts(self.tokenizer, texts, seq_len=self.seq_len)
        ids, mask = (t.to(self.device) for t in split_rows(rows))
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        return torch.nn.functional.normalize(mean_pooled(hidden, mask), dim=-1).cpu()

    def segment_inputs(self, images: list[Any]) -> torch.Tensor:
        """The network inputs ``(N, C, H, W)`` of ``images`` (each ``(H, W)`` in [0, 1], the run's image size), as
        the segment task builds them (the image, and the global mask it derives from it)."""
        import numpy as np

        from tensorslim.data.segment.sets import Cases, network_inputs

        self._needs("segment")
        mode, size = self.task_options.get("inputs", "image"), self.task_options.get("image_size")
        if mode.endswith("prior"):
            raise ValueError(f"inputs={mode!r} needs the training set's prior; allowed: image, mask, image+mask")
        stack = np.stack([np.asarray(image, dtype=np.float32) for image in images])
        if size is not None and stack.shape[1:] != (size, size):
            raise ValueError(f"images of shape {stack.shape[1:]}; allowed: ({size}, {size}), the run's image size")
        cases = Cases(stack, np.zeros(stack.shape, dtype=bool), (1.0, 1.0))
        return torch.from_numpy(network_inputs(cases, mode, prior=np.zeros(stack.shape[1:], dtype=np.float32)))

    @torch.no_grad()
    def segment(self, images: list[Any]) -> torch.Tensor:
        """Foreground masks, bool ``(N, H, W)``, of ``images`` (see :meth:`segment_inputs`)."""
        from tensorslim.tasks.segment import predict

        return predict(self.model, self.segment_inputs(images))


def predictor(path: str | os.PathLike, *, device: str = "cpu") -> Predictor:
    """A ready :class:`Predictor` from a run folder, a run's ``model/`` folder or one of its checkpoints.

    Raises:
        ValueError: ``path`` holds no model, or a model saved without a run (no task recorded).
    """
    from tensorslim.data.tokenizer import load_tokenizer

    manifest, folder, _, _ = locate_model(path)
    run = manifest.get("run")
    if not isinstance(run, dict) or "task" not in run:
        raise ValueError(f"{path} holds a model but no run (its task); allowed: a folder written by a training run")
    model = load_pretrained(path, device=device)
    tokenizer = None
    if run.get("tokenizer") and run["task"] in HF_TOKENIZER_TASKS:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(Path(folder) / run["tokenizer"]), local_files_only=True)
    elif run.get("tokenizer"):
        tokenizer = load_tokenizer(str(Path(folder) / run["tokenizer"]), None)
    return Predictor(
        model,
        task=run["task"],
        tokenizer=tokenizer,
        labels=run.get("labels"),
        seq_len=run.get("seq_len"),
        task_options=run.get("task_options"),
    )
