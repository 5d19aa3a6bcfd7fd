"""Folders edited by someone else are refused in one line before anything outside them is read, anything is
imported or run, or any model is built; and nothing in the package unpickles or evaluates file contents."""

from __future__ import annotations

import ast
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tensorslim.convert import convert_
from tensorslim.layers.lowrank import CoLAConfig
from tensorslim.models.registry import build_model
from tensorslim.pretrained import MANIFEST, WEIGHTS, load_pretrained, save_pretrained

PACKAGE = Path(__file__).resolve().parents[2] / "tensorslim"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=64, max_seq_len=16)
    convert_(model, CoLAConfig(rank=8, init="random"))
    return save_pretrained(model, tmp_path_factory.mktemp("saved") / "model", base="tiny")


def _edit(manifest: dict, key: str, value: object) -> None:
    node = manifest
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value


def _copy(saved: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    return folder


@pytest.fixture
def outside(tmp_path: Path, saved: Path) -> Path:
    """A valid weights file outside the loaded folder: a loader that follows a path out would read it happily."""
    target = tmp_path / "outside" / "w.safetensors"
    target.parent.mkdir()
    shutil.copy(saved / WEIGHTS, target)
    return target


EDITS = [
    ("weights", "../outside/w.safetensors", "leads outside"),
    ("base", "tiny", "base='tiny' is invalid"),
    ("base.kind", "pickle", "base={'kind': 'pickle'"),
    ("base.name", 7, "base.name=7 is invalid"),
    ("base.vocab_size", -5, "base.vocab_size=-5 is invalid"),
    ("base.vocab_size", "64", "base.vocab_size='64' is invalid"),
    ("aliases", ["a"], "aliases=['a'] is invalid"),
    ("layers", {"x": 1}, "layers={'x': 1} is invalid"),
    ("weights", 3, "weights=3 is invalid"),
]


@pytest.mark.parametrize(("key", "value", "message"), EDITS)
def test_an_edited_manifest_is_refused_in_one_line(
    key: str, value: object, message: str, saved: Path, tmp_path: Path, outside: Path
) -> None:
    folder = _copy(saved, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    _edit(manifest, key, value)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as error:
        load_pretrained(folder)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_absolute_path_or_a_link_out_of_the_folder_is_not_followed(
    saved: Path, tmp_path: Path, outside: Path
) -> None:
    folder = _copy(saved, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "weights": str(outside)}))
    with pytest.raises(ValueError, match="leads outside"):
        load_pretrained(folder)
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).symlink_to(outside)  # the manifest's own name, now a link out
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="leads outside"):
        load_pretrained(folder)
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).symlink_to(saved / MANIFEST)  # the manifest itself a link out
    with pytest.raises(ValueError, match="no readable"):
        load_pretrained(folder)


def test_an_unknown_family_or_class_is_named_not_imported(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an importable module that leaves a mark when imported: the loader must name it, never import it
    (tmp_path / "hostile_probe.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nConfig = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = _copy(saved, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["layers"][0]["config"]["type"] = "hostile_probe.Config"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="'hostile_probe.Config' is unknown"):
        load_pretrained(folder)
    hf = {**manifest, "base": {"kind": "huggingface", "architecture": "hostile_probe.Config", "config": "config.json"}}
    (folder / MANIFEST).write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="base.architecture='hostile_probe.Config' is invalid"):
        load_pretrained(folder)
    assert not (tmp_path / "imported").exists() and "hostile_probe" not in sys.modules


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[12] ^= 0x40  # inside the JSON header
    path.write_bytes(bytes(data))


def _flip_data(path: Path) -> None:
    """One bit flipped in the middle of the tensor data (after the 8-byte length and the JSON header)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[(start + len(data)) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _recorded_digest(path: Path) -> str:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        return handle.metadata()["tensorslim.sha256"]


def _other_shapes(path: Path) -> None:
    torch.manual_seed(1)
    save_file(build_model("tiny", vocab_size=32, max_seq_len=16).state_dict(), path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncate, "missing or corrupt"),
        (_flip_header, "missing or corrupt"),
        (_flip_data, "is corrupt: its tensors have SHA-256"),
        (_other_shapes, "does not match"),
    ],
)
def test_a_damaged_weights_file_is_refused_in_one_line(
    damage: Callable[[Path], None], message: str, saved: Path, tmp_path: Path
) -> None:
    folder = _copy(saved, tmp_path)
    damage(folder / WEIGHTS)
    with pytest.raises(ValueError, match=message) as error:
        load_pretrained(folder)
    assert "\n" not in str(error.value)


def _saved_run(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A run folder as training leaves it: ``model/`` (save_pretrained) and one checkpoint of the same model."""
    from tensorslim.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=64, max_seq_len=16)
    convert_(model, CoLAConfig(rank=8, init="random"))
    run = tmp_path / "run"
    save_pretrained(model, run / "model", base="tiny")
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(run / "checkpoints", step=2, model=model, optimizer=optimizer, state={})
    return run, model


