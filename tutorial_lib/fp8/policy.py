"""The FP8 precision policies: ``FP8Linear`` layers under BF16 autocast, one policy per recipe.

    policy        recipe (``fp8.recipes``)
    fp8           DelayedScaling (TE's defaults)
    fp8-current   Float8CurrentScaling
    fp8-block     Float8BlockScaling
    mxfp8         MXFP8BlockScaling
    nvfp4         NVFP4BlockScaling
    fp8-rowwise   Float8RowwiseScaling (torchao's rowwise)

``get_policy("fp8-block")`` works without importing this package first: ``tutorial_lib.precision``
imports it lazily. Every policy keeps BF16 autocast on every device, the CPU included (as slow or
fast there as the CPU's BF16 kernels, but the numerics are those of a GPU run); on the CPU the
FP8 GEMMs are emulated (``linear.py``, ``linear_function.py``). On a GPU that cannot run a recipe
natively, the policy's check raises an error naming the GPU it needs (``native.NATIVE``),
unless the policy was made with ``emulate=True``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from ..precision import POLICIES, PrecisionPolicy, register_policy
from .autocast import autocast
from .convert import convert_to_fp8
from .native import check_recipe_device
from .recipes import RECIPE_PRECISIONS, DelayedScaling, make_recipe, recipe_name

__all__ = [
    "FP8_RECIPE_POLICIES",
    "FP8_LOSS_TOLERANCE",
    "make_fp8_policy",
    "register_fp8_policy",
    "register_fp8_policies",
    "runnable_fp8_precision",
]

# policy name -> recipe name, for every FP8 policy (``fp8`` is delayed scaling).
FP8_RECIPE_POLICIES: dict[str, str] = {p: r for r, p in RECIPE_PRECISIONS.items()}
# How close (nats, per step) the fp8 policy's training loss stays to bf16's, same init and data.
# Measured on the CPU (emulated FP8 GEMMs; GPT 2 layers, 2 heads, width 32, block 32, batch 8,
# lr 3e-3, 2 warm-up steps, 20 steps, default DelayedScaling): max |fp8 - bf16| per step was
# 0.0003 for seed 0, 0.0137 at worst over seeds 0-19 (median 0.002); bf16 vs fp32 at worst
# 0.0089. 0.05 leaves a 3.6x margin over the worst seed and equals BF16_LOSS_TOLERANCE.
FP8_LOSS_TOLERANCE: float = 0.05
_WHO = "This FP8 precision policy"  # how a device check's error names the policy
_DESCRIPTIONS = {
    "delayed": "E4M3 fwd, E5M2 grads, delayed scaling",
    "current": "E4M3 fwd, E5M2 grads, per-tensor current scaling",
    "block": "E4M3, 1x128 / 128x128 tiles with power-of-two scales",
    "mxfp8": "E4M3, 1x32 blocks with E8M0 scales",
    "nvfp4": "E2M1, 16-element blocks, E4M3 + FP32 scales, RHT, stochastic rounding",
    "rowwise": "E4M3, one power-of-two scale per row (torchao rowwise)",
}


def make_fp8_policy(
    recipe: Any = None, emulate: bool | None = None, name: str | None = None
) -> PrecisionPolicy:
    """An FP8 policy: ``convert_to_fp8`` once, then every forward pass under BF16 autocast and
    ``autocast(recipe=...)``. ``recipe``: a recipe object or name (ours or TE's class name;
    default ``DelayedScaling()``, TE's defaults). ``name``: the policy's name (default: the
    recipe's precision name, ``fp8`` for delayed scaling)."""
    recipe = DelayedScaling() if recipe is None else make_recipe(recipe)
    key = recipe_name(recipe)
    history = getattr(recipe, "amax_history_len", 1024)
    prepare = functools.partial(
        convert_to_fp8, emulate=emulate, amax_history_len=history, recipe=recipe
    )

    def region() -> contextlib.AbstractContextManager[None]:
        return autocast(recipe=recipe, emulate=emulate)

    def check(device: torch.device) -> None:  # a GPU without the recipe's math, unless emulated
        check_recipe_device(recipe, device, emulate, _WHO)

    return PrecisionPolicy(
        name=name or RECIPE_PRECISIONS[key],
        description=f"FP8Linear GEMMs ({_DESCRIPTIONS[key]}), BF16 autocast rest",
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp4" if key == "nvfp4" else "fp8",
        prepare_model=prepare,
        extra_context=region,
        check=check,
    )


def register_fp8_policy(name: str) -> PrecisionPolicy:
    """Register the FP8 policy ``name`` once (later calls return the registered policy)."""
    existing = POLICIES.get(name)
    if existing is not None:
        return existing
    if name not in FP8_RECIPE_POLICIES:
        raise ValueError(
            f"No FP8 policy {name!r}; the FP8 policies are {list(FP8_RECIPE_POLICIES)}."
        )
    return register_policy(make_fp8_policy(FP8_RECIPE_POLICIES[name], name=name))


def register_fp8_policies() -> list[PrecisionPolicy]:
    """Register every FP8 recipe's policy (``FP8_RECIPE_POLICIES``)."""
    return [register_fp8_policy(name) for name in FP8_RECIPE_POLICIES]


def runnable_fp8_precision(precision: str, device: torch.device | str) -> str:
    """``precision`` if ``device`` runs its recipe (natively, or a CPU's emulation); else the
    name of the same policy with the emulation switched on, ``"<precision>-emulated"``,
    registered on first use. For comparing recipes' numerics on a GPU that lacks some of them
    (Hopper has no MXFP8 or NVFP4 math); its timings are the emulation's, not the recipe's."""
    register_fp8_policy(precision)
    try:
        check_recipe_device(FP8_RECIPE_POLICIES[precision], device, None, _WHO)
        return precision
    except RuntimeError:
        name = f"{precision}-emulated"
        if name not in POLICIES:
            recipe = FP8_RECIPE_POLICIES[precision]
            register_policy(make_fp8_policy(recipe, emulate=True, name=name))
        return name
