"""What to put on a frozen model, as plain data: gated LoRA, gated prefix tuning, gated bottleneck adapter, prompt.

Defaults follow the official UniPELT code (Mao et al., ACL 2022, arXiv 2110.07577; ``run_glue.py``): prefix length
10 through a 512-wide MLP, LoRA r 8 / α 16 on ``W_q`` and ``W_v``, adapter reduction factor 16, every gate on. The
prompt (Lester et al., 2021, arXiv 2104.08691) is the layer arXiv 2405.05493 adds to UniPELT; it has no gate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tensorslim._checks import check_fields, require_int

# The query and value projections' names: Hugging Face BERT-family models, our BERT, our LLaMA (and HF LLaMA's).
QUERY_VALUE = (("query", "value"), ("q", "v"), ("q_proj", "v_proj"))


@dataclass(frozen=True, kw_only=True)
class GatedLoRAConfig:
    """LoRA on the named linears; with ``gate`` the update is scaled by ``mean_t σ(w·x_t + b)`` instead of α/r.

    Attributes:
        rank: adapter rank r.
        alpha: the ungated scale numerator (update ``(alpha / rank)·B·A·x``).
        targets: last name components of the ``nn.Linear`` layers to adapt; None: the attention's query and value
            projections (UniPELT's ``W_q``, ``W_v``) under the first of :data:`QUERY_VALUE` names the model has.
        gate: scale the update by a learned gate (UniPELT §3) rather than α/r.
        dropout: dropout on the adapter input.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] | None = None
    gate: bool = True
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("rank", self.rank)
        if self.targets is not None and not self.targets:
            raise ValueError("targets=() is invalid; allowed: None or a non-empty tuple of layer names")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} is invalid; allowed: [0, 1)")


@dataclass(frozen=True, kw_only=True)
class PrefixConfig:
    """Per-layer key/value prefixes generated from ``length`` embeddings by ``Linear → tanh → Linear``.

    Attributes:
        length: prefix vectors per layer (keys and values each).
        mlp_dim: width of the reparametrization MLP (Li & Liang, 2021, arXiv 2101.00190, §4.3); None trains the
            prefixes directly (peft's ``prefix_projection=False``).
        gate: scale the layer's prefixes by ``mean_t σ(w·h_t + b)`` of the attention input.
    """

    length: int = 10
    mlp_dim: int | None = 512
    gate: bool = True

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("length", self.length)
        if self.mlp_dim is not None:
            require_int("mlp_dim", self.mlp_dim)


@dataclass(frozen=True, kw_only=True)
class BottleneckConfig:
    """A bottleneck adapter after each feed-forward block (Pfeiffer et al., 2021, arXiv 2005.00247: ``seq_bn``).

    Attributes:
        reduction: hidden size / bottleneck size.
        gate: scale the adapter output by ``mean_t σ(w·z_t + b)`` of its input.
    """

    reduction: int = 16
    gate: bool = True

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("reduction", self.reduction)


PROMPT_COMBINE = ("prefix", "prefix_after_bos")


@dataclass(frozen=True, kw_only=True)
class PromptConfig:
    """Soft prompt tokens before the input embeddings (Lester et al., 2021, arXiv 2104.08691).

    Attributes:
        length: number of virtual tokens; adds ``length × d`` parameters.
        init_text: initialize from the word embeddings of this text (repeated or cut to ``length`` tokens, as
            peft's ``PromptTuningInit.TEXT``); None: uniform in ±``init_scale``.
        init_vocab: ``(start, stop)``: initialize each token from the word embedding of an id drawn uniformly from
            ``start ≤ id < stop`` (Lester et al. §3.2's sampled vocabulary: ids of frequent tokens; ``(0, V)`` draws
            as peft's ``PromptTuningInit.SAMPLE_VOCAB``); the draw uses torch's global generator.
        init_scale: half-width of the random-uniform init (AdapterHub's ``random_uniform_scale``).
        combine: where the prompt goes (AdapterHub's ``PromptTuningConfig.combine``): ``"prefix"`` before the input
            (Lester et al., peft), ``"prefix_after_bos"`` after its first token (``[CLS]``), so a BERT classifier's
            pooler keeps reading ``[CLS]`` at position 0.
    """

    length: int = 10
    init_text: str | None = None
    init_vocab: tuple[int, int] | None = None
    init_scale: float = 0.5
    combine: str = "prefix"

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("length", self.length)
        if self.combine not in PROMPT_COMBINE:
            raise ValueError(f"combine={self.combine!r} is invalid; allowed: {list(PROMPT_COMBINE)}")
        if self.init_text is not None and not self.init_text.strip():
            raise ValueError("init_text='' is invalid; allowed: None or a non-empty text")
        if self.init_vocab is not None:
            ids = self.init_vocab
            bad = len(ids) != 2 or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
            if bad or not 0 <= ids[0] < ids[1]:
                raise ValueError(
                    f"init_vocab={ids!r} is invalid; allowed: None or (start, stop) with 0 <= start < stop"
                )
            if self.init_text is not None:
                raise ValueError("init_vocab and init_text are both set; allowed: one prompt init")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale={self.init_scale!r} is invalid; allowed: a number > 0")