@pytest.mark.parametrize("damage", [_flip_data, _truncate])
@pytest.mark.parametrize("where", ["model", "checkpoints/step_0000002"])
def test_a_damaged_run_folder_is_refused_naming_the_file(damage: Callable, where: str, tmp_path: Path) -> None:
    run, model = _saved_run(tmp_path)
    path = run / where / WEIGHTS
    expected = _recorded_digest(path)
    damage(path)
    with pytest.raises(ValueError) as error:
        load_pretrained(run / where)
    message = str(error.value)
    assert str(path) in message and "\n" not in message
    if damage is _flip_data:  # the recorded digest and the one found, by prefix
        assert f"written with {expected[:16]}…" in message and "have SHA-256 " in message
    else:
        assert "missing or corrupt" in message
    if where == "model":  # the run folder itself loads its model/ folder: refused the same way
        with pytest.raises(ValueError, match="corrupt") as error:
            load_pretrained(run)
        assert str(error.value) == message


def _linear_checkpoint(tmp_path: Path) -> Path:
    """A checkpoint of a ``Linear(64, 32)`` after one AdamW step (its optimizer state and RNG included)."""
    from tensorslim.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    return save_checkpoint(tmp_path / "checkpoints", step=2, model=model, optimizer=optimizer, state={})


@pytest.mark.parametrize("damage", [_flip_data, _truncate])
@pytest.mark.parametrize("file", ["model.safetensors", "state.safetensors"])
def test_a_damaged_checkpoint_is_refused_and_nothing_is_loaded(damage: Callable, file: str, tmp_path: Path) -> None:
    from tensorslim.checkpoint import load_checkpoint

    path = _linear_checkpoint(tmp_path)
    damage(path / file)
    fresh = torch.nn.Linear(64, 32)
    before = {name: tensor.clone() for name, tensor in fresh.state_dict().items()}
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match=f"checkpoint {path} is corrupt or incomplete: {path / file} ") as error:
        load_checkpoint(path, model=fresh, optimizer=fresh_optimizer)
    assert "\n" not in str(error.value)
    assert all(torch.equal(fresh.state_dict()[name], tensor) for name, tensor in before.items())
    assert fresh_optimizer.state_dict()["state"] == {} and torch.equal(torch.get_rng_state(), rng)


def test_a_weights_file_without_a_recorded_digest_still_loads(saved: Path, tmp_path: Path) -> None:
    """Folders written before digests were recorded (or by another safetensors writer) load unchecked."""
    from safetensors.torch import load_file

    folder = _copy(saved, tmp_path)
    tensors = load_file(folder / WEIGHTS)
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    loaded = load_pretrained(folder).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


# --- no unpickling, no evaluation of file contents ------------------------------------------------------------------

_UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "jsonpickle"}


def _keyword(call: ast.Call, name: str) -> object:
    found = [kw.value for kw in call.keywords if kw.arg == name]
    return found[0].value if found and isinstance(found[0], ast.Constant) else ("missing" if not found else "dynamic")


