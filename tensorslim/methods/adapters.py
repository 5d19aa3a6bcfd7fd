"""Parameter-efficient fine-tuning methods: a frozen pretrained model plus adapters (:mod:`tensorslim.layers.adapters`).

``lora``, ``prefix``, ``adapter`` and ``prompt`` are the single methods (ungated unless ``--gates``), ``unipelt`` the
three gated together (Mao et al., ACL 2022, arXiv 2110.07577, §3) and ``unipelt-prompt`` UniPELT with the prompt
layer of arXiv 2405.05493. ``peft-lora`` and ``peft-prompt`` run Hugging Face peft's own modules, as references.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.methods.hooks import TrainHook
from tensorslim.methods.registry import Method, MethodContext, register_method
from tensorslim.options import option


@dataclass(frozen=True, kw_only=True)
class PELTOptions:
    """Sizes of the adapter modules (defaults: the official UniPELT code) and whether they are gated."""

    rank: int | None = option(None, "LoRA rank (default: 8)")
    lora_alpha: float = option(16.0, "LoRA scale numerator, the update is (alpha/rank)·B·A·x when ungated")
    prefix_length: int = option(10, "prefix vectors per layer")
    prefix_mlp: int = option(512, "width of the prefix reparametrization MLP (0: train the prefixes directly)")
    reduction: int = option(16, "bottleneck adapter: hidden size / bottleneck size")
    prompt_length: int = option(10, "soft prompt tokens")
    prompt_init_text: str | None = option(
        None, "initialize the prompt from this text's word embeddings (e.g. the class names; default: random)"
    )
    prompt_init_vocab: int = option(
        0,
        "initialize the prompt from the word embeddings of tokens drawn from the N most frequent of the model's "
        "vocabulary (Lester et al. 2021 sampled 5000; 0: off)",
    )
    prompt_combine: str | None = option(
        None,
        "where the prompt goes: 'prefix' (before the input) or 'prefix_after_bos' (after [CLS]) (default: after [CLS] "
        "for prompt and unipelt-prompt)",
    )
    prompt_lr_scale: float | None = option(
        None,
        "the soft prompt's learning rate as a multiple of the run's (default: 10 for unipelt-prompt, 1 for prompt)",
    )
    gates: bool | None = option(None, "gate each module (default: on for unipelt*, off for single methods)")
    train_pooler: bool = option(
        False,
        "train the base model's pooler (Linear + tanh on [CLS]) with the classifier head (peft's methods keep it "
        "frozen)",
    )
    from_layer: int = option(0, "adapt only layers from this index on (the layer-wise variant)")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank is not None:
            require_int("rank", self.rank)
        scale = self.prompt_lr_scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0):
            raise ValueError(f"prompt_lr_scale={scale!r} is invalid; allowed: None or a number > 0")
        for name in ("prefix_length", "reduction", "prompt_length"):
            require_int(name, getattr(self, name))
        require_int("prefix_mlp", self.prefix_mlp, minimum=0)
        require_int("from_layer", self.from_layer, minimum=0)
        require_int("prompt_init_vocab", self.prompt_init_vocab, minimum=0)
        from tensorslim.layers.adapters.config import PROMPT_COMBINE

        if self.prompt_combine is not None and self.prompt_combine not in PROMPT_COMBINE:
            raise ValueError(f"prompt_combine={self.prompt_combine!r} is invalid; allowed: {list(PROMPT_COMBINE)}")
        if self.prompt_init_text is not None and not self.prompt_init_text.strip():
            text = self.prompt_init_text
            raise ValueError(f"prompt_init_text={text!r} is invalid; allowed: None or a non-empty text")
        if self.prompt_init_text is not None and self.prompt_init_vocab:
            raise ValueError("prompt_init_text and prompt_init_vocab are both set; allowed: one prompt init")


CAUSAL = ("llama", "gpt2")


def pelt_config(
    method: str, options: PELTOptions, *, family: str = "hf-bert", vocab: tuple[int, int] | None = None
) -> Any:
    """The :class:`tensorslim.layers.adapters.PELTConfig` that ``method`` (``lora``, ``unipelt-prompt`` …) puts on a
    model of ``family``; ``vocab``: the id range a prompt with ``prompt_init_vocab`` draws its start from."""
    from tensorslim.layers.adapters import BottleneckConfig, GatedLoRAConfig, PELTConfig, PrefixConfig, PromptConfig

    modules = MODULES[method]
    gates = options.gates if options.gates is not None else method.startswith("unipelt")
    if gates and family in CAUSAL:
        raise ValueError(
            f"gates average over the whole sequence, so a {family} LM would see the future; allowed: gates off"
        )
    return PELTConfig(
        lora=GatedLoRAConfig(rank=options.rank or 8, alpha=options.lora_alpha, gate=gates)
        if "lora" in modules
        else None,
        prefix=PrefixConfig(length=options.prefix_length, mlp_dim=options.prefix_mlp or None, gate=gates)
        if "prefix" in modules
        else None,
        bottleneck=BottleneckConfig(reduction=options.reduction, gate=gates) if "bottleneck" in modules else None,
        prompt=PromptConfig(
            length=options.prompt_length,
            init_text=options.prompt_init_text,
            init_vocab=vocab,
            combine=prompt_combine(method, options, family=family),
        )
        if "prompt" in modules
        else None,
        from_layer=options.from_layer,
        train_pooler=options.train_pooler,
    )


def _peft_pooler(method: str, options: PELTOptions) -> None:
    """peft's methods train only what peft trains.

    Raises:
        ValueError: ``--train-pooler`` asked of one.
    """
    if options.train_pooler:
        raise ValueError(f"{method} keeps peft's frozen pooler; allowed: train_pooler off for {method}")


MODULES = {
    "lora": ("lora",),
    "prefix": ("prefix",),
    "adapter": ("bottleneck",),
    "prompt": ("prompt",),
    "unipelt": ("lora", "prefix", "bottleneck"),
    "unipelt-prompt": ("lora", "prefix", "bottleneck", "prompt"),
}


# The soft prompt's rate over the run's when --prompt-lr-scale is not given. Prompt tuning wants a far larger rate
# than adapters (Lester et al., arXiv 2104.08691, §3: 0.3); on the BBC-titles development split prompt tuning alone
# chose 5e-2 and every adapter method 5e-3, so UniPELT + prompt trains its prompt at 10x its adapters' rate.
PROMPT_LR_SCALE = {"prompt": 1.0, "unipelt-prompt": 10.0}


# Where the soft prompt goes when --prompt-combine is not given (AdapterHub's PromptTuningConfig.combine).
DEFAULT_PROMPT_COMBINE = {"prompt": "prefix_after_bos", "unipelt-prompt": "prefix_after_bos"}


def prompt_combine(method: str, options: PELTOptions, *, family: str = "hf-bert") -> str:
    """Where the soft prompt of ``method`` goes: ``prefix`` (before the input) or ``prefix_after_bos``.

    A causal LM's default is ``prefix`` (Lester et al.'s order): its packed text has no ``[CLS]`` to keep first.
    """
    if options.prompt_combine:
        return options.prompt_combine
    return "prefix" if family in CAUSAL else DEFAULT_PROMPT_COMBINE[method]


def prompt_lr_scale(method: str, options: PELTOptions) -> float:
    """The multiple of the run's learning rate that the soft prompt of ``method`` trains at."""
    return float(options.prompt_lr_scale) if options.prompt_lr_scale is not None else PROMPT_LR_SCALE[method]


