"""The ``te-fp8`` and ``te-fp8-fused`` precision policies: TE's recipe, autocast and checks.

    - ``te_recipe``/``te_autocast``: our delayed-scaling recipe as TE's, or any TE recipe by name
      (``DelayedScaling``, ``Float8CurrentScaling``, ``Float8BlockScaling``,
      ``MXFP8BlockScaling``, ``NVFP4BlockScaling``, or our short names ``TE_RECIPE_SHORT_NAMES``),
      and TE's FP8 autocast (``te.autocast``, TE 2.9 and later);
    - ``make_te_policy``/``register_te_policy``: the ``te-fp8`` and ``te-fp8-fused`` policies
      (TE modules from ``te_convert.convert_to_te``, GEMMs under ``te_autocast``), with the GPU
      check of their recipe (``TE_GPU_NEEDS``).

Importing this module never imports TE (``te_contract.import_te`` does, when a function needs
it); every TE call here is declared in ``TE_API_USED`` (``tests/te_contract_tables.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from ..hardware import cuda_capability, te_available
from ..precision import POLICIES, PrecisionPolicy, register_policy
from .recipes import RECIPES, DelayedScaling
from .scaling import Format
from .te_contract import (
    TE_ENUM_MEMBERS,
    TE_GPU_NEEDS,
    TE_INSTALL_HINT,
    TE_RECIPE_FIELDS,
    TE_RECIPE_POWER_2_FLAGS,
    TE_RECIPE_QPARAMS,
    TEGPUNeed,
    import_te,
)
from .te_convert import convert_to_te

__all__ = [
    "TE_POLICY_NAME",
    "TE_FUSED_POLICY_NAME",
    "TE_DELAYED_SPLIT_ACCUMULATOR",
    "TE_RECIPE_SHORT_NAMES",
    "as_delayed_scaling",
    "te_recipe_kwargs",
    "te_recipe_short_name",
    "te_recipe_options",
    "te_recipe_kind",
    "te_recipe",
    "te_autocast",
    "check_te_fp8_device",
    "make_te_policy",
    "register_te_policy",
]

TE_POLICY_NAME = "te-fp8"
TE_FUSED_POLICY_NAME = "te-fp8-fused"
_TE_FORMATS = ("E4M3", "HYBRID")  # what TE's DelayedScaling accepts (it rejects pure E5M2)


# ---- recipe and autocast -----------------------------------------------------------------------
_RECIPE_FIELDS = ("margin", "fp8_format", "amax_history_len", "amax_compute_algo", "reduce_amax")
# TE's DelayedScaling has no accumulation fields: its modules run the forward GEMM with fast
# accumulation and dgrad/wgrad with split accumulation (_2X_ACC_* in pytorch/module/base.py).
TE_DELAYED_SPLIT_ACCUMULATOR = {
    "fp8_gemm_fprop": False,
    "fp8_gemm_dgrad": True,
    "fp8_gemm_wgrad": True,
}


def as_delayed_scaling(recipe: object) -> DelayedScaling:
    """Our ``DelayedScaling`` from a delayed-scaling recipe read duck-typed: ours, TE's, or any
    object with their fields (``fp8_format`` a ``Format`` member or its name). Refused with our
    recipe's own checks: pure E5M2 (TE's ``DelayedScaling`` refuses it too), an unknown
    ``amax_compute_algo``, an empty history; and here, a GEMM accumulation other than TE's
    fixed one (``TE_DELAYED_SPLIT_ACCUMULATOR``), which TE's recipe cannot express."""
    missing = [f for f in _RECIPE_FIELDS if not hasattr(recipe, f)]
    if missing:
        te_name = getattr(type(recipe), "te_name", "")  # our other recipes name TE's class
        hint = f"name TE's recipe instead: recipe={te_name!r}, " if te_name else ""
        raise TypeError(
            f"{type(recipe).__name__} is not a delayed-scaling recipe: it lacks {missing}. "
            f"Pass tutorial_lib.fp8.DelayedScaling, {hint}or TE's own recipe."
        )
    for gemm, split in TE_DELAYED_SPLIT_ACCUMULATOR.items():
        params = getattr(recipe, gemm, None)
        if getattr(params, "use_split_accumulator", split) != split:
            raise ValueError(
                f"{gemm}={params!r}: TE's DelayedScaling fixes the accumulation (fast for the "
                "forward GEMM, split for dgrad and wgrad) and takes no such setting, so the "
                "te-fp8 policies need the defaults; use the fp8 policy to try another."
            )
    fields = {f: getattr(recipe, f) for f in _RECIPE_FIELDS}
    fmt = fields["fp8_format"]
    name = str(getattr(fmt, "name", fmt)).upper()
    if name not in Format.__members__:
        raise ValueError(f"Unknown FP8 format {fmt!r}; TE accepts {_TE_FORMATS}.")
    fields.update(fp8_format=Format[name], reduce_amax=bool(fields["reduce_amax"]))
    return DelayedScaling(**fields)


