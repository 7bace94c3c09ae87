"""The ``te-fp8`` and ``te-fp8-fused`` precision policies: TE's recipe, autocast and checks.

    - ``te_recipe``/``te_autocast``: our delayed-scaling recipe as TE's, and TE's FP8 autocast
      (``te.autocast`` since TE 2.9, ``te.fp8_autocast`` before);
    - ``te_scaling_state``: a TE module's amax histories and scales;
    - ``make_te_policy``/``register_te_policy``: the ``te-fp8`` and ``te-fp8-fused`` policies
      (TE modules from ``te_convert.convert_to_te``, FP8 GEMMs under ``te_autocast``).

Importing this module never imports TE (``te_contract._import_te`` does, when a function needs
it); every TE call here is declared in ``te_contract.TE_API_USED``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..checks import check_positive_int
from ..hardware import cuda_capability, te_available
from ..precision import POLICIES, PrecisionPolicy, register_policy
from .te_contract import TE_INSTALL_HINT, _import_te, _import_te_recipe
from .te_convert import convert_to_te

__all__ = [
    "TE_POLICY_NAME",
    "TE_FUSED_POLICY_NAME",
    "TE_DELAYED_SPLIT_ACCUMULATOR",
    "te_recipe_kwargs",
    "te_recipe",
    "te_autocast",
    "te_scaling_state",
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


def te_recipe_kwargs(recipe: object) -> dict[str, Any]:
    """Keyword arguments for TE's ``DelayedScaling`` from our recipe (read duck-typed).

    ``fp8_format`` comes back as the *name* of a TE ``Format`` member (``"HYBRID"`` or
    ``"E4M3"``), so this runs without TE. Our ``E5M2`` is refused: TE's ``DelayedScaling``
    rejects pure E5M2 training. So is a GEMM accumulation other than TE's fixed one
    (``TE_DELAYED_SPLIT_ACCUMULATOR``), which TE's recipe cannot express.
    """
    missing = [f for f in _RECIPE_FIELDS if not hasattr(recipe, f)]
    if missing:
        raise TypeError(
            f"{type(recipe).__name__} is not a delayed-scaling recipe: it lacks {missing}. "
            "Pass tutorial_lib.fp8.scaling.DelayedScaling (or TE's own recipe)."
        )
    for gemm, split in TE_DELAYED_SPLIT_ACCUMULATOR.items():
        params = getattr(recipe, gemm, None)
        if getattr(params, "use_split_accumulator", split) != split:
            raise ValueError(
                f"{gemm}={params!r}: TE's DelayedScaling fixes the accumulation (fast for the "
                "forward GEMM, split for dgrad and wgrad) and takes no such setting, so the "
                "te-fp8 policies need the defaults; use the fp8 policy to try another."
            )
    fmt = recipe.fp8_format  # type: ignore[attr-defined]
    name = str(getattr(fmt, "name", fmt)).upper()
    if name == "E5M2":
        raise ValueError(
            "TE's DelayedScaling does not support pure E5M2 training; use HYBRID (E4M3 forward, "
            "E5M2 backward) or E4M3."
        )
    if name not in _TE_FORMATS:
        raise ValueError(f"Unknown FP8 format {fmt!r}; TE accepts {_TE_FORMATS}.")
    algo = recipe.amax_compute_algo  # type: ignore[attr-defined]
    if not callable(algo) and algo not in ("max", "most_recent"):
        raise ValueError(f"amax_compute_algo must be 'max', 'most_recent' or a callable: {algo!r}")
    history = recipe.amax_history_len  # type: ignore[attr-defined]
    history = check_positive_int(history, "amax_history_len")
    return {
        "margin": recipe.margin,  # type: ignore[attr-defined]
        "fp8_format": name,
        "amax_history_len": history,
        "amax_compute_algo": algo,
        "reduce_amax": bool(recipe.reduce_amax),  # type: ignore[attr-defined]
    }


def te_recipe(recipe: object | None = None) -> Any:
    """TE's ``DelayedScaling`` equal to ``recipe`` (ours, read duck-typed); None gives TE's
    defaults, which our recipe mirrors. A TE recipe (any kind) is returned unchanged."""
    recipe_mod = _import_te_recipe()
    if recipe is None:
        return recipe_mod.DelayedScaling()
    te_types = tuple(
        t for t in (getattr(recipe_mod, "Recipe", None), recipe_mod.DelayedScaling) if t is not None
    )
    if isinstance(recipe, te_types):  # any TE recipe, e.g. Float8CurrentScaling
        return recipe
    kwargs = te_recipe_kwargs(recipe)
    return recipe_mod.DelayedScaling(
        margin=kwargs["margin"],
        fp8_format=recipe_mod.Format[kwargs["fp8_format"]],
        amax_history_len=kwargs["amax_history_len"],
        amax_compute_algo=kwargs["amax_compute_algo"],
        reduce_amax=kwargs["reduce_amax"],
    )


@contextlib.contextmanager
def te_autocast(
    enabled: bool = True, recipe: object | None = None, amax_reduction_group: Any = None
) -> Iterator[None]:
    """TE's FP8 region: ``te.autocast`` (TE >= 2.9) or ``te.fp8_autocast`` (older TE).

    ``recipe`` may be ours (converted by ``te_recipe``) or TE's. None lets TE pick its default
    for the device (delayed scaling on Hopper and Ada, MXFP8 on Blackwell); the policy always
    passes one. The forward-pass scaling state updates when the outermost region exits.
    """
    te = _import_te()
    converted = None if recipe is None else te_recipe(recipe)
    if hasattr(te, "autocast"):
        region = te.autocast(
            enabled=enabled, recipe=converted, amax_reduction_group=amax_reduction_group
        )
    else:
        region = te.fp8_autocast(
            enabled=enabled, fp8_recipe=converted, fp8_group=amax_reduction_group
        )
    with region:
        yield


def te_scaling_state(module: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of a TE module's delayed-scaling state, read from ``module.fp8_meta``.

    Returns ``{"forward": {"amax_history": (L, 3), "scale": (3,)}, "backward": {... (L, 2),
    (2,)}}`` for a ``te.Linear`` (rows: ``TE_FWD_INDEX``, ``TE_BWD_INDEX``); a direction is
    missing until the module has run under FP8 autocast. Row 0 of a history holds the amax being
    collected for the next update; older values sit in the rows below it, newest last.
    """
    meta = getattr(module, "fp8_meta", None)
    if not isinstance(meta, dict):
        raise TypeError(f"{type(module).__name__} has no TE fp8_meta; pass a TE module.")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, direction in (("scaling_fwd", "forward"), ("scaling_bwd", "backward")):
        state = meta.get(key)
        if state is not None and hasattr(state, "amax_history"):
            out[direction] = {
                "amax_history": state.amax_history.detach().clone(),
                "scale": state.scale.detach().clone(),
            }
    return out