class PromptRateHook(TrainHook):
    """AdamW with the soft prompt in a group of its own at ``scale`` × the run's rate (the trainer applies the
    schedule to each group through its ``lr_scale``); every other trainable parameter takes the run's rate.

    Args:
        scale: the prompt group's multiple of the run's learning rate; 1 leaves the trainer's default optimizer.
    """

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def build_optimizer(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer | None:
        groups = prompt_param_groups(model, lr=lr, scale=self.scale)
        if self.scale == 1.0 or len(groups) == 1:
            return None
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fused)


def prompt_param_groups(model: nn.Module, *, lr: float, scale: float) -> list[dict]:
    """``[other, prompt]`` parameter groups of the trainable parameters (each with ``name``, ``lr`` and
    ``lr_scale``; the run's own rate first, so the logged rate is the run's); an empty group is dropped."""
    from tensorslim.layers.adapters.modules import PromptEmbedding

    prompt = [p for module in model.modules() if isinstance(module, PromptEmbedding) for p in module.parameters()]
    taken = {id(p) for p in prompt}
    other = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    groups = [
        {"name": "other", "params": other, "lr": lr, "lr_scale": 1.0},
        {"name": "prompt", "params": [p for p in prompt if p.requires_grad], "lr": lr * scale, "lr_scale": scale},
    ]
    return [group for group in groups if group["params"]]


def _prompt_positions(options: PELTOptions) -> int:
    return options.prompt_length


def _prompt_hook(method: str) -> Any:
    def hook(context: MethodContext) -> PromptRateHook:
        return PromptRateHook(prompt_lr_scale(method, context.options))

    return hook


