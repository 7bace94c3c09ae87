"""TE's recipes by name (``te_policy.te_recipe``) against TE's *real* recipe module.

``transformer_engine/common/recipe/__init__.py`` needs only pydantic, not CUDA, so each cached TE
version's file (``te_source``, as tests/test_te_contract.py reads it) is executed here as
``transformer_engine.common.recipe``, under a stand-in ``transformer_engine.pytorch``. That runs
TE's own dataclass validation and ``__post_init__`` checks: every field in
``te_contract.TE_RECIPE_FIELDS`` is a constructor keyword, the scale flags reach the
``fp8_quant_*`` parameters TE's modules read, and TE's refusals become ValueError. The
checkpoint path (``te_state``) keeps no extra state for the stateless recipes, as TE 2.20 does.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import TE_VERSIONS
from torch import nn

from tutorial_lib.checkpoint import load_model_state_dict, model_state_dict
from tutorial_lib.checkpoint.files import CheckpointError
from tutorial_lib.fp8.te_contract import (
    TE_RECIPE_FIELDS,
    TE_RECIPE_POWER_2_FLAGS,
    TE_RECIPE_QPARAMS,
)
from tutorial_lib.fp8.te_pickle import read_te_pickle, stateless_te_pickle
from tutorial_lib.fp8.te_policy import (
    TE_RECIPE_SHORT_NAMES,
    make_te_policy,
    te_recipe,
    te_recipe_kind,
)
from tutorial_lib.fp8.te_state import te_extra_state

try:
    import pydantic  # noqa: F401  (TE's recipe module needs it, as TE itself does)
except ImportError as exc:  # a missing test dependency fails, it does not skip
    raise ImportError("pydantic is missing: pip install -e '.[dev]'") from exc


@pytest.fixture(params=TE_VERSIONS)
def te_recipes(
    request: pytest.FixtureRequest,
    te_source: Callable[[str, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> types.ModuleType:
    """TE's recipe module of one cached version, importable as TE's (no CUDA needed)."""
    name = "transformer_engine.common.recipe"
    source = te_source(request.param, "common/recipe/__init__.py")
    root, common = types.ModuleType("transformer_engine"), types.ModuleType("_common")
    pytorch, recipe = types.ModuleType("_pytorch"), types.ModuleType(name)
    root.pytorch, root.common, common.recipe = pytorch, common, recipe
    for module_name, module in {
        "transformer_engine": root,
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.common": common,
        name: recipe,
    }.items():
        monkeypatch.setitem(sys.modules, module_name, module)
    exec(compile(source, f"te-{request.param}/{name}", "exec"), recipe.__dict__)
    return recipe


def _defaults(cls: type) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return {name: fields[name].default for name in TE_RECIPE_FIELDS[cls.__name__]}


@pytest.mark.parametrize("short", list(TE_RECIPE_SHORT_NAMES))
def test_every_declared_field_is_a_constructor_keyword(
    te_recipes: types.ModuleType, short: str
) -> None:
    cls = getattr(te_recipes, TE_RECIPE_SHORT_NAMES[short])
    assert type(te_recipe(short)) is cls and type(te_recipe(cls.__name__)) is cls
    options = _defaults(cls)  # every declared field, at TE's default
    built = te_recipe(short, **options)
    assert built == cls() and te_recipe_kind(built) == short
    assert te_recipe(built) is built  # a TE recipe passes through


def test_options_and_formats_reach_te(te_recipes: types.ModuleType) -> None:
    fmt = te_recipes.Format
    current = te_recipe("current", fp8_format="E4M3", fp8_dpa=True)
    assert current.fp8_format is fmt.E4M3 and current.fp8_dpa is True
    assert te_recipe("delayed", amax_history_len=16).amax_history_len == 16
    assert te_recipe("mxfp8", fp8_format=fmt.HYBRID).fp8_format is fmt.HYBRID
    nvfp4 = te_recipe("NVFP4BlockScaling", disable_rht=True)
    assert nvfp4.disable_rht and not nvfp4.fp4_quant_fwd_inp.random_hadamard_transform


@pytest.mark.parametrize("cls_name", sorted(TE_RECIPE_POWER_2_FLAGS))
def test_scale_flags_reach_the_qparams_te_reads(
    te_recipes: types.ModuleType, cls_name: str
) -> None:
    flag, direct = TE_RECIPE_POWER_2_FLAGS[cls_name]
    cls = getattr(te_recipes, cls_name)
    default = getattr(cls, TE_RECIPE_QPARAMS[0]).power_2_scale
    for value in (True, False):
        recipe = te_recipe(cls_name, **{flag: value})
        for attr in TE_RECIPE_QPARAMS:
            assert getattr(recipe, attr).power_2_scale is (value if direct else not value)
            assert getattr(cls, attr).power_2_scale is default  # TE's class is untouched
    plain = cls(**{flag: not direct})  # TE alone: the flag does not reach the parameters
    assert getattr(plain, TE_RECIPE_QPARAMS[0]).power_2_scale is default


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("block", {"x_block_scaling_dim": 2}, "2D by 2D"),
        ("delayed", {"fp8_format": "E5M2"}, "E5M2"),
        ("nvfp4", {"fp8_format": "HYBRID"}, "Only E4M3"),
        ("delayed", {"amax_history_len": "long"}, "amax_history_len"),
    ],
)
def test_te_refusals_are_value_errors(
    te_recipes: types.ModuleType, name: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=f"TE's .* refuses (?s:.*){match}"):
        te_recipe(name, **options)


def test_policy_builds_te_recipe_on_first_use(te_recipes: types.ModuleType) -> None:
    regions: list[dict[str, Any]] = []
    te = sys.modules["transformer_engine.pytorch"]
    te.autocast = lambda **kwargs: regions.append(kwargs) or torch.autocast("cpu", enabled=False)
    policy = make_te_policy("Float8BlockScaling", w_block_scaling_dim=1)
    assert policy.extra_context is not None
    with policy.extra_context():
        pass
    (kwargs,) = regions
    assert type(kwargs["recipe"]) is te_recipes.Float8BlockScaling
    assert kwargs["recipe"].w_block_scaling_dim == 1


class _TEModule(nn.Linear):
    """A TE module as the checkpoint code sees it: fp8_meta and its own extra state."""

    def __init__(self, recipe: object) -> None:
        super().__init__(16, 16)
        self.fp8_meta: dict[str, Any] = {"recipe": recipe, "num_gemms": 1, "fp8_checkpoint": True}

    def get_extra_state(self) -> torch.Tensor:  # TE 2.20 for a stateless recipe
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        assert isinstance(state, torch.Tensor) and state.numel() == 0, state


@pytest.mark.parametrize("short", [s for s in TE_RECIPE_SHORT_NAMES if s != "delayed"])
def test_checkpoints_keep_no_state_for_stateless_recipes(
    te_recipes: types.ModuleType, short: str
) -> None:
    """Current, block, MXFP8 and NVFP4 scaling have no amax history: the checkpoint stores an
    empty tensor for them (TE 2.20's ``is_stateless_recipe``; TE 2.9 pickles just the recipe
    object), and it loads back."""
    model = nn.Sequential(_TEModule(te_recipe(short)))
    assert te_extra_state(model[0]) is None
    state = model_state_dict(model)
    assert state["0._extra_state"].numel() == 0
    load_model_state_dict(nn.Sequential(_TEModule(te_recipe(short))), state)


def _te29_extra_state(recipe: object, **tensors: torch.Tensor) -> torch.Tensor:
    """What TE 2.9's ``get_extra_state`` saves: the pickled recipe and fp8_meta's plain values
    (and, for delayed scaling only, the scales and histories)."""
    state = {"recipe": recipe, **tensors, "extra_fp8_variables": {"num_gemms": 1, "x": [1, "a"]}}
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)


@pytest.mark.parametrize("short", [s for s in TE_RECIPE_SHORT_NAMES if s != "delayed"])
def test_te29_pickles_of_stateless_recipes_load_safely(
    te_recipes: types.ModuleType, short: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TE 2.9 checkpoint of a stateless recipe holds a pickle with nothing to restore: it is
    read with an allow-list (TE's recipe classes as inert stand-ins) and loads as empty state,
    with TE's unsafe-pickle opt-in unset."""
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    recipe = te_recipe(short)
    blob = _te29_extra_state(recipe)
    assert stateless_te_pickle(blob) == type(recipe).__name__
    content = read_te_pickle(blob)
    assert content["extra_fp8_variables"] == {"num_gemms": 1, "x": [1, "a"]}
    fmt = getattr(recipe, "fp8_format", None) or getattr(recipe, "fp4_format", None)
    saved = vars(content["recipe"])
    assert fmt.name in (saved.get("fp8_format"), saved.get("fp4_format"))  # Format by name
    state = {**nn.Sequential(_TEModule(recipe)).state_dict(), "0._extra_state": blob}
    load_model_state_dict(nn.Sequential(_TEModule(recipe)), state)  # no CheckpointError


class _Payload:
    calls: list[str] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Payload.calls.append, ("ran",))


def test_te_pickles_with_anything_else_are_refused(
    te_recipes: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    delayed = _te29_extra_state(te_recipe("delayed"), scale_fwd=torch.ones(3))
    assert stateless_te_pickle(delayed) is None  # tensors: torch's rebuilders are not allowed
    with pytest.raises(pickle.UnpicklingError, match="refused global"):
        read_te_pickle(delayed)
    evil = _te29_extra_state(te_recipe("current"), payload=_Payload())  # type: ignore[arg-type]
    with pytest.raises(pickle.UnpicklingError, match="refused global"):
        read_te_pickle(evil)
    assert stateless_te_pickle(evil) is None and _Payload.calls == []  # nothing ran
    model = nn.Sequential(_TEModule(te_recipe("current")))
    state = {**model.state_dict(), "0._extra_state": delayed}
    with pytest.raises(CheckpointError, match="pickled FP8 state"):
        load_model_state_dict(model, state)
