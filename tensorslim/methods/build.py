"""Build a registered model and restructure it for a training method."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.books import count_params, flops_per_token
from tensorslim.checkpoint import latest_checkpoint, read_state
from tensorslim.layers.lowrank import LossyConversionWarning
from tensorslim.methods.registry import MethodContext, get_method
from tensorslim.methods.vocab import check_vocabulary_choice, factor_vocabulary_
from tensorslim.options import resolve_options
from tensorslim.pretrained import MANIFEST, load_pretrained, read_manifest, read_weights, register_base


def method_options(method: str, options: Any = None) -> Any:
    """``method``'s options from ``options`` (see :func:`tensorslim.options.resolve_options`)."""
    return resolve_options(get_method(method).options, options, owner=f"method {method!r}")


def build_for_method(
    model_name: str,
    method: str,
    *,
    task: str | None = None,
    options: Any = None,
    device: torch.device | str | None = None,
    steps: int = 0,
    run_dir: Any = None,
    base_state: dict[str, torch.Tensor] | None = None,
    factor_vocab: int = 0,
    factor_embedding: bool = False,
    **overrides: Any,
) -> tuple[nn.Module, list, MethodContext]:
    """Model ``model_name`` built for ``task`` and converted by ``method``.

    Args:
        model_name: a registered model (:func:`tensorslim.models.registry.get_model`).
        method: a registered method (:func:`get_method`).
        task: the head to build (default: the model family's first task).
        options: the method's options, or a mapping of some of their fields (default: its defaults).
        device: ``"meta"`` builds without allocating (for the books).
        steps, run_dir: passed to the method's hook through the returned context.
        base_state: weights loaded into the model as built, before the method converts it
            (:func:`load_matching_`).
        factor_vocab: when > 0, the rank of a factored LM head, applied after the method
            (:func:`tensorslim.methods.vocab.factor_vocabulary_`).
        factor_embedding: also factor the token embedding at rank ``factor_vocab``.
        overrides: ``vocab_size``, ``max_seq_len``, ``n_classes`` for the model.

    Returns:
        ``(model, conversion reports, context)``.
    """
    from tensorslim.models.registry import build_model, get_model, resolve_task

    check_vocabulary_choice(factor_vocab, factor_embedding)
    preset = get_model(model_name)
    task = resolve_task(model_name, task)
    options = method_options(method, options)
    added = get_method(method).positions
    if added is not None and overrides.get("max_seq_len") and not preset.pretrained and base_state is None:
        # A pretrained model's position table is fixed, as is one loaded from base_state (the prompt's check then
        # names the limit); a new one gets room.
        overrides = {**overrides, "max_seq_len": overrides["max_seq_len"] + added(options)}
    model = build_model(model_name, task=task, device=device, **overrides)
    if base_state is not None:
        load_matching_(model, base_state)
    context = MethodContext(
        model_name=model_name,
        family=preset.family.name,
        model_config=getattr(model, "config", preset.config),
        task=task,
        options=options,
        # On meta there are no weights to factorize; a random init has the same shapes (the books are the same).
        pretrained=preset.pretrained and torch.device(device or "cpu").type != "meta",
        steps=steps,
        run_dir=run_dir,
    )
    reports = apply_method(model, method, context)
    if factor_vocab:
        fresh = not preset.pretrained and base_state is None  # its weights are the dense random init
        reports += _factor_vocabulary(model, factor_vocab, factor_embedding, device, fresh=fresh)
    return model, reports, context


def _factor_vocabulary(
    model: nn.Module, rank: int, embedding: bool, device: torch.device | str | None, *, fresh: bool
) -> list:
    """The vocabulary layers factored as the truncated SVD of their weights (on meta, where there are none, CoLA's
    random init of the same shapes); on a fresh model that SVD is of the dense random init, so the warning about a
    lossy conversion of trained weights does not apply."""
    if torch.device(device or "cpu").type == "meta":
        return factor_vocabulary_(model, rank, embedding=embedding, init="random")
    with warnings.catch_warnings():
        if fresh:
            warnings.simplefilter("ignore", LossyConversionWarning)
        return factor_vocabulary_(model, rank, embedding=embedding, init="svd")


def build_run_model(
    model_name: str,
    method: str,
    *,
    init: str | None = None,
    init_base: str | None = None,
    **build: Any,
) -> tuple[nn.Module, list, MethodContext]:
    """The model a training run starts from: :func:`build_for_method`'s, with the weights of ``init_base`` (a run
    or a saved model, ``--init-base``) loaded before the method converts it, or replaced by the model saved in
    ``init`` (``--init``), which must have exactly its parameters.

    Args:
        model_name, method: as :func:`build_for_method`.
        init: a ``save_pretrained`` folder of the model this run builds (same preset, task, vocabulary, method).
        init_base: a run folder, checkpoint folder or ``save_pretrained`` folder of the unconverted model.
        build: the other arguments of :func:`build_for_method` (``task``, ``options``, ``steps`` ...).

    Raises:
        ValueError: a folder that holds no such model, or one whose parameters differ from the built model's.
    """
    base_state = _base_state(init_base) if init_base else None
    device = "meta" if init else None  # the saved model replaces it: only its shapes are needed
    model, reports, context = build_for_method(model_name, method, device=device, base_state=base_state, **build)
    if init is not None:
        model = initial_model(init, like=model)
    return model, reports, context