def frequent_token_range(tokens: list[str], special: set[str], count: int) -> tuple[int, int]:
    """The ids of the ``count`` most frequent tokens of a vocabulary listed in id order (``tokens[i]`` is id ``i``).

    Lester et al. (arXiv 2104.08691, §3.2) start prompt tokens from the embeddings of tokens sampled from the
    5,000 most common. WordPiece and BPE vocabularies list their entries in frequency order after the special
    tokens, the reserved ``[unused…]`` slots and the single characters (BERT's: ``the of and in …`` from id 1996),
    so the range starts at the first entry of two or more characters that is neither special nor reserved.

    Raises:
        ValueError: fewer than ``count`` entries from there.
    """

    def reserved(token: str) -> bool:
        bracketed = token[:1] in "[<" and token[-1:] in "]>"
        return token in special or bracketed or len(token.removeprefix("##").removeprefix("Ġ")) < 2

    start = next((i for i, token in enumerate(tokens) if not reserved(token)), len(tokens))
    if start + count > len(tokens):
        raise ValueError(
            f"prompt_init_vocab={count} is more than the {len(tokens) - start} frequency-ordered tokens of the "
            f"vocabulary; allowed: at most {len(tokens) - start}"
        )
    return start, start + count


def _vocab_range(context: MethodContext) -> tuple[int, int] | None:
    """The id range a prompt with ``--prompt-init-vocab N`` draws from (the model's tokenizer), or None."""
    count = context.options.prompt_init_vocab
    if not count:
        return None
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(_tokenizer_folder(context), local_files_only=True)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return frequent_token_range(tokens, set(tokenizer.all_special_tokens), count)


def _encoder_for(context: MethodContext) -> Any:
    """Text → ids with the model's own tokenizer (for a prompt initialized from text), or None."""
    if context.options.prompt_init_text is None:
        return None
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(_tokenizer_folder(context), local_files_only=True)
    return lambda text: tokenizer(text)["input_ids"]


def _tokenizer_folder(context: MethodContext) -> str:
    """The folder of the model's own tokenizer.

    Raises:
        ValueError: the model has none (a prompt cannot start from a text then).
    """
    from tensorslim.models.registry import get_model

    folder = get_model(context.model_name).tokenizer_folder
    if folder is None:
        raise ValueError(f"prompt_init_text needs a model with its own tokenizer; {context.model_name!r} has none")
    return str(folder())


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _report(method: str, model: nn.Module, before: int, added: dict[str, int]) -> Any:
    """A :class:`tensorslim.registry.ConversionReport` whose layers are the added modules: nothing is removed, each
    entry's ``params_after`` is what it adds."""
    from tensorslim.registry import ConversionReport, LayerReport

    layers = [
        LayerReport(
            name=name, kind="adapter", old_shape=(0, 0), new_shape="added", rank=0, params_before=0, params_after=n
        )
        for name, n in added.items()
        if n
    ]
    assert sum(added.values()) == _count(model) - before, "every added parameter is in one entry"
    return ConversionReport(method=method, layers=layers, model_params_before=before, applied=True)


def _added_by_module(model: nn.Module) -> dict[str, int]:
    """Parameters of each adapter module (its own, not the wrapped base layer's)."""
    from tensorslim.layers.adapters.modules import BottleneckNorm, PrefixAttention, PrefixEncoder, PromptEmbedding
    from tensorslim.layers.lora import LoRALinear

    owned = {LoRALinear: "base.", PrefixAttention: "inner.", BottleneckNorm: "inner."}
    added = {}
    for name, module in model.named_modules():
        wrapped = next((prefix for kind, prefix in owned.items() if isinstance(module, kind)), None)
        if wrapped is not None:
            added[name] = sum(p.numel() for n, p in module.named_parameters() if not n.startswith(wrapped))
        elif isinstance(module, PrefixEncoder | PromptEmbedding):
            added[name] = sum(p.numel() for p in module.parameters())
    return added


def _convert(method: str) -> Any:
    def convert(model: nn.Module, context: MethodContext) -> list:
        from tensorslim.layers.adapters import equip_

        vocab = _vocab_range(context) if "prompt" in MODULES[method] else None
        config = pelt_config(method, context.options, family=context.family, vocab=vocab)
        before = _count(model)
        equip_(model, config, encode=_encoder_for(context))
        return [_report(method, model, before, _added_by_module(model))]

    return convert


def _peft_lora(model: nn.Module, context: MethodContext) -> list:
    """peft's LoRA injected in place (``inject_adapter_in_model``), classifier trainable."""
    import peft

    from tensorslim.layers.adapters.equip import _head_parameters

    options = context.options
    _peft_pooler("peft-lora", options)
    config = peft.LoraConfig(r=options.rank or 8, lora_alpha=options.lora_alpha, target_modules=["query", "value"])
    before = _count(model)
    model.requires_grad_(False)
    peft.inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    for param in _head_parameters(model):
        param.requires_grad_(True)
    return [_report("peft-lora", model, before, {"peft_lora": _count(model) - before})]