def te_recipe_kwargs(recipe: object) -> dict[str, Any]:
    """Keyword arguments for TE's ``DelayedScaling`` from a delayed-scaling recipe (checked by
    ``as_delayed_scaling``). ``fp8_format`` comes back as the *name* of a TE ``Format`` member
    (``"HYBRID"`` or ``"E4M3"``), so this runs without TE."""
    ours = as_delayed_scaling(recipe)
    return {f: getattr(ours, f) for f in _RECIPE_FIELDS} | {"fp8_format": ours.fp8_format.name}


# ---- TE's recipes by name ----------------------------------------------------------------------
# Our short names (those of fp8.get_quantizer) -> TE's recipe classes (each of ours names TE's).
TE_RECIPE_SHORT_NAMES: dict[str, str] = {n: c.te_name for n, c in RECIPES.items() if c.te_name}
_BY_NAME = {n.lower(): short for short, cls in TE_RECIPE_SHORT_NAMES.items() for n in (short, cls)}
_FORMAT_FIELDS = ("fp8_format", "fp4_format")  # given as a Format member or its name


def te_recipe_short_name(name: str) -> str:
    """Our short name for a TE recipe named by its TE class or short name (any case)."""
    short = _BY_NAME.get(name.lower()) if isinstance(name, str) else None
    if short is None:
        valid = ", ".join(repr(n) for pair in TE_RECIPE_SHORT_NAMES.items() for n in pair)
        raise ValueError(f"Unknown TE recipe {name!r}; valid names: {valid}.")
    return short


def te_recipe_options(name: str, **options: Any) -> tuple[str, dict[str, Any]]:
    """(TE class name, options) for ``te_recipe`` given a name, checked without TE: each option must
    be a field of TE's recipe class (``te_contract.TE_RECIPE_FIELDS``) and a format a member of
    TE's ``Format``, given by name (returned as its name)."""
    cls_name = TE_RECIPE_SHORT_NAMES[te_recipe_short_name(name)]
    fields = TE_RECIPE_FIELDS[cls_name]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TypeError(
            f"TE's {cls_name} has no option {', '.join(map(repr, unknown))}; its options "
            f"(the fields TE 2.9 to 2.20 all have) are {', '.join(map(repr, fields))}."
        )
    members = TE_ENUM_MEMBERS["transformer_engine.common.recipe.Format"]
    for field in set(_FORMAT_FIELDS) & set(options):
        value = options[field]
        options[field] = str(getattr(value, "name", value)).upper()
        if options[field] not in members:
            raise ValueError(f"{field}={value!r}: TE's Format has only {members}.")
    return cls_name, options


def _te_object_kind(recipe: object) -> tuple[bool, str | None]:
    """(is a TE recipe object, its short name or None for another TE recipe), read from the
    TE module already imported (a TE recipe object means TE is), so this never imports TE."""
    recipe_mod = sys.modules.get("transformer_engine.common.recipe")
    if recipe_mod is None:
        return False, None
    for short, cls_name in TE_RECIPE_SHORT_NAMES.items():
        cls = getattr(recipe_mod, cls_name, None)
        if isinstance(cls, type) and isinstance(recipe, cls):
            return True, short
    base = getattr(recipe_mod, "Recipe", None)
    return (isinstance(base, type) and isinstance(recipe, base)), None


def te_recipe_kind(recipe: object | None) -> str | None:
    """The short name of the recipe ``te_recipe`` would give for ``recipe``: a name, a TE
    recipe object (None for one of no known kind, e.g. TE's ``CustomRecipe``), None or ours
    ("delayed"; ours is checked here). Never imports TE."""
    if recipe is None:
        return "delayed"
    if isinstance(recipe, str):
        return te_recipe_short_name(recipe)
    is_te, kind = _te_object_kind(recipe)
    if is_te:
        return kind
    te_recipe_kwargs(recipe)  # ours: raises now if TE's DelayedScaling cannot express it
    return "delayed"


