"""Transformer Engine's FP8 ``_extra_state`` without pickle: our state <-> TE's, safe checkpoints.

TE keeps a module's delayed-scaling state in ``module.fp8_meta`` and checkpoints it as the
module's ``_extra_state`` (``get_extra_state``/``set_extra_state`` of
``TransformerEngineBaseModule``, ``pytorch/module/base.py``, TE 2.9 and 2.20): a uint8 tensor
holding ``pickle.dumps`` of
    recipe                 the TE recipe object (``DelayedScaling``);
    scale_fwd (3n,), amax_history_fwd (L, 3n), scale_bwd (2n,), amax_history_bwd (L, 2n)
                           CPU float32 copies of ``fp8_meta["scaling_fwd"/"scaling_bwd"]``,
                           n GEMMs (no ``scale_inv``: TE derives it);
    extra_fp8_variables    the plain values (bool, int, float, str, tuple, list) of fp8_meta,
                           e.g. ``num_gemms``, ``fp8_checkpoint``, ``fp8_max_fwd``;
or an empty tensor when the module never ran in FP8 or its recipe keeps no state. Unpickling can
run arbitrary code: TE >= 2.18 refuses a pickled delayed-scaling state unless
``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` (``pytorch/_extra_state.py``), and our checkpoints
open with ``torch.load(weights_only=True)``.

Here the same content is kept as tensors and plain data (``TE_STATE_FORMAT``; the recipe as the
plain fields of ``te_policy.te_recipe_kwargs``):
    ``to_te_extra_state(state, recipe)`` / ``from_te_extra_state(extra)``: our
        ``FP8ModuleState`` + ``DelayedScaling`` <-> TE's layout (reading, the recipe may also be
        a TE recipe object, as in TE's unpickled dict). The columns (TE's ``FP8FwdTensors``,
        ``FP8BwdTensors``: ``scaling.GEMM1_*``, ``GRAD_*1``) and the history rows (row 0
        collecting, newest last) are TE's.
    ``te_extra_state(module)`` / ``load_te_extra_state(module, extra)``: read a live TE module
        in that form; restore it as TE's ``set_extra_state`` does (plain values and recipe into
        fp8_meta, ``init_fp8_meta_tensors``, copy the tensors), without pickle.
    ``te_extra_state_modules(model)``: the TE modules whose ``_extra_state`` a state dict holds
        (``checkpoint.model_state_dict`` and ``load_model_state_dict`` use these).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from .recipes import DelayedScaling
from .scaling import (
    BWD_TENSORS_PER_GEMM,
    FWD_TENSORS_PER_GEMM,
    FP8ModuleState,
    ScalingMeta,
)
from .te_policy import as_delayed_scaling, te_recipe, te_recipe_kwargs

__all__ = [
    "TE_STATE_FORMAT",
    "TE_UNSAFE_PICKLE_ENV",
    "to_te_extra_state",
    "from_te_extra_state",
    "te_extra_state",
    "load_te_extra_state",
    "check_te_extra_state",
    "te_extra_state_modules",
]

TE_STATE_FORMAT = "tutorial_lib.te_extra_state/1"
TE_UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"  # TE >= 2.18's opt-in to unpickle
_TENSOR_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_SKIPPED_META = ("buffer_index_and_autocast_key",)  # TE leaves it out of its extra state too


# ---- our state <-> TE's layout -------------------------------------------------------------------
def to_te_extra_state(
    state: FP8ModuleState,
    recipe: DelayedScaling,
    extra_fp8_variables: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """TE's ``_extra_state`` content for ``state`` under ``recipe``, as tensors and plain data.

    Keys: ``format`` (``TE_STATE_FORMAT``), ``recipe`` (plain fields: margin, fp8_format by
    name, amax_history_len, amax_compute_algo, reduce_amax), TE's four tensors (CPU float32
    copies) and ``extra_fp8_variables`` (default ``{"num_gemms": n}``). Loads with
    ``torch.load(weights_only=True)``. A callable ``amax_compute_algo`` cannot be stored
    without pickle: ValueError.
    """
    num_gemms = _num_gemms(state.forward.num_tensors, state.backward.num_tensors)
    extra = {"num_gemms": num_gemms} if extra_fp8_variables is None else extra_fp8_variables
    out: dict[str, Any] = {
        "format": TE_STATE_FORMAT,
        "recipe": _plain_recipe(recipe),
        "extra_fp8_variables": _plain_variables(extra),
    }
    for direction, meta in (("fwd", state.forward), ("bwd", state.backward)):
        out[f"scale_{direction}"] = meta.scale.detach().to("cpu", torch.float32).clone()
        out[f"amax_history_{direction}"] = meta.amax_history.detach().to("cpu", torch.float32)
        out[f"amax_history_{direction}"] = out[f"amax_history_{direction}"].clone()
    return out


def from_te_extra_state(extra: dict[str, Any]) -> tuple[FP8ModuleState, DelayedScaling]:
    """Our ``FP8ModuleState`` (``scale_inv = 1 / scale``) and ``DelayedScaling`` from TE's
    ``_extra_state`` content: ours (``to_te_extra_state``) or TE's unpickled dict (a TE recipe
    object). Checks the keys and the shapes (history length = the recipe's, 3 forward and 2
    backward columns per GEMM) and raises ValueError naming what is wrong."""
    if not isinstance(extra, dict):
        raise TypeError(f"TE extra state must be a dict, got {type(extra).__name__}.")
    if extra.get("format", TE_STATE_FORMAT) != TE_STATE_FORMAT:
        raise ValueError(f"Unknown TE extra-state format {extra['format']!r}.")
    missing = [k for k in ("recipe", *_TENSOR_KEYS) if k not in extra]
    if missing:
        raise ValueError(
            f"Not a delayed-scaling TE extra state: it lacks {missing} (keys {sorted(extra)})."
        )
    recipe = _our_recipe(extra["recipe"])
    metas = []
    for direction in ("fwd", "bwd"):
        history = _float_tensor(extra[f"amax_history_{direction}"], f"amax_history_{direction}")
        scale = _float_tensor(extra[f"scale_{direction}"], f"scale_{direction}")
        if history.dim() != 2 or history.shape[0] != recipe.amax_history_len:
            raise ValueError(
                f"amax_history_{direction} has shape {tuple(history.shape)}; the recipe's "
                f"amax_history_len is {recipe.amax_history_len}, so it must be (L, n) with L = "
                f"{recipe.amax_history_len}."
            )
        metas.append(ScalingMeta(history, scale, torch.ones_like(scale) / scale))
    state = FP8ModuleState(*metas)
    _num_gemms(state.forward.num_tensors, state.backward.num_tensors)
    return state, recipe


def _num_gemms(fwd_columns: int, bwd_columns: int) -> int:
    n, rest = divmod(fwd_columns, FWD_TENSORS_PER_GEMM)
    if rest or n < 1 or bwd_columns != BWD_TENSORS_PER_GEMM * n:
        raise ValueError(
            f"{fwd_columns} forward and {bwd_columns} backward columns: TE keeps 3 forward "
            "(input, weight, output) and 2 backward (grad_output, grad_input) per GEMM."
        )
    return n


def _plain_recipe(recipe: object) -> dict[str, Any]:
    kwargs = te_recipe_kwargs(recipe)
    if callable(kwargs["amax_compute_algo"]):
        raise ValueError(
            "A callable amax_compute_algo cannot be saved without pickle; checkpoint a recipe "
            "with amax_compute_algo 'max' or 'most_recent'."
        )
    return kwargs


def _our_recipe(recipe: object) -> DelayedScaling:
    """Our recipe from plain fields (a dict) or from a recipe object read duck-typed."""
    return as_delayed_scaling(SimpleNamespace(**recipe) if isinstance(recipe, dict) else recipe)


def _float_tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {value!r:.60}.")
    return value.detach().to(torch.float32).clone()


def _is_plain(value: object) -> bool:
    """Data ``torch.load(weights_only=True)`` reads back: numbers, strings, None, tensors, and
    lists, tuples and str-keyed dicts of them."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _plain_variables(variables: dict[str, Any]) -> dict[str, Any]:
    """The entries TE would store (bool, int, float, str, tuple, list values), kept only if they
    are plain all the way down (so no pickle is needed)."""
    return {
        k: v
        for k, v in variables.items()
        if k not in _SKIPPED_META
        and isinstance(v, bool | int | float | str | tuple | list)
        and _is_plain(v)
    }