def unsafe_loads(source: str) -> list[str]:
    """Calls and imports that can run code from a file: pickle and its kin, ``torch.load`` without
    ``weights_only=True``, ``numpy.load`` with ``allow_pickle`` not False, ``yaml.load``, builtin ``eval``/``exec``,
    ``trust_remote_code`` not False."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"line {node.lineno}: imports {n}" for n in names if n and n.split(".")[0] in _UNSAFE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = ast.unparse(func)
        if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if name.endswith("torch.load") and _keyword(node, "weights_only") is not True:
            found.append(f"line {node.lineno}: torch.load without weights_only=True")
        if name in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") is not False:
            found.append(f"line {node.lineno}: {name} without allow_pickle=False")
        if name == "yaml.load":
            found.append(f"line {node.lineno}: yaml.load")
        if _keyword(node, "trust_remote_code") not in ("missing", False):
            found.append(f"line {node.lineno}: trust_remote_code")
    return found


def test_the_scan_finds_what_it_looks_for() -> None:
    bad = (
        "import pickle\nfrom dill import loads\nimport torch\ntorch.load(f)\ntorch.load(f, weights_only=False)\n"
        "np.load(p)\neval(text)\nexec(code)\nyaml.load(s)\nAutoModel.from_pretrained(p, trust_remote_code=True)\n"
    )
    assert [int(hit.split()[1].rstrip(":")) for hit in unsafe_loads(bad)] == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    good = "torch.load(f, weights_only=True)\nnp.load(p, allow_pickle=False)\nmodel.eval()\nyaml.safe_load(s)\n"
    assert unsafe_loads(good) == []


# Evaluations of the package's own source, never of a file's contents: the config checks resolve the annotation
# strings of our dataclasses (``from __future__ import annotations``) in their defining module.
OWN_SOURCE = {"_checks.py": ["eval(field.type, vars(sys.modules[owner.__module__]))"]}


def test_nothing_in_the_package_unpickles_or_evaluates_file_contents() -> None:
    report = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        hits = [hit for hit in unsafe_loads(path.read_text()) if hit.split(": ", 1)[1] not in OWN_SOURCE.get(name, [])]
        if hits:
            report[name] = hits
    assert report == {}
    assert len(list(PACKAGE.rglob("*.py"))) > 50


@pytest.mark.parametrize("name", ["../../outside", "/etc", "step_0000002/../../x", "linked"])
def test_an_edited_checkpoint_pointer_never_leads_out(name: str, tmp_path: Path) -> None:
    from tensorslim.checkpoint import latest_checkpoint

    root = tmp_path / "run" / "checkpoints"
    (root / "step_0000002").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "linked").symlink_to(tmp_path / "outside")
    (root / "latest").write_text(name)
    with pytest.raises(ValueError, match="checkpoint pointer") as error:
        latest_checkpoint(root)
    assert "\n" not in str(error.value)
    (root / "latest").write_text("step_0000002\n")
    assert latest_checkpoint(root) == root / "step_0000002"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda state: [state], "without an integer step"),
        (lambda state: {**state, "step": "2"}, "without an integer step"),
        (lambda state: {**state, "aliases": ["x"]}, r"aliases=\['x'\]"),
        (lambda state: {**state, "optimizer": "x"}, "does not match the optimizer"),
        (lambda state: {**state, "optimizer": {"state": 5, "param_groups": []}}, "does not match the optimizer"),
    ],
)
def test_an_edited_checkpoint_state_is_refused_in_one_line(edit: Callable, message: str, tmp_path: Path) -> None:
    from tensorslim.checkpoint import load_checkpoint

    path = _linear_checkpoint(tmp_path)
    state = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps(edit(state)))
    fresh = torch.nn.Linear(64, 32)
    with pytest.raises(ValueError, match=message) as error:
        load_checkpoint(path, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("damage", [_flip_data, _truncate])
def test_damaged_adapters_are_refused_before_the_base_is_equipped(damage: Callable, tmp_path: Path) -> None:
    from tensorslim.layers.adapters import equip_, load_adapters, save_adapters, unipelt
    from tests.unit.test_adapters import tiny_bert

    model = tiny_bert()
    equip_(model, unipelt())
    save_adapters(model, tmp_path)
    damage(tmp_path / "adapters.safetensors")
    fresh = tiny_bert()
    with pytest.raises(ValueError, match="corrupt") as error:
        load_adapters(fresh, tmp_path)
    assert "\n" not in str(error.value)
    assert not hasattr(fresh, "pelt_config")  # refused before the base was touched
