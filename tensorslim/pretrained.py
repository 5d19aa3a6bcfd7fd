"""Save and load converted models: ``save_pretrained(model, folder, base=...)`` and ``load_pretrained(folder)``.

A folder holds three things:

* ``model.safetensors``: the state dict, each shared tensor (tied weights) once; never unpickled. Its metadata
  records the SHA-256 of its tensors, and loading refuses a file whose tensors changed since (a flipped bit).
* ``tensorslim.json``: the manifest, i.e. the base model (a registered tensorslim model with its overrides, a Hugging
  Face model whose ``config.json`` lies beside it, or a custom model the caller rebuilds) and one entry per converted
  layer: its qualified name, the config that rebuilds it (type and fields) and the state a config cannot carry.
* ``config.json`` for a Hugging Face base (``PretrainedConfig.save_pretrained``, with ``architectures`` set).

A model trained on a pretrained base with adapters (LoRA, prompts, bottlenecks ...) can be saved against its base
(``save_pretrained(..., reference=...)``): the file then holds only the tensors that differ from the base as its record
rebuilds it (adapters, head), and the manifest's ``base_weights`` the shapes and SHA-256 of the rest, which loading
checks on the rebuilt base before it takes them.

The configs are read off the layers themselves by each layer family's ``describe`` (registered with its transform in
:mod:`tensorslim.registry`, so a new family needs nothing here), with every shape explicit (ranks, mode factors,
CoMERA-truncated TT ranks), so a folder does not depend on how the model was converted. Loading builds the base with its
parameters on ``meta`` (buffers, which a checkpoint may not hold, stay real), converts each group of layers that share a
config with ``convert_(model, config, filter_fn=...)`` and ``init="random"`` (nothing reads weights), materializes the
parameters and loads the weights strictly. The conversion's model-level steps (CoLA's ``only_lr_act``, LaX crossings,
CoLA-M block checkpoints) run again, because ``convert_`` runs them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim._checks import require_module

MANIFEST = "tensorslim.json"
WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
FORMAT = "tensorslim.pretrained"
RUN_MODEL = "model"  # the save_pretrained folder inside a run folder
VERSION = 1
_OVERRIDES = ("vocab_size", "max_seq_len", "n_classes")


@dataclass(frozen=True, kw_only=True)
class RegisteredBase:
    """A registered tensorslim model as the base: ``build_model(name, task=task, **overrides)``.

    Attributes:
        name: a registered model (``tiny``, ``bert6``, ``gpt2-small`` ...).
        task: the head it was built with; None takes the model's default task.
        vocab_size, max_seq_len, n_classes: the overrides it was built with (None: the preset's).
    """

    name: str
    task: str | None = None
    vocab_size: int | None = None
    max_seq_len: int | None = None
    n_classes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r} is invalid; allowed: a registered model name")
        for field in _OVERRIDES:
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{field}={value!r} is invalid; allowed: None or an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class MethodBase:
    """A registered model as a training method builds it: ``build_for_method(name, method, task=task,
    options=options, **overrides)`` (the structure a run trains, adapters included; its weights come from the file).

    It describes a model whose structure the method fixes when it builds it; a method that reshapes the model while
    it trains (CoMERA's rank truncation) is saved with a :class:`RegisteredBase` and its layers instead.

    Attributes:
        name: a registered model.
        method: a registered training method.
        task: the head it was built with.
        options: the method's options (a mapping of their fields).
        overrides: what the run's data fixed (``vocab_size``, ``max_seq_len``, ``n_classes``, a U-Net's channels).
    """

    name: str
    method: str
    task: str
    options: dict[str, Any]
    overrides: dict[str, Any]


# --- describing the layers ---------------------------------------------------------------------------------------


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _config_record(config: Any) -> dict[str, Any]:
    return {"type": _qualified(type(config)), "fields": dataclasses.asdict(config)}


def _describe(model: nn.Module, name: str, at: str, module: nn.Module, *, in_place: bool = True) -> list[dict]:
    """The entries of ``module`` (at ``name`` in ``model``, recorded at ``at``) and of what it holds, innermost first:
    a layer a family wraps (LoRA's ``base``) or changes in place (a TT layer in QAT form) is recorded at the outer
    name before it, and a family that keeps the replaced module's children (a memory's projections) records them."""
    from tensorslim.registry import transform_for_layer

    family = transform_for_layer(module, in_place=in_place)
    entries: list[dict[str, Any]] = []
    if family is None or family.transparent:
        for child, inner in module.named_children():
            entries += _describe(model, _join(name, child), _join(at, child), inner)
    if family is None:
        return entries
    if family.owns is not None and family.owns(module):  # changed in place: first the layer its class describes
        entries += _describe(model, name, at, module, in_place=False)
    elif (
        wrapped := next((a for a in family.wraps if isinstance(getattr(module, a, None), nn.Module)), None)
    ) is not None:
        # a family that changes layers in place describes what it wraps by its class
        inner = getattr(module, wrapped)
        entries += _describe(model, _join(name, wrapped), at, inner, in_place=family.owns is None)
    config, state = family.describe(model, name, module)
    # "quantize": a layer rebuilt from its recorded layout (a quantized one), the kind folders have always named it
    kind = "convert" if family.shell is None else "quantize"
    return [*entries, {"name": at, "kind": kind, "config": _config_record(config), "state": state}]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def describe_layers(model: nn.Module) -> list[dict[str, Any]]:
    """The manifest's ``layers``: one entry per converted, quantized, adapted or equipped layer of ``model``, each
    after the entries it is built on (the CoLA layer under its LoRA adapter, the TT layer under its QAT form).

    Each entry: ``name`` (qualified), ``kind`` (``convert``, or ``quantize`` for a layer rebuilt from its recorded
    layout), ``config`` (``{"type": "module.Class", "fields": {...}}``; for a quantized layer the width only, since its
    solver leaves no trace in it) and
    ``state`` (what the config does not carry: gate thresholds, the layout of packed codes ...). Every family is read
    by its registered ``describe`` (:mod:`tensorslim.registry`), so a new family needs nothing here.
    """
    entries = _describe(model, "", "", model)
    depth = [_depth(index, entries) for index in range(len(entries))]
    order = sorted(range(len(entries)), key=lambda index: -depth[index])  # stable: module order within one depth
    return [entries[index] for index in order]


def _depth(index: int, entries: list[dict[str, Any]]) -> int:
    """How many entries are built on entry ``index``: those after it at its name or at a name above it."""
    name = entries[index]["name"]
    return sum(other["name"] == name or name.startswith(f"{other['name']}.") for other in entries[index + 1 :])


# --- base models -------------------------------------------------------------------------------------------------


def _is_hf(model: nn.Module) -> bool:
    if "transformers" not in sys.modules:  # a Hugging Face model exists only once transformers is imported
        return False
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def _base_record(model: nn.Module, base: RegisteredBase | MethodBase | str | None) -> dict[str, Any]:
    if isinstance(base, MethodBase):
        return {"kind": "method", **dataclasses.asdict(base)}
    if isinstance(base, str):
        config = getattr(model, "config", None)
        found = {field: getattr(config, field, None) for field in _OVERRIDES}
        base = RegisteredBase(name=base, **{k: v for k, v in found.items() if isinstance(v, int)})
    if isinstance(base, RegisteredBase):
        from tensorslim.models.registry import resolve_task

        task = resolve_task(base.name, base.task)
        record = {"kind": "tensorslim", **dataclasses.asdict(base), "task": task}
        if task != "classify":
            record["n_classes"] = None
        return record
    if base is not None:
        raise ValueError(f"base={base!r} is invalid; allowed: None, a registered model name or a RegisteredBase")
    if _is_hf(model):
        return {"kind": "huggingface", "architecture": type(model).__name__, "config": HF_CONFIG}
    return {"kind": "custom", "class": _qualified(type(model))}


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta``; buffers stay real.

    Non-persistent buffers (Hugging Face's ``position_ids``, rotary tables) are not in a checkpoint, so they must be
    computed by the constructor; parameters are allocated only once their dtype is known (as accelerate's
    ``init_empty_weights``).
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _build_base(record: dict[str, Any], folder: Path, model: nn.Module | None) -> nn.Module:
    if model is not None:
        return model
    kind = record["kind"]
    if kind == "tensorslim":
        from tensorslim.models.registry import get_model, model_config

        overrides = {field: record[field] for field in _OVERRIDES}
        config = model_config(record["name"], task=record["task"], **overrides)
        with parameters_on_meta():
            return get_model(record["name"]).family.build(config, task=record["task"])
    if kind in BASE_BUILDERS:
        return BASE_BUILDERS[kind](record)
    if kind == "method":
        raise ValueError(
            f"{folder} holds a model built by training method {record.get('method')!r}; load it with "
            "tensorslim.load_pretrained or tensorslim.predictor (which know the training methods)"
        )
    if kind == "huggingface":
        import transformers

        config_file = file_inside(folder, record["config"], what="base.config")
        config = transformers.AutoConfig.from_pretrained(config_file, local_files_only=True)
        architecture = getattr(transformers, record["architecture"], None)
        if not isinstance(architecture, type) or not issubclass(architecture, transformers.PreTrainedModel):
            raise ValueError(f"architecture={record['architecture']!r} is not a transformers model class")
        with parameters_on_meta():
            return architecture._from_config(config)
    raise ValueError(
        f"{folder} was saved from a custom {record.get('class')} model; pass model= (its unconverted form, e.g. built "
        "on the meta device) to load_pretrained"
    )


# Builders of the base kinds that layers above this module provide: ``{kind: build(record) -> model}`` (a training
# run's ``"method"`` base is built by :mod:`tensorslim.methods`, which registers it).
BASE_BUILDERS: dict[str, Callable[[dict[str, Any]], nn.Module]] = {}


def register_base(kind: str, build: Callable[[dict[str, Any]], nn.Module]) -> None:
    """Let ``load_pretrained`` build bases of ``kind`` with ``build(record)`` (a real model to load weights into)."""
    BASE_BUILDERS[kind] = build


# --- rebuilding the layers ---------------------------------------------------------------------------------------


def _config_types() -> dict[str, type]:
    """Every config type a manifest may name: the registered ones and their subclasses."""
    import tensorslim.layers  # noqa: F401 - registers every layer family
    import tensorslim.quant  # noqa: F401 - registers quantization and QAT
    from tensorslim.registry import TRANSFORMS

    found: dict[str, type] = {}
    stack = list(TRANSFORMS)
    while stack:
        cls = stack.pop()
        found[_qualified(cls)] = cls
        stack.extend(cls.__subclasses__())
    return found


def _as_tuples(value: Any) -> Any:
    """JSON lists back to the tuples the configs hold."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _config_from(record: dict[str, Any], types: dict[str, type]) -> Any:
    if record["type"] not in types:
        raise ValueError(f"config type {record['type']!r} is unknown; allowed: {sorted(types)}")
    kind = types[record["type"]]
    if hasattr(kind, "from_dict"):  # a config of configs (the adapters' PELTConfig) rebuilds its parts itself
        return kind.from_dict(record["fields"])
    return kind(**{k: _as_tuples(v) for k, v in record["fields"].items()})


def _convert_groups(model: nn.Module, entries: list[dict[str, Any]]) -> None:
    """One ``convert_`` per distinct config, converting exactly the layers recorded with it, in the order the configs
    first appear (a layer after what it is built on); each layer then gets the state its config cannot carry."""
    from tensorslim.convert import convert_
    from tensorslim.registry import set_submodule, transform_for

    types = _config_types()
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(json.dumps(entry["config"], sort_keys=True), []).append(entry)
    for group in groups.values():
        names = {entry["name"] for entry in group}
        config = _config_from(group[0]["config"], types)
        family = transform_for(config)
        if family.shell is not None:  # layers rebuilt from their recorded layout, not from weights
            for entry in group:
                set_submodule(model, entry["name"], family.shell(entry["state"]))
            continue
        report = convert_(  # the saved layers are what they are, larger than dense or not
            model,
            config,
            filter_fn=lambda _, name, names=names: name in names,
            allow_larger=True,
        )
        converted = {layer.name for layer in report.layers}
        if converted != names:
            raise ValueError(f"cannot rebuild layers {sorted(names - converted)}: the base model has no such layers")
        if family.restore is not None:
            for entry in group:
                family.restore(model.get_submodule(entry["name"]), entry["state"])


def rebuild_layers(model: nn.Module, entries: list[dict[str, Any]]) -> None:
    """Replace the layers of a base ``model`` (on ``meta`` or not) as the manifest ``entries`` describe."""

    kinds = {"convert", "quantize", "lora"}  # "lora": LoRA adapters as the first manifests recorded them
    unknown = sorted({entry["kind"] for entry in entries} - kinds)
    if unknown:
        raise ValueError(f"layer kinds {unknown} are unknown; allowed: {sorted(kinds)}")
    # The first manifests recorded a quantized layer without a config and before every converted layer.
    legacy = [entry for entry in entries if entry["kind"] == "quantize" and entry["config"] is None]
    current = [entry for entry in entries if not (entry["kind"] == "quantize" and entry["config"] is None)]
    _convert_groups(model, [{**entry, "config": _width_record(entry["state"])} for entry in legacy] + current)


def _width_record(state: dict[str, Any]) -> dict[str, Any]:
    """The config record of a quantized layer the first manifests recorded without one: its width."""
    return {"type": "tensorslim.quant.rtn.RTNConfig", "fields": {"bits": state["bits"]}}


# --- weights -----------------------------------------------------------------------------------------------------


def materialize_(model: nn.Module, dtypes: dict[str, torch.dtype], *, device: torch.device | str = "cpu") -> None:
    """Give every ``meta`` parameter and buffer of ``model`` uninitialized storage on ``device`` (tied parameters stay
    one object), in the dtype ``dtypes`` names for its state-dict key (default: its own).

    Raises:
        ValueError: a non-persistent buffer is on ``meta`` (no checkpoint holds its values).
    """
    done: dict[int, torch.Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for slots in (module._parameters, module._buffers):
            for name, tensor in slots.items():
                if tensor is None or tensor.device.type != "meta":
                    continue
                if slots is module._buffers and name in module._non_persistent_buffers_set:
                    raise ValueError(f"buffer {dot}{name} is on meta and in no checkpoint; build it on a real device")
                if id(tensor) not in done:
                    empty = torch.empty_like(tensor, device=device, dtype=dtypes.get(dot + name, tensor.dtype))
                    is_param = isinstance(tensor, nn.Parameter)
                    done[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if is_param else empty
                slots[name] = done[id(tensor)]


def read_weights(path: Path, aliases: dict[str, str], *, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path``, each tied key of ``aliases`` (``{alias: kept name}``, held once
    in the file) under its own name too.

    Raises:
        ValueError: the file is missing or corrupt (see :func:`tensorslim.tensor_files.load_tensors`).
    """
    from tensorslim.tensor_files import load_tensors

    weights = load_tensors(path, device=device)
    weights.update({alias: weights[kept] for alias, kept in aliases.items() if kept in weights})
    return weights


def load_weights_(
    model: nn.Module,
    path: Path,
    aliases: dict[str, str],
    *,
    device: torch.device | str = "cpu",
    base_weights: dict[str, Any] | None = None,
) -> None:
    """Materialize ``model`` (see :func:`materialize_`) and load the safetensors file ``path`` into it, strictly;
    ``aliases`` name the tied keys the file holds once (``{alias: kept name}``). With ``base_weights`` (a manifest's
    record of the tensors a folder leaves to its base) a file without those tensors keeps the model's own, once
    their shapes and SHA-256 match the record.

    Raises:
        ValueError: the file is missing or corrupt, its keys or shapes do not match the model, or the model's base
            weights are not the recorded ones.
    """
    weights = read_weights(path, aliases, device=device)
    from_base: set[str] = set()
    if base_weights is not None and not model.state_dict().keys() <= weights.keys():  # a checkpoint holds them all
        from_base = _check_base_weights(model, base_weights, path)
    materialize_(model, {key: tensor.dtype for key, tensor in weights.items()}, device=device)
    expected = {key: tensor for key, tensor in model.state_dict().items() if key not in from_base}
    missing, extra = sorted(expected.keys() - weights.keys()), sorted(weights.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & weights.keys() if expected[k].shape != weights[k].shape)
    if missing or extra or wrong:
        raise ValueError(
            f"{path} does not match the model: missing {missing[:3]}, unexpected {extra[:3]}, wrong shape {wrong[:3]}"
        )
    model.load_state_dict(weights, strict=not from_base)


def _left_to_base(state: dict[str, torch.Tensor], reference: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` that ``reference`` holds bit for bit, when they are most of its bytes (else none: a
    folder that depends on its base for little stands alone)."""
    theirs = reference.state_dict()
    same = {
        name: tensor
        for name, tensor in state.items()
        if name in theirs
        and theirs[name].device.type != "meta"
        and theirs[name].dtype == tensor.dtype
        and theirs[name].shape == tensor.shape
        and torch.equal(theirs[name], tensor.detach().to(theirs[name].device))
    }
    size = sum(t.numel() * t.element_size() for t in state.values())
    return same if 2 * sum(t.numel() * t.element_size() for t in same.values()) >= size else {}


def _check_base_weights(model: nn.Module, record: dict[str, Any], path: Path) -> set[str]:
    """The names ``record`` (a manifest's ``base_weights``) leaves to the rebuilt ``model``, checked against it.

    Raises:
        ValueError: the rebuilt base lacks a tensor, has another shape, or other weights (another base, or another
            version of its weights).
    """
    state, shapes = model.state_dict(), record["shapes"]
    missing = sorted(name for name in shapes if name not in state or state[name].device.type == "meta")
    wrong = sorted(name for name in shapes.keys() - set(missing) if list(state[name].shape) != shapes[name])
    if missing or wrong:
        raise ValueError(
            f"{path} needs base weights its base does not build: missing {missing[:3]}, wrong shape {wrong[:3]}; "
            "allowed: the base the folder was trained on"
        )
    from tensorslim.tensor_files import weights_fingerprint

    found = weights_fingerprint({name: state[name] for name in shapes})
    if found != record["sha256"]:
        raise ValueError(
            f"{path} was trained on base weights with SHA-256 {record['sha256'][:16]}…, the rebuilt base has "
            f"{found[:16]}…; allowed: the base the folder was trained on (the same model and weights version)"
        )
    return set(shapes)


# --- the two verbs -----------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def save_pretrained(
    model: nn.Module,
    folder: str | os.PathLike,
    *,
    base: RegisteredBase | MethodBase | str | None = None,
    run: dict[str, Any] | None = None,
    reference: nn.Module | None = None,
) -> Path:
    """Write ``model`` (converted or not) to ``folder``: weights, the manifest of its conversions and its base.

    Args:
        model: any model; its layers of every registered family (low rank, CoLA-M, LaX, TT, TT embedding, Kron ...),
            its quantized layers and LoRA adapters are recorded with the configs that rebuild them.
        folder: created if missing; the files are replaced atomically one by one.
        base: the registered model it was built from (a name, whose overrides ``vocab_size``/``max_seq_len``/
            ``n_classes`` are read from ``model.config``, or a :class:`RegisteredBase`). None for a Hugging Face model
            (its config is saved as ``config.json``) or for a custom model, which :func:`load_pretrained` then needs
            as ``model=``. A :class:`MethodBase` (what a training run saves) records the method that builds the
            whole structure, so no layer is described.
        run: what a predictor needs beside the model (task, label names, tokenizer file), saved as the manifest's
            ``run`` (see :mod:`tensorslim.predict`).
        reference: the model as ``base`` rebuilds it with real weights (a pretrained base with fresh adapters). The
            tensors of ``model`` equal to its own are left out of the file when they are at least half its bytes;
            the manifest's ``base_weights`` records their shapes and SHA-256, and loading checks them on the rebuilt
            base. None: every tensor is written.

    Returns:
        The folder.

    Raises:
        ValueError: a layer cannot be described (e.g. LoRA adapters of different ranks), or ``base`` is unknown.
    """
    from tensorslim.checkpoint import unique_tensors
    from tensorslim.tensor_files import save_tensors, weights_fingerprint

    require_module(model)
    folder = Path(folder)
    record = _base_record(model, base)
    layers = [] if isinstance(base, MethodBase) else describe_layers(model)
    state = model.state_dict()
    from_base = _left_to_base(state, reference) if reference is not None else {}
    weights, aliases = unique_tensors({name: tensor for name, tensor in state.items() if name not in from_base})
    folder.mkdir(parents=True, exist_ok=True)
    if record["kind"] == "huggingface":
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(folder)
    tmp = folder / f".{WEIGHTS}.tmp"
    save_tensors(weights, tmp, metadata={"format": "pt"})
    os.replace(tmp, folder / WEIGHTS)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "base": record,
        "weights": WEIGHTS,
        "aliases": aliases,
        "layers": layers,
    }
    if from_base:
        manifest["base_weights"] = {
            "shapes": {name: list(tensor.shape) for name, tensor in from_base.items()},
            "sha256": weights_fingerprint(from_base),
        }
    if run is not None:
        manifest["run"] = run
    _write_json(folder / MANIFEST, manifest)
    return folder


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a folder written by :func:`save_pretrained`.

    Raises:
        ValueError: no manifest, or one of another format or a newer version.
    """
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(file_inside(folder, MANIFEST, what="manifest").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{folder} holds no readable {MANIFEST} ({error}); was it written by save_pretrained?"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} holds a JSON {type(manifest).__name__}; allowed: an object")
    if (
        manifest.get("format") != FORMAT
        or not isinstance(manifest.get("version"), int)
        or manifest["version"] > VERSION
    ):
        raise ValueError(
            f"{path} has format {manifest.get('format')!r} version {manifest.get('version')!r}; "
            f"allowed: {FORMAT!r} up to version {VERSION}"
        )
    _check_manifest(manifest, Path(folder), path)
    return manifest


def file_inside(folder: str | os.PathLike, name: object, *, what: str) -> Path:
    """The file ``name`` of ``folder``, refusing any way out of it: not a relative path string, ``..``, an absolute
    path, or a symbolic link that resolves outside the folder.

    Raises:
        ValueError: ``name`` leads outside ``folder`` (nothing is opened).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}={name!r} is invalid; allowed: the name of a file inside {folder}")
    relative, root = Path(name), Path(folder).resolve()
    target = (root / relative).resolve()
    if relative.is_absolute() or ".." in relative.parts or not target.is_relative_to(root):
        raise ValueError(f"{what}={name!r} leads outside {folder}; allowed: a file inside the folder")
    return target


_BASE_FIELDS = {
    "tensorslim": {
        "name": str,
        "task": str,
        "vocab_size": int | None,
        "max_seq_len": int | None,
        "n_classes": int | None,
    },
    "huggingface": {"architecture": str, "config": str},
    "method": {"name": str, "method": str, "task": str, "options": dict, "overrides": dict},
    "custom": {"class": str},
}


def _check_manifest(manifest: dict[str, Any], folder: Path, path: Path) -> None:
    """One-line errors for a manifest whose entries have the wrong JSON types or lead outside ``folder``, before
    anything is built, imported or read."""
    base = manifest.get("base")
    kinds = {**dict.fromkeys(BASE_BUILDERS, {}), **_BASE_FIELDS}  # a registered builder checks its own record
    if not isinstance(base, dict) or base.get("kind") not in kinds:
        raise ValueError(f"{path}: base={base!r} is invalid; allowed: an object whose kind is one of {sorted(kinds)}")
    for field, kind in kinds[base["kind"]].items():
        value = base.get(field)
        if field not in base or isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{path}: base.{field}={value!r} is invalid for kind {base['kind']!r}")
    if base["kind"] == "tensorslim":  # the overrides' ranges, as RegisteredBase checks them
        try:
            RegisteredBase(**{field: base[field] for field in _BASE_FIELDS["tensorslim"]})
        except ValueError as error:
            raise ValueError(f"{path}: base.{error}") from None
    if base["kind"] == "huggingface":
        if not base["architecture"].isidentifier():
            raise ValueError(f"{path}: base.architecture={base['architecture']!r} is invalid; allowed: a class name")
        file_inside(folder, base["config"], what=f"{path}: base.config")
    file_inside(folder, manifest.get("weights"), what=f"{path}: weights")
    aliases = manifest.get("aliases")
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise ValueError(f"{path}: aliases={aliases!r} is invalid; allowed: an object of tensor names")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not all(isinstance(entry, dict) for entry in layers):
        raise ValueError(f"{path}: layers={layers!r} is invalid; allowed: a list of objects")
    if "base_weights" in manifest:
        _check_base_weights_record(manifest["base_weights"], path)


def _check_base_weights_record(record: object, path: Path) -> None:
    shapes = record.get("shapes") if isinstance(record, dict) else None
    valid = (
        isinstance(shapes, dict)
        and isinstance(record.get("sha256"), str)
        and all(
            isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape)
            for shape in shapes.values()
        )
    )
    if not valid:
        raise ValueError(
            f"{path}: base_weights={str(record)[:80]!r} is invalid; allowed: an object with shapes (name: list of "
            "ints) and sha256 (a string)"
        )