# ---- the policy --------------------------------------------------------------------------------
def check_te_fp8_device(device: torch.device, policy_name: str = TE_POLICY_NAME) -> None:
    """Raise ``RuntimeError`` naming every reason ``device`` cannot run the ``te-fp8`` policy
    (or ``te-fp8-fused``: ``policy_name`` is the name the message gives)."""
    device = torch.device(device)
    problems: list[str] = []
    gpu = cuda_capability(device)
    if gpu is None:
        problems.append(
            f"it needs a CUDA GPU with FP8 tensor cores (sm_89+: Ada or Hopper), got {device}."
        )
    elif gpu[1] < (8, 9):
        name, cc = gpu
        problems.append(f"{name} is sm_{cc[0]}{cc[1]}; FP8 tensor cores need sm_89+.")
    ok, reason = te_available()
    if not ok:
        problems.append(f"Transformer Engine is missing: {reason}. {TE_INSTALL_HINT}")
    elif not problems:
        te = _import_te()
        if hasattr(te, "is_fp8_available"):
            fp8_ok, why = te.is_fp8_available(return_reason=True)
            if not fp8_ok:
                problems.append(f"TE reports no FP8 support: {why}.")
    if problems:
        raise RuntimeError(
            f"The {policy_name!r} precision policy cannot run here: "
            + " ".join(problems)
            + " Use 'bf16' instead."
        )


def make_te_policy(recipe: object | None = None, fused: bool = False) -> PrecisionPolicy:
    """The ``te-fp8`` policy: TE modules, FP8 GEMMs under ``te_autocast`` with ``recipe``
    (default: delayed scaling with TE's defaults), everything else under BF16 autocast.
    ``fused=True`` gives ``te-fp8-fused``: the same, but the model is converted with
    ``convert_to_te(fused=True)`` (LayerNormLinear/LayerNormMLP; TE's fused modules play the role
    our Triton kernels play in chapter 6).

    TE refuses delayed scaling inside ``torch.compile`` (TE 2.20 raises at autocast entry), so
    do not compile a model trained under this policy.
    """
    converted: list[Any] = []  # TE's recipe, built on first use and then reused

    def region() -> contextlib.AbstractContextManager[None]:
        if not converted:
            converted.append(te_recipe(recipe))
        return te_autocast(enabled=True, recipe=converted[0])

    name = TE_FUSED_POLICY_NAME if fused else TE_POLICY_NAME
    return PrecisionPolicy(
        name=name,
        description=(
            "te-fp8 with TE's fused LayerNormLinear (QKV) and LayerNormMLP modules"
            if fused
            else "Transformer Engine Linear/LayerNorm, FP8 GEMMs (delayed scaling), BF16 rest"
        ),
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp8",
        prepare_model=functools.partial(convert_to_te, fused=True) if fused else convert_to_te,
        extra_context=region,
        check=functools.partial(check_te_fp8_device, policy_name=name)
        if fused
        else check_te_fp8_device,
    )


def register_te_policy(fused: bool = False) -> PrecisionPolicy:
    """Register ``te-fp8`` and ``te-fp8-fused`` once each (later calls return the registered
    policies) and return ``te-fp8``, or ``te-fp8-fused`` if ``fused``; works without TE."""
    for fuse, name in ((False, TE_POLICY_NAME), (True, TE_FUSED_POLICY_NAME)):
        if name not in POLICIES:
            register_policy(make_te_policy(fused=fuse))
    return POLICIES[TE_FUSED_POLICY_NAME if fused else TE_POLICY_NAME]
