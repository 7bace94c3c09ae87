"""Move a delayed-scaling run between our ``FP8Linear`` (``fp8``) and Transformer Engine (``te-fp8``).

Both policies train the same GPT under the same recipe (``DelayedScaling()``, TE's defaults) and
keep the same FP8 state per Linear: an amax history of 3 forward and 2 backward columns and a
scale per column, with TE's column order and TE's history rows (``fp8.scaling``). Only where the
state lives differs:

    ``fp8``     six float32 buffers per ``FP8Linear`` (``fp8_amax_history_fwd``,
                ``fp8_scale_fwd``, ``fp8_scale_inv_fwd`` and the ``_bwd`` ones);
    ``te-fp8``  one ``_extra_state`` per ``te.Linear``, which our checkpoints store as tensors and
                plain data (``te_state.to_te_extra_state``; TE itself pickles it), and an empty
                ``_extra_state`` per ``te.LayerNorm`` (an op-based module in TE 2.9 and 2.20 that
                keeps no FP8 state).

Weights, biases, LayerNorm parameters, the optimizer (same parameters in the same order), the data
position, the random state and the history carry over unchanged. ``convert_checkpoint`` rewrites
a Trainer checkpoint's dict from one layout to the other; ``checkpoint.convert_checkpoint_file``
does it file to file (atomically) and ``python -m tutorial_lib convert-checkpoint`` is the
command. Not convertible, with an error that says so: the fused TE
model (``te-fp8-fused``: other module names), tensor-parallel checkpoints, other recipes, a
recipe other than the policies' default, and a TE checkpoint whose state is still TE's pickle
(written by ``model.state_dict()`` rather than our Trainer). The layouts are read from the GPT
the checkpoint's ``model_config`` builds (on the meta device: no memory, no TE).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import GPTConfig
from ..model import GPT
from .convert import convertible_linears
from .delayed_state import FP8_BUFFERS
from .recipes import DelayedScaling
from .scaling import FP8ModuleState, ScalingMeta
from .te_policy import te_recipe_kwargs
from .te_state import _EXTRA, TE_STATE_FORMAT, from_te_extra_state, to_te_extra_state

__all__ = ["CONVERTIBLE", "convert_checkpoint"]

CONVERTIBLE = ("fp8", "te-fp8")


def convert_checkpoint(state: dict[str, Any], to: str) -> dict[str, Any]:
    """A copy of the Trainer checkpoint ``state`` (a checkpoint file's content) rewritten for
    precision ``to`` (``"te-fp8"`` from an ``fp8`` run, ``"fp8"`` from a ``te-fp8`` run): the
    model's FP8 state moved between the layouts of the module docstring, and the precision in
    ``model_recipe`` and ``train_config`` changed. Raises ValueError naming what does not fit."""
    if to not in CONVERTIBLE:
        raise ValueError(f"Can convert to {CONVERTIBLE}, not {to!r}.")
    if state.get("format") != "tutorial_lib.checkpoint/2" or "model" not in state:
        raise ValueError("Not a tutorial_lib Trainer checkpoint (missing or unknown 'format').")
    recipe = state.get("model_recipe") or {}
    source = recipe.get("precision")
    want = CONVERTIBLE[0] if to == CONVERTIBLE[1] else CONVERTIBLE[1]
    if source != want:
        raise ValueError(
            f"The checkpoint was trained in precision {source!r}; converting to {to!r} needs one "
            f"trained in {want!r} (only delayed scaling moves between fp8 and te-fp8)."
        )
    if recipe.get("fused") or recipe.get("tp", 1) != 1:
        raise ValueError(
            "Only checkpoints of the plain layers on one process convert: this one has "
            f"fused={recipe.get('fused')}, tp={recipe.get('tp')} (fused layers and tensor "
            "parallelism keep other module layouts)."
        )
    if not state["model_config"].get("bias", True):
        raise ValueError(
            "A model without biases does not convert: TE's LayerNorm always has a bias, which "
            "te-fp8 keeps as a frozen zero, so the parameters would not line up."
        )
    linears, norms = _layout(state["model_config"])
    model = dict(state["model"])
    if to == "te-fp8":
        _to_te(model, linears, norms)
    else:
        _from_te(model, linears, norms)
    out = dict(state, model=model, model_recipe=dict(recipe, precision=to))
    if isinstance(state.get("train_config"), dict) and "precision" in state["train_config"]:
        out["train_config"] = dict(state["train_config"], precision=to)
    return out


def _layout(model_config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Names of the Linears both policies swap, and of the LayerNorms TE swaps."""
    with torch.device("meta"):
        model = GPT(GPTConfig(**model_config))
    linears = [name for name, _ in convertible_linears(model)]
    norms = [name for name, m in model.named_modules() if type(m) is nn.LayerNorm]
    return linears, norms


def _to_te(model: dict[str, Any], linears: list[str], norms: list[str]) -> None:
    recipe = DelayedScaling()  # both policies' default (make_fp8_policy, make_te_policy)
    fmt = recipe.fp8_format
    # what TE's fp8_meta holds as plain values once a te.Linear has run under this recipe
    # (init_fp8_metadata in pytorch/module/base.py, TE 2.9 and 2.20)
    variables = {
        "num_gemms": 1,
        "fp8_checkpoint": True,
        "fp8_max_fwd": fmt.fwd.max,
        "fp8_max_bwd": fmt.bwd.max,
    }
    for name in linears:
        keys = {d: [f"{name}.{b}" for b in names] for d, names in FP8_BUFFERS.items()}
        missing = [k for ks in keys.values() for k in ks if k not in model]
        if missing:
            raise ValueError(
                f"{name} has no delayed-scaling state ({missing[0]} is missing): not a "
                "checkpoint of an fp8 run of this model."
            )
        metas = [ScalingMeta(*(model.pop(k) for k in keys[d])) for d in ("forward", "backward")]
        length = metas[0].amax_history.shape[0]
        if length != recipe.amax_history_len:
            raise ValueError(
                f"{name}: amax history of {length} rows; the te-fp8 policy trains with TE's "
                f"default of {recipe.amax_history_len}, so the run cannot move as it is."
            )
        model[f"{name}.{_EXTRA}"] = to_te_extra_state(FP8ModuleState(*metas), recipe, variables)
    for name in norms:
        model[f"{name}.{_EXTRA}"] = torch.empty(0, dtype=torch.uint8)
    leftover = sorted(k for k in model if k.rsplit(".", 1)[-1].startswith("fp8_"))
    if leftover:
        raise ValueError(f"FP8 state te-fp8 has no place for: {leftover[:3]}.")


def _from_te(model: dict[str, Any], linears: list[str], norms: list[str]) -> None:
    recipe = DelayedScaling()  # both policies' default (make_fp8_policy, make_te_policy)
    for name in linears:
        key = f"{name}.{_EXTRA}"
        if key not in model:
            raise ValueError(f"{key} is missing: not a checkpoint of a te-fp8 run of this model.")
        metas = _linear_state(key, model.pop(key), recipe)
        for direction, meta in zip(FP8_BUFFERS, metas, strict=True):
            for buffer, field in zip(
                FP8_BUFFERS[direction], ("amax_history", "scale", "scale_inv"), strict=True
            ):
                model[f"{name}.{buffer}"] = getattr(meta, field)
    for name in norms:
        value = model.pop(f"{name}.{_EXTRA}", None)
        if value is not None and not (isinstance(value, torch.Tensor) and value.numel() == 0):
            raise ValueError(
                f"{name}.{_EXTRA} holds state a LayerNorm without FP8 should not have "
                f"({type(value).__name__}): not a checkpoint of an unfused te-fp8 run."
            )
    leftover = sorted(k for k in model if k.endswith(_EXTRA))
    if leftover:
        raise ValueError(f"TE state FP8Linear has no place for: {leftover[:3]}.")


def _linear_state(key: str, value: object, recipe: DelayedScaling) -> tuple[ScalingMeta, ...]:
    """Forward and backward ``ScalingMeta`` of one te.Linear's saved ``_extra_state``."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:  # the module never ran in FP8: a fresh state
            length = recipe.amax_history_len
            return ScalingMeta.create(3, length), ScalingMeta.create(2, length)
        raise ValueError(
            f"{key} is TE's pickled extra state (written by model.state_dict(), not by our "
            "Trainer). Resume it once under te-fp8 with our Trainer and save again, which "
            "writes it without pickle; then convert."
        )
    if not isinstance(value, dict) or value.get("format", TE_STATE_FORMAT) != TE_STATE_FORMAT:
        raise ValueError(f"{key}: not a TE extra state ({type(value).__name__}).")
    state, saved = from_te_extra_state(value)
    if te_recipe_kwargs(saved) != te_recipe_kwargs(recipe):
        raise ValueError(
            f"{key} was saved under {te_recipe_kwargs(saved)}; the fp8 policy trains with "
            f"{te_recipe_kwargs(recipe)}, so the run cannot move as it is."
        )
    return state.forward, state.backward