def te_recipe(recipe: object | None = None, **options: Any) -> Any:
    """TE's recipe for ``recipe``: a name (a TE class name or a short name), None (TE's
    ``DelayedScaling``: TE's defaults, which our recipe mirrors), a TE recipe (any kind,
    returned unchanged) or our delayed-scaling recipe (read duck-typed).

    ``options`` go with a name or None: the constructor's fields (checked by
    ``te_recipe_options``; TE's own checks raise ValueError). ``use_power_2_scales`` (current)
    and ``use_f32_scales`` (block) are also written into the recipe's ``fp8_quant_*``
    parameters, which TE's modules read instead of the flag
    (``te_contract.TE_RECIPE_POWER_2_FLAGS``); otherwise only the environment variable set
    before importing TE would change them."""
    by_name = recipe is None or isinstance(recipe, str)
    if by_name:
        cls_name, options = te_recipe_options(str(recipe or "delayed"), **options)
    elif options:
        raise TypeError(f"Recipe options {sorted(options)} go with a recipe name, not an object.")
    import_te()
    recipe_mod = importlib.import_module("transformer_engine.common.recipe")
    if not by_name:
        if _te_object_kind(recipe)[0]:  # any TE recipe, e.g. Float8CurrentScaling
            return recipe
        kwargs = te_recipe_kwargs(recipe)
        return recipe_mod.DelayedScaling(
            margin=kwargs["margin"],
            fp8_format=recipe_mod.Format[kwargs["fp8_format"]],
            amax_history_len=kwargs["amax_history_len"],
            amax_compute_algo=kwargs["amax_compute_algo"],
            reduce_amax=kwargs["reduce_amax"],
        )
    cls = getattr(recipe_mod, cls_name)
    for field in set(_FORMAT_FIELDS) & set(options):
        options[field] = recipe_mod.Format[options[field]]
    try:
        built = cls(**options)
    except (AssertionError, TypeError, ValueError) as err:  # TE asserts in __post_init__
        raise ValueError(f"TE's {cls_name} refuses the options {sorted(options)}: {err}") from err
    flag = TE_RECIPE_POWER_2_FLAGS.get(cls_name)
    if flag is not None and flag[0] in options:
        power_2 = bool(options[flag[0]]) == flag[1]
        for attr in TE_RECIPE_QPARAMS:
            qparams = dataclasses.replace(getattr(built, attr), power_2_scale=power_2)
            setattr(built, attr, qparams)
    return built


@contextlib.contextmanager
def te_autocast(
    enabled: bool = True, recipe: object | None = None, amax_reduction_group: Any = None
) -> Iterator[None]:
    """TE's FP8 region, ``te.autocast`` (TE 2.9 renamed it from ``fp8_autocast``).

    ``recipe`` may be ours (converted by ``te_recipe``) or TE's. None lets TE pick its default
    for the device (delayed scaling on Hopper and Ada, MXFP8 on Blackwell); the policy always
    passes one. The forward-pass scaling state updates when the outermost region exits.
    """
    te = import_te()
    converted = None if recipe is None else te_recipe(recipe)
    with te.autocast(enabled=enabled, recipe=converted, amax_reduction_group=amax_reduction_group):
        yield


# ---- the policy --------------------------------------------------------------------------------
def _gpu_problems(device: torch.device, need: TEGPUNeed, what: str) -> list[str]:
    gpu = cuda_capability(device)
    if gpu is None:
        return [f"it needs a CUDA GPU, {need.text}, for {what}; got {device}."]
    name, cc = gpu
    if cc < need.min_cc or (need.below_cc is not None and cc >= need.below_cc):
        return [f"{name} is sm_{cc[0]}{cc[1]}; {what} needs {need.text}."]
    cuda = torch.version.cuda  # TE compares torch's CUDA version, as here
    if need.min_cuda is not None and cuda and tuple(map(int, cuda.split(".")[:2])) < need.min_cuda:
        return [f"torch is built with CUDA {cuda}; {what} needs {need.text}."]
    return []