class _Reentry:
    """Whether the model's forward is being called from inside peft's wrapper (then it runs the plain forward)."""

    def __init__(self) -> None:
        self.inside = False


def _peft_prompt(model: nn.Module, context: MethodContext) -> list:
    """peft's prompt tuning (``get_peft_model`` with ``PromptTuningConfig``; random init, or peft's ``TEXT`` init
    from ``prompt_init_text``) run in place: the model's forward calls peft's wrapper, which calls back the model's
    own forward."""
    import peft

    _peft_pooler("peft-prompt", context.options)
    if context.options.prompt_combine not in (None, "prefix"):
        raise ValueError(
            "peft-prompt puts its prompt before the input; allowed: prompt_combine='prefix' for peft-prompt"
        )
    if context.options.prompt_init_vocab:
        raise ValueError(
            "peft-prompt's SAMPLE_VOCAB draws from the whole vocabulary, not the most frequent tokens; allowed: "
            "prompt_init_vocab=0 for peft-prompt"
        )
    text = context.options.prompt_init_text
    start = {} if text is None else {"prompt_tuning_init": "TEXT", "prompt_tuning_init_text": text}
    config = peft.PromptTuningConfig(
        task_type="SEQ_CLS",
        num_virtual_tokens=context.options.prompt_length,
        tokenizer_name_or_path=None if text is None else _tokenizer_folder(context),
        **start,
    )
    before = _count(model)
    wrapper = peft.get_peft_model(model, config)
    model.peft_prompt_encoder = wrapper.prompt_encoder  # its parameters train and save with the model
    plain, state = model.forward, _Reentry()

    def forward(*args: Any, **kwargs: Any) -> Any:
        if state.inside:
            return plain(*args, **kwargs)
        state.inside = True
        try:
            return wrapper(*args, **kwargs)
        finally:
            state.inside = False

    model.forward = forward
    return [_report("peft-prompt", model, before, {"peft_prompt": _count(model) - before})]


_HELP = {
    "lora": "LoRA on W_q, W_v of a frozen model (arXiv 2106.09685); --gates: UniPELT's gated LoRA",
    "prefix": "prefix tuning through a 2-layer MLP (arXiv 2101.00190); --gates: UniPELT's gated prefix",
    "adapter": "bottleneck adapter after each FFN (seq_bn, arXiv 2005.00247); --gates: UniPELT's gated adapter",
    "prompt": "prompt tuning: soft tokens before the input (arXiv 2104.08691)",
    "unipelt": "UniPELT: gated LoRA + prefix + adapter on a frozen model (arXiv 2110.07577)",
    "unipelt-prompt": "UniPELT + a prompt tuning layer (arXiv 2405.05493)",
}
# Hugging Face BERT-family encoders and ours. LoRA needs only the named linears; the prompt, the token embeddings
# (our LLaMA's too); the rest BERT's layers.
_BERT_ONLY = ("hf-bert", "bert")
FAMILIES = {("lora",): (*_BERT_ONLY, "llama"), ("prompt",): (*_BERT_ONLY, "llama")}
# Default peak learning rates: the rate the development set chose in every seed of the K = 100 BBC-titles sweep
# (experiments/results/adapters_bbc_titles.md); the soft prompt wants ten times the adapters' rate (for
# unipelt-prompt through PROMPT_LR_SCALE).
DEFAULT_LR = {
    "lora": 5e-3,
    "prefix": 5e-3,
    "adapter": 5e-3,
    "prompt": 5e-2,
    "unipelt": 5e-3,
    "unipelt-prompt": 5e-3,
    "peft-lora": 5e-3,
    "peft-prompt": 5e-2,
}
# peft's own modules on Hugging Face models, as references for ours.
_PEFT = {
    "peft-lora": ("Hugging Face peft's LoRA on query/value (reference)", _peft_lora),
    "peft-prompt": ("Hugging Face peft's prompt tuning (reference)", _peft_prompt),
}
for _name, (_help, _converter) in {**{n: (_HELP[n], _convert(n)) for n in MODULES}, **_PEFT}.items():
    _modules = MODULES.get(_name, ())
    register_method(
        Method(
            name=_name,
            help=_help,
            convert=_converter,
            options=PELTOptions,
            families=FAMILIES.get(_modules, _BERT_ONLY) if _name in MODULES else ("hf-bert",),
            lr=DEFAULT_LR[_name],
            hook=_prompt_hook(_name) if "prompt" in _modules else None,
            positions=_prompt_positions if "prompt" in _modules else None,
        )
    )
