"""The FP8 precision policies: ``FP8Linear`` layers under BF16 autocast, one policy per recipe.

    policy        recipe (``fp8.recipes``)
    fp8           DelayedScaling (TE's defaults)
    fp8-current   Float8CurrentScaling
    fp8-block     Float8BlockScaling
    mxfp8         MXFP8BlockScaling
    nvfp4         NVFP4BlockScaling
    fp8-rowwise   Float8RowwiseScaling (torchao's rowwise)

Each has a twin whose CPU emulation sums the GEMMs as an H100's FP8 tensor cores do (the
recipe's ``accumulation="hopper"``, ``fp8.mma``): its name ends in ``+hopper-acc``
(``fp8+hopper-acc``; ``fp8_policy_name``, the CLI's ``--fp8-accumulation hopper``). A run's
precision name, and so its checkpoint, records which it trained with.

``get_policy("fp8-block")`` (or ``"fp8-block+hopper-acc"``) works without importing this package
first: ``tutorial_lib.precision`` imports it lazily. Every policy keeps BF16 autocast on every
device, the CPU included (as slow or fast there as the CPU's BF16 kernels, but the numerics are
those of a GPU run); on the CPU the
FP8 GEMMs are emulated (``linear.py``, ``linear_function.py``). On a GPU that cannot run a recipe
natively, the policy's check raises an error naming the GPU it needs (``native.NATIVE``),
unless the policy was made with ``emulate=True``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from ..precision import POLICIES, VARIANTS, PrecisionPolicy, register_policy
from .autocast import autocast
from .convert import convert_to_fp8
from .gemm import check_accumulation
from .native import check_recipe_device
from .recipes import RECIPE_PRECISIONS, DelayedScaling, Recipe, make_recipe, recipe_name

__all__ = [
    "FP8_RECIPE_POLICIES",
    "FP8_LOSS_TOLERANCE",
    "HOPPER_ACCUMULATION",
    "fp8_policy_name",
    "make_fp8_policy",
    "register_fp8_policy",
    "register_fp8_policies",
    "register_fp8_variant",
    "runnable_fp8_precision",
]

# policy name -> recipe name, for every FP8 policy (``fp8`` is delayed scaling).
FP8_RECIPE_POLICIES: dict[str, str] = {p: r for r, p in RECIPE_PRECISIONS.items()}
# The end of the name of an FP8 policy whose emulation sums as Hopper's tensor cores do (a
# ``precision.VARIANTS`` entry: found by name, not listed).
HOPPER_ACCUMULATION = "+hopper-acc"
_VARIANT_NAMES = {p + HOPPER_ACCUMULATION for p in FP8_RECIPE_POLICIES}
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
    hopper = recipe.accumulation == "hopper"
    history = getattr(recipe, "amax_history_len", 1024)
    prepare = functools.partial(
        convert_to_fp8, emulate=emulate, amax_history_len=history, recipe=recipe
    )

    def region() -> contextlib.AbstractContextManager[None]:
        return autocast(recipe=recipe, emulate=emulate)

    def check(device: torch.device) -> None:  # a GPU without the recipe's math, unless emulated
        check_recipe_device(recipe, device, emulate, _WHO)

    sums = ", Hopper's accumulation" if hopper else ""
    return PrecisionPolicy(
        name=name or RECIPE_PRECISIONS[key] + (HOPPER_ACCUMULATION if hopper else ""),
        description=f"FP8Linear GEMMs ({_DESCRIPTIONS[key]}{sums}), BF16 autocast rest",
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp4" if key == "nvfp4" else "fp8",
        prepare_model=prepare,
        extra_context=region,
        check=check,
    )


def register_fp8_policy(name: str) -> PrecisionPolicy:
    """Register the FP8 policy ``name`` (one of ``FP8_RECIPE_POLICIES``, or one of them with
    ``HOPPER_ACCUMULATION``) once; later calls return the registered policy."""
    existing = POLICIES.get(name, VARIANTS.get(name))
    if existing is not None:
        return existing
    recipe = _recipe_of(name)  # a variant when it names Hopper's accumulation
    return register_policy(make_fp8_policy(recipe, name=name), variant=name in _VARIANT_NAMES)


def _recipe_of(name: str) -> Recipe:
    """The recipe an FP8 policy name trains with (its accumulation from the name's end)."""
    base = name.removesuffix(HOPPER_ACCUMULATION)
    if base not in FP8_RECIPE_POLICIES:
        raise ValueError(
            f"No FP8 policy {name!r}; the FP8 policies are {list(FP8_RECIPE_POLICIES)}, each "
            f"also with {HOPPER_ACCUMULATION!r} (Hopper's accumulation)."
        )
    accumulation = "exact" if base == name else "hopper"
    return make_recipe(FP8_RECIPE_POLICIES[base], accumulation=accumulation)


def register_fp8_variant(name: str) -> PrecisionPolicy | None:
    """Register ``name`` if it is an FP8 policy with ``HOPPER_ACCUMULATION`` (what
    ``precision.get_policy`` asks for a name nothing registered); None for any other name."""
    base = name.removesuffix(HOPPER_ACCUMULATION)
    if base == name or base not in FP8_RECIPE_POLICIES:
        return None
    return register_fp8_policy(name)


def fp8_policy_name(precision: str, accumulation: str) -> str:
    """The FP8 policy that trains ``precision``'s recipe with ``accumulation`` ("exact" or
    "hopper", ``fp8.gemm``), registered: ``precision`` itself (without ``HOPPER_ACCUMULATION``)
    for "exact", ``"<precision>+hopper-acc"`` for "hopper". A ValueError for a precision without
    this package's FP8 GEMMs (the CLI's ``--fp8-accumulation`` on ``--precision bf16``)."""
    check_accumulation(accumulation, "--fp8-accumulation")
    base = precision.removesuffix(HOPPER_ACCUMULATION)
    if base not in FP8_RECIPE_POLICIES:
        te = precision.startswith("te-")
        why = (
            "runs Transformer Engine's GEMMs, which only a GPU runs, summing as its hardware does"
            if te
            else "has no FP8 GEMMs"
        )
        raise ValueError(
            f"--fp8-accumulation chooses how this package's FP8 GEMMs are summed, and precision "
            f"{precision!r} {why}: drop --fp8-accumulation, or use it with --precision "
            f"{', '.join(FP8_RECIPE_POLICIES)}."
        )
    name = base + (HOPPER_ACCUMULATION if accumulation == "hopper" else "")
    register_fp8_policy(name)
    return name


def register_fp8_policies() -> list[PrecisionPolicy]:
    """Register every FP8 recipe's policy (``FP8_RECIPE_POLICIES``)."""
    return [register_fp8_policy(name) for name in FP8_RECIPE_POLICIES]


def runnable_fp8_precision(precision: str, device: torch.device | str) -> str:
    """``precision`` if ``device`` runs its recipe (natively, or a CPU's emulation); else the
    name of the same policy with the emulation switched on, ``"<precision>-emulated"``,
    registered on first use. For comparing recipes' numerics on a GPU that lacks some of them
    (Hopper has no MXFP8 or NVFP4 math); its timings are the emulation's, not the recipe's."""
    register_fp8_policy(precision)
    recipe = _recipe_of(precision)
    try:
        check_recipe_device(recipe, device, None, _WHO)
        return precision
    except RuntimeError:
        name = f"{precision}-emulated"
        if name not in POLICIES:
            register_policy(make_fp8_policy(recipe, emulate=True, name=name))
        return name