def check_te_fp8_device(
    device: torch.device, policy_name: str = TE_POLICY_NAME, recipe: str | None = "delayed"
) -> None:
    """Raise ``RuntimeError`` naming every reason ``device`` cannot run the ``te-fp8`` policy
    (or ``te-fp8-fused``: ``policy_name`` is the name the message gives) with ``recipe``: a TE
    recipe's name or short name (``TE_GPU_NEEDS``; None: TE's FP8 check, for a custom recipe).
    With TE, TE's own check for the recipe has the last word."""
    device = torch.device(device)
    kind = "delayed" if recipe is None else te_recipe_short_name(recipe)
    need = TE_GPU_NEEDS[kind]
    what = "a custom TE recipe" if recipe is None else TE_RECIPE_SHORT_NAMES[kind]
    problems = _gpu_problems(device, need, what)
    ok, reason = te_available()
    if not ok:
        problems.append(f"Transformer Engine is missing: {reason}. {TE_INSTALL_HINT}")
    elif not problems:
        te_ok, why = getattr(import_te(), need.te_check)(return_reason=True)
        if not te_ok:
            problems.append(f"TE reports no {need.label} support: {why}.")
    if problems:
        raise RuntimeError(
            f"The {policy_name!r} precision policy cannot run here: "
            + " ".join(problems)
            + " Use 'bf16' instead."
        )


_GEMMS = {
    "delayed": "FP8 GEMMs (delayed scaling)",
    "current": "FP8 GEMMs (current scaling)",
    "block": "FP8 GEMMs (block scaling)",
    "mxfp8": "MXFP8 GEMMs",
    "nvfp4": "NVFP4 GEMMs",
    None: "GEMMs under a custom TE recipe",
}


def make_te_policy(
    recipe: object | None = None, fused: bool = False, **recipe_options: Any
) -> PrecisionPolicy:
    """The ``te-fp8`` policy: TE modules, GEMMs under ``te_autocast`` with ``recipe``,
    everything else under BF16 autocast. ``recipe``: None (delayed scaling, TE's defaults), a TE
    recipe's name or short name (``TE_RECIPE_SHORT_NAMES``) with ``recipe_options`` for its
    constructor (``te_recipe``), a TE recipe object, or our delayed-scaling recipe. Names
    and options are checked now, without TE; the TE recipe is built on first use. The device
    check is the recipe's (``TE_GPU_NEEDS``).

    ``fused=True`` gives ``te-fp8-fused``: the same, but the model is converted with
    ``convert_to_te(fused=True)`` (LayerNormLinear/LayerNormMLP; TE's fused modules play the role
    our Triton kernels play in chapter 7).

    TE refuses delayed scaling inside ``torch.compile`` (TE 2.20 raises at autocast entry), so
    do not compile a model trained under it.
    """
    kind = te_recipe_kind(recipe)
    if recipe is None or isinstance(recipe, str):
        te_recipe_options(recipe or "delayed", **recipe_options)
    elif recipe_options:
        raise TypeError(f"Recipe options {sorted(recipe_options)} go with a recipe name.")
    converted: list[Any] = []  # TE's recipe, built on first use and then reused

    def region() -> contextlib.AbstractContextManager[None]:
        if not converted:
            converted.append(te_recipe(recipe, **recipe_options))
        return te_autocast(enabled=True, recipe=converted[0])

    name = TE_FUSED_POLICY_NAME if fused else TE_POLICY_NAME
    return PrecisionPolicy(
        name=name,
        description=(
            f"te-fp8 with TE's fused LayerNormLinear (QKV) and LayerNormMLP modules, {_GEMMS[kind]}"
            if fused
            else f"Transformer Engine Linear/LayerNorm, {_GEMMS[kind]}, BF16 rest"
        ),
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp8",
        prepare_model=functools.partial(convert_to_te, fused=fused),
        extra_context=region,
        check=functools.partial(check_te_fp8_device, policy_name=name, recipe=kind),
    )


def register_te_policy(fused: bool = False) -> PrecisionPolicy:
    """Register ``te-fp8`` and ``te-fp8-fused`` once each (later calls return the registered
    policies) and return ``te-fp8``, or ``te-fp8-fused`` if ``fused``; works without TE."""
    for fuse, name in ((False, TE_POLICY_NAME), (True, TE_FUSED_POLICY_NAME)):
        if name not in POLICIES:
            register_policy(make_te_policy(fused=fuse))
    return POLICIES[TE_FUSED_POLICY_NAME if fused else TE_POLICY_NAME]