def model_books(model: nn.Module, *, seq_len: int, prefix: str = "") -> dict[str, float]:
    """``model``'s parameters (all, and without the embeddings) and forward FLOPs per token at ``seq_len``, under
    keys starting with ``prefix``."""
    params = count_params(model)
    return {
        f"{prefix}params_total": params.total,
        f"{prefix}params_non_embedding": params.non_embedding,
        f"{prefix}flops_per_token": flops_per_token(model, seq_len=seq_len),
    }


def method_books(
    model_name: str,
    method: str,
    *,
    seq_len: int,
    task: str | None = None,
    options: Any = None,
    factor_vocab: int = 0,
    factor_embedding: bool = False,
    **overrides: Any,
) -> dict[str, float]:
    """:func:`model_books` of ``model_name`` built for ``method`` and of the dense baseline (keys ``dense_...``),
    counted on meta models (nothing is allocated); the arguments as :func:`build_for_method` takes them."""
    books: dict[str, float] = {}
    arms = (("", method, options, factor_vocab, factor_embedding), ("dense_", "dense", None, 0, False))
    for prefix, name, method_options, rank, embedding in arms:
        model, _, _ = build_for_method(
            model_name,
            name,
            task=task,
            options=method_options,
            device="meta",
            factor_vocab=rank,
            factor_embedding=embedding,
            **overrides,
        )
        books.update(model_books(model, seq_len=seq_len, prefix=prefix))
    return books


def apply_method(model: nn.Module, method: str, context: MethodContext) -> list:
    """Restructure ``model`` in place as ``method`` does (nothing for full-rank methods); the conversion reports."""
    spec = get_method(method)
    if spec.families is not None and context.family not in spec.families:
        raise ValueError(f"method={method!r} does not apply to {context.family} models; allowed: {list(spec.families)}")
    return spec.convert(model, context) if spec.convert is not None else []


def load_matching_(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Copy into ``model`` every tensor of ``state`` it has under the same name (another run's encoder into a
    classifier: the head that run lacks keeps its init); the names copied. A top-level module (``encoder``) is
    filled whole or not at all, so weights of another structure (a converted run) are never half-loaded.

    Raises:
        ValueError: no name in common, a common name whose shape differs (another vocabulary or width), or a
            module the state fills only in part.
    """
    mine = model.state_dict()
    common = [name for name in state if name in mine]
    if not common:
        raise ValueError(
            f"the base weights share no name with {type(model).__name__} (theirs start {sorted(state)[:2]}); "
            "allowed: a run of the same preset"
        )
    for name in common:
        if state[name].shape != mine[name].shape:
            raise ValueError(
                f"base weight {name} is {tuple(state[name].shape)} there, {tuple(mine[name].shape)} here; allowed: a "
                "run of the same preset with the same vocabulary (the same tokenizer and --vocab-size)"
            )
    filled = {name.split(".")[0] for name in common}
    partial = sorted(name for name in mine if name not in state and name.split(".")[0] in filled)
    if partial:
        raise ValueError(
            f"the base weights fill {partial[0].split('.')[0]} only in part (no {partial[0]}, {len(partial)} missing); "
            "allowed: a run of the same preset and structure (an unconverted one for a method that converts)"
        )
    with torch.no_grad():
        for name in common:
            mine[name].copy_(state[name])
    return common


def build_from_record(record: dict[str, Any], *, device: str = "cpu") -> nn.Module:
    """The model of a saved run's base record (:class:`tensorslim.pretrained.MethodBase`), built by its method on
    ``device``: ``meta`` for its shapes; a real device to load weights into (a Hugging Face model computes buffers
    that no checkpoint holds)."""
    model, _, _ = build_for_method(
        record["name"],
        record["method"],
        task=record["task"],
        options=record["options"],
        device=device,
        **record["overrides"],
    )
    return model


def initial_model(folder: str, *, like: nn.Module) -> nn.Module:
    """The model saved in ``folder`` (``--init``), which must have exactly the parameters of ``like``, the model this
    run would build (same preset, task, vocabulary and method)."""
    model = load_pretrained(folder).train()
    want = {name: tuple(p.shape) for name, p in like.named_parameters()}
    have = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if want != have:
        diff = sorted(set(want.items()) ^ set(have.items()))[:3]
        raise ValueError(
            f"init={folder!r} does not hold the model this run builds (first differences: {diff}); allowed: a folder "
            "saved from the same preset, task, vocabulary size and method"
        )
    return model


def _base_state(path: str) -> dict[str, torch.Tensor]:
    """The model weights of a run (``--init-base``): its run folder (the latest checkpoint), one checkpoint folder, or
    a folder written by ``save_pretrained``; tied weights under each of their names.

    Raises:
        ValueError: a path that holds none of these, or a corrupt weights file.
    """
    folder = Path(path)
    if (folder / "checkpoints").is_dir():
        folder = latest_checkpoint(folder / "checkpoints") or folder
    if (folder / MANIFEST).is_file():
        manifest = read_manifest(folder)
        if "base_weights" in manifest:  # the file holds the adapters only; the base supplies the rest
            return load_pretrained(folder).state_dict()
        return read_weights(folder / manifest["weights"], manifest["aliases"])
    if (folder / "model.safetensors").is_file() and (folder / "state.json").is_file():
        return read_weights(folder / "model.safetensors", read_state(folder).get("aliases", {}))
    raise ValueError(
        f"init_base={path!r} holds no model.safetensors with a state.json or a save_pretrained manifest; allowed: a "
        "run folder with a checkpoint, a checkpoint folder or a save_pretrained folder"
    )


register_base("method", build_from_record)