@dataclass(frozen=True, kw_only=True)
class PELTConfig:
    """Which parameter-efficient modules a model gets; None leaves one out.

    Attributes:
        lora, prefix, bottleneck, prompt: the modules (UniPELT = the first three, gated).
        from_layer: put LoRA, prefixes and adapters only on layers ``from_layer`` and above (arXiv 2405.05493's
            layer-wise variant; UniPELT's ``--drop_first_layers``). The prompt is at the input either way.
        train_head: keep the task head (a classifier on a fresh base) trainable, as peft's ``modules_to_save``.
        train_pooler: train the base model's pooler (BERT's ``Linear(d, d) → tanh`` on ``[CLS]``) with the head, as
            full fine-tuning does; AdapterHub's default classification head has a trainable layer of this shape of
            its own. Off: the pooler stays frozen, as in the official UniPELT code and peft.
    """

    lora: GatedLoRAConfig | None = None
    prefix: PrefixConfig | None = None
    bottleneck: BottleneckConfig | None = None
    prompt: PromptConfig | None = None
    from_layer: int = 0
    train_head: bool = True
    train_pooler: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if not isinstance(self.train_pooler, bool):
            raise ValueError(f"train_pooler={self.train_pooler!r} is invalid; allowed: True or False")
        if all(getattr(self, name) is None for name in MODULES):
            raise ValueError(f"PELTConfig() has no module; allowed: at least one of {list(MODULES)}")
        require_int("from_layer", self.from_layer, minimum=0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (tuples become lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PELTConfig:
        """The inverse of :meth:`to_dict`."""
        kinds = {
            "lora": GatedLoRAConfig,
            "prefix": PrefixConfig,
            "bottleneck": BottleneckConfig,
            "prompt": PromptConfig,
        }
        fields = dict(data)
        for name, kind in kinds.items():
            if fields.get(name) is not None:
                value = dict(fields[name])
                for tupled in ("targets", "init_vocab"):  # JSON lists back to tuples
                    if value.get(tupled) is not None:
                        value[tupled] = tuple(value[tupled])
                fields[name] = kind(**value)
        return cls(**fields)


MODULES = ("lora", "prefix", "bottleneck", "prompt")


def unipelt(
    *, prompt: bool = False, gates: bool = True, from_layer: int = 0, prompt_combine: str = "prefix_after_bos"
) -> PELTConfig:
    """UniPELT (arXiv 2110.07577): gated LoRA + gated prefix + gated adapter; ``prompt`` adds arXiv 2405.05493's
    prompt layer, after ``[CLS]`` unless ``prompt_combine="prefix"`` (the ``unipelt-prompt`` method's default,
    chosen on a development split: docs/adapters.md); ``gates=False`` is the ungated combination."""
    return PELTConfig(
        lora=GatedLoRAConfig(gate=gates),
        prefix=PrefixConfig(gate=gates),
        bottleneck=BottleneckConfig(gate=gates),
        prompt=PromptConfig(combine=prompt_combine) if prompt else None,
        from_layer=from_layer,
    )
