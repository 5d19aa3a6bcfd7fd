"""Text generation from a causal language model: greedy, or sampling with temperature, top-k and top-p.

Top-k keeps the k most likely tokens (Fan, Lewis and Dauphin, 2018, "Hierarchical Neural Story Generation", arXiv
1805.04833, §5.4); top-p (nucleus) keeps the smallest set of most likely tokens whose probability reaches p (Holtzman
et al., 2020, "The Curious Case of Neural Text Degeneration", arXiv 1904.09751, §3.1). Temperature divides the logits
first, then top-k, then top-p, as Hugging Face's ``generate`` applies them.

A model with ``new_cache()`` (our LLaMA) decodes incrementally with its KV cache: the prompt once, then one token per
step. Any other causal LM (our GPT-2, a Hugging Face model) re-runs its forward on the whole sequence each step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from tensorslim.tasks.base import logits_of

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Sampling(TypedDict, total=False):
    """How :func:`generate` chooses tokens: the keyword arguments it passes on to :func:`generate_ids`."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    greedy: bool
    seed: int


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a one-line ``ValueError`` for a sampling setting out of range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid; allowed: an integer >= 0")
    if not isinstance(temperature, int | float) or not temperature > 0:
        raise ValueError(f"temperature={temperature!r} is invalid; allowed: a number > 0")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} is invalid; allowed: None or an integer >= 1")
    if top_p is not None and (not isinstance(top_p, int | float) or not 0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r} is invalid; allowed: None or a number in (0, 1]")


def filter_logits(logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """``logits`` ``(..., V)`` with the tokens outside top-k, then outside the top-p nucleus, set to ``-inf``.

    Top-k keeps every token whose logit ties the k-th largest. Top-p keeps the most likely tokens up to and
    including the first at which the cumulative probability reaches ``top_p`` (always at least one).
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # (..., V): probability of the tokens ranked above each one
        drop_sorted = before >= top_p  # the first token (before = 0) always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _context_length(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_seq_len", "n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _last_logits(output: Any) -> torch.Tensor:
    return logits_of(output)[:, -1].float()  # (B, V) of (B, T, V)


@torch.no_grad()
def generate_ids(
    model: nn.Module,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int = 0,
    eos_id: int | None = None,
) -> list[int]:
    """The token ids ``model`` generates after ``prompt_ids``.

    Stops after ``max_new_tokens``, after generating ``eos_id`` (which is included), or when the sequence fills the
    model's context (``config.max_seq_len``, ``n_positions`` or ``max_position_embeddings``). The model runs in eval
    mode and gets its own mode back.

    Args:
        model: a causal LM returning logits ``(B, T, V)`` (or an output with ``.logits``); with ``new_cache()`` it
            decodes with its KV cache.
        prompt_ids: the token ids to continue.
        max_new_tokens: at most this many tokens (fewer when the context fills up).
        temperature: divides the logits before sampling.
        top_k: sample only among the ``top_k`` most likely tokens (see :func:`filter_logits`).
        top_p: sample only within the top-p nucleus (see :func:`filter_logits`).
        greedy: take the most likely token (temperature, top-k and top-p are then irrelevant).
        seed: seed of the sampling generator, so a call is reproducible.
        eos_id: stop after generating this token.

    Raises:
        ValueError: invalid settings, an empty prompt, or a prompt that fills the context already.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    if not prompt_ids:
        raise ValueError("prompt_ids=[] is invalid; allowed: at least one token id")
    context = _context_length(model)
    if context is not None:
        if len(prompt_ids) >= context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; allowed: fewer than the context {context}")
        max_new_tokens = min(max_new_tokens, context - len(prompt_ids))
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    ids = torch.tensor([prompt_ids], device=device)  # (1, P)
    step_input = ids
    new: list[int] = []
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            output = model(step_input, cache=cache) if cache is not None else model(ids)
            logits = _last_logits(output)  # (1, V)
            if greedy:
                token = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
            else:
                probs = filter_logits(logits / temperature, top_k=top_k, top_p=top_p).softmax(dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)  # (1, 1)
            new.append(int(token))
            if eos_id is not None and new[-1] == eos_id:
                break
            ids = torch.cat([ids, token], dim=1)
            step_input = token
    finally:
        model.train(was_training)
    return new


def generate(
    model: nn.Module, tokenizer: Any, prompt: str, *, stop_at_eos: bool = True, **sampling: Unpack[Sampling]
) -> str:
    """The text ``model`` writes after ``prompt`` (the continuation only, without the end-of-text token).

    Args:
        model: a causal LM (see :func:`generate_ids`).
        tokenizer: a :class:`tensorslim.data.TextTokenizer` (e.g. a training run's BPE) or a Hugging Face tokenizer.
        prompt: the text to continue; an empty prompt starts from the end-of-text token (a document boundary).
        stop_at_eos: stop at the tokenizer's end-of-text token.
        sampling: ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``greedy``, ``seed``, as
            :func:`generate_ids` takes them (:class:`Sampling`).
    """
    from tensorslim.data.tokenizer import TextTokenizer

    if isinstance(tokenizer, TextTokenizer):
        ids, eos_id = tokenizer.encode_batch([prompt])[0], tokenizer.eos_id
    else:
        ids, eos_id = tokenizer.encode(prompt, add_special_tokens=False), tokenizer.eos_token_id
    if not ids and eos_id is None:
        raise ValueError("prompt='' needs a tokenizer with an end-of-text token to start from")
    new = generate_ids(model, ids or [eos_id], eos_id=eos_id if stop_at_eos else None, **sampling)
    if stop_at_eos and new and new[-1] == eos_id:
        new = new[:-1]
    return tokenizer.decode(new)