# ---- live TE modules ---------------------------------------------------------------------------
def te_extra_state_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{state-dict key of its _extra_state: module}`` for every TE module of ``model``, read
    duck-typed: a dict ``fp8_meta`` and its own ``get_extra_state``."""
    return {
        f"{name}.{_EXTRA}" if name else _EXTRA: m
        for name, m in model.named_modules()
        if isinstance(getattr(m, "fp8_meta", None), dict)
        and type(m).get_extra_state is not nn.Module.get_extra_state
    }


_EXTRA = "_extra_state"  # torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX


def te_extra_state(module: nn.Module) -> dict[str, Any] | None:
    """A TE module's delayed-scaling state as ``to_te_extra_state`` writes it, read from its
    ``fp8_meta``; None where TE would save an empty tensor: TE's condition
    (``fp8_meta["fp8_checkpoint"] or module.fp8 or module.fp8_calibration``) is false, or the
    recipe has no state (current scaling and the other stateless recipes)."""
    meta: dict[str, Any] = getattr(module, "fp8_meta", None) or {}
    # TE's save condition (get_extra_state, pytorch/module/base.py)
    saved = meta.get("fp8_checkpoint") or getattr(module, "fp8", False)
    if not (saved or getattr(module, "fp8_calibration", False)):
        return None
    recipe = meta.get("recipe")
    delayed = getattr(recipe, "delayed", None)
    stateful = delayed() if callable(delayed) else hasattr(recipe, "amax_history_len")
    if recipe is None or not stateful or "scaling_fwd" not in meta or "scaling_bwd" not in meta:
        return None
    metas = []
    for key in ("scaling_fwd", "scaling_bwd"):
        scale = meta[key].scale.detach().float()
        history = meta[key].amax_history.detach().float()
        metas.append(ScalingMeta(history, scale, torch.ones_like(scale) / scale))
    return to_te_extra_state(FP8ModuleState(*metas), _our_recipe(recipe), meta)


def check_te_extra_state(module: nn.Module, extra: dict[str, Any]) -> DelayedScaling:
    """Raise ValueError if ``extra`` cannot load into ``module`` (malformed, or saved from a
    module with another number of GEMMs); else its recipe. Changes nothing, so a checkpoint can
    be checked whole before any of it loads."""
    state, recipe = from_te_extra_state(extra)
    saved = _num_gemms(state.forward.num_tensors, state.backward.num_tensors)
    meta = getattr(module, "fp8_meta", None) or {}
    expected = meta.get("num_gemms")  # TE sets it when the module first runs or is built
    if expected is not None and expected != saved:
        raise ValueError(
            f"{type(module).__name__}: the saved FP8 state is for {saved} GEMM(s), this module "
            f"runs {expected}: the checkpoint comes from another model."
        )
    return recipe


def load_te_extra_state(module: nn.Module, extra: dict[str, Any]) -> None:
    """Restore ``extra`` (``to_te_extra_state``'s form) into a TE module, as TE's
    ``set_extra_state`` does but without pickle: the plain values and the recipe (as TE's
    ``DelayedScaling``, through ``te_recipe``) into ``fp8_meta``, ``init_fp8_meta_tensors``,
    then the scales and histories copied in. Needs TE (for the recipe object). Nothing of the
    module changes unless the whole state fits it (``check_te_extra_state``)."""
    recipe = check_te_extra_state(module, extra)
    te_delayed = te_recipe(recipe)
    meta: dict[str, Any] = module.fp8_meta  # type: ignore[assignment]
    meta.update(extra.get("extra_fp8_variables", {}))
    meta["recipe"] = te_delayed
    meta.pop("global_fp8_buffer_pos_fwd_recompute", None)  # as TE's set_extra_state
    module.init_fp8_meta_tensors(te_delayed)  # type: ignore[operator]
    with torch.no_grad():
        for direction in ("fwd", "bwd"):
            target = meta[f"scaling_{direction}"]
            for name in ("scale", "amax_history"):
                source, dest = extra[f"{name}_{direction}"], getattr(target, name)
                if tuple(source.shape) != tuple(dest.shape):
                    raise ValueError(
                        f"{type(module).__name__}: the saved {name}_{direction} has shape "
                        f"{tuple(source.shape)}, the module's {tuple(dest.shape)} (another "
                        "number of GEMMs, or another amax_history_len)."
                    )
                dest.copy_(source)