def load_pretrained(
    folder: str | os.PathLike, *, model: nn.Module | None = None, device: torch.device | str = "cpu"
) -> nn.Module:
    """The model saved in ``folder`` by :func:`save_pretrained`, in eval mode (as Hugging Face's ``from_pretrained``).

    Args:
        folder: a folder written by :func:`save_pretrained`, a training run folder (its final ``model/``, else its
            latest checkpoint) or one of its checkpoint folders (see :func:`locate_model`).
        model: the unconverted base model, for a folder saved from a custom model (or to override the recorded
            base); best built on ``meta`` or under :func:`parameters_on_meta`, since its weights are replaced.
        device: where the weights are loaded.

    Raises:
        ValueError: a malformed folder, an unknown config type, weights that do not fit the rebuilt model, or an
            unknown device.
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if model is not None:
        require_module(model)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is invalid; allowed: a torch device such as 'cpu' or 'cuda'") from None
    manifest, structure, weights, aliases = locate_model(folder)
    built = _build_base(manifest["base"], structure, model)
    rebuild_layers(built, manifest["layers"])
    load_weights_(built, weights, aliases, device=device, base_weights=manifest.get("base_weights"))
    return built.to(device).eval()  # .to: the buffers the base built for itself


def locate_model(path: str | os.PathLike) -> tuple[dict[str, Any], Path, Path, dict[str, str]]:
    """Where a model is: ``(manifest, the folder it lies in, weights file, tied-key aliases)``.

    ``path`` is a folder written by :func:`save_pretrained`; a training run folder, whose final model is
    ``<run>/model/`` (an unfinished run: its latest checkpoint); or a checkpoint folder
    (``<run>/checkpoints/step_N``), whose weights are read into the structure the run's ``model/`` manifest
    describes, or, before the run has one, the structure its training method builds (:class:`MethodBase`).

    Raises:
        ValueError: ``path`` holds none of these.
    """
    from tensorslim.checkpoint import latest_checkpoint, read_state

    folder = Path(path)
    if (folder / MANIFEST).is_file():
        manifest = read_manifest(folder)
        return manifest, folder, file_inside(folder, manifest["weights"], what="weights"), manifest["aliases"]
    if (folder / RUN_MODEL / MANIFEST).is_file():
        return locate_model(folder / RUN_MODEL)
    if (folder / "checkpoints").is_dir():
        folder = latest_checkpoint(folder / "checkpoints") or folder
    if not ((folder / "state.json").is_file() and (folder / WEIGHTS).is_file()):
        raise ValueError(
            f"{path} holds no {MANIFEST}, run model or checkpoint; allowed: a save_pretrained folder, a training run "
            "folder or one of its checkpoint folders"
        )
    state = read_state(folder)
    run_model = folder.parent.parent / RUN_MODEL
    if (run_model / MANIFEST).is_file():
        manifest = read_manifest(run_model)
    else:
        manifest = {"base": _checkpoint_base(state, folder), "layers": []}
    return manifest, run_model, folder / WEIGHTS, state.get("aliases", {})


def _checkpoint_base(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The :class:`MethodBase` record of a checkpoint's training run (its config, head and data's model overrides)."""
    config, model = state.get("config"), state.get("model")
    if not isinstance(config, dict) or not isinstance(model, dict):
        raise ValueError(f"checkpoint {folder} does not record its model (config, head and model overrides)")
    base = MethodBase(
        name=config["preset"],
        method=config["method"],
        task=model["task"],
        options=config["options"],
        overrides=model["overrides"],
    )
    return _base_record(nn.Module(), base)
