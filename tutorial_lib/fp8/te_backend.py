"""The ``te-fp8`` backend: NVIDIA Transformer Engine (TE) modules behind the book's interfaces.

Importing this module never imports TE: every function that needs TE imports it lazily and
raises a ``RuntimeError`` naming the reason and the install route (``book/te_install.md``) when
it is missing. So the package, its tests and the book build run on machines without TE.

What it offers:
    - ``TELayers``: a ``LayerFactory`` (see ``layers.py``) that returns ``te.Linear`` and
      ``te.LayerNorm``, so ``GPT(cfg, layers=TELayers())`` is built from TE modules;
    - ``convert_to_te``: swaps the ``nn.Linear``/``nn.LayerNorm`` layers of an existing model
      for TE modules with the same weights (the tied embedding/LM head stays as it is);
    - ``te_recipe``/``te_autocast``: our delayed-scaling recipe as TE's, and TE's FP8 autocast
      (``te.autocast`` since TE 2.9, ``te.fp8_autocast`` before);
    - ``make_te_policy``/``register_te_policy``: the ``te-fp8`` precision policy.

Future work: TE's fused modules, ``LayerNormLinear`` (LayerNorm + QKV or FC1 in one module, so
the normalised activation is cast to FP8 once) and ``LayerNormMLP`` (the whole MLP), need a
change to the model's block structure, not just another layer factory.

The TE names, keyword arguments and defaults this module relies on are declared below in
``TE_API_USED`` and its siblings; ``tests/test_te_contract.py`` checks them against TE's source.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..hardware import cuda_capability
from ..hardware import te_available as _te_available
from ..layers import LINEAR_ROLES, TorchLayers
from ..precision import POLICIES, PrecisionPolicy, register_policy
from .linear import convertible_linears, fp8_layer_problems

__all__ = [
    "TE_API_USED", "TE_API_NAMED", "TE_DEFAULTS_ASSUMED", "TE_ENUM_MEMBERS", "TE_FWD_INDEX",
    "TE_BWD_INDEX", "TE_POLICY_NAME", "TELayers", "te_available", "te_recipe_kwargs", "te_recipe",
    "te_autocast", "fp8_shape_problems", "convert_to_te", "te_scaling_state",
    "check_te_fp8_device", "make_te_policy", "register_te_policy",
]  # fmt: skip

# ---- the TE API this module uses (checked by tests/test_te_contract.py) --------------------
# Callables we call -> the keyword arguments we pass them (always by keyword).
TE_API_USED: dict[str, tuple[str, ...]] = {
    "transformer_engine.pytorch.Linear": (
        "in_features", "out_features", "bias", "params_dtype", "device", "init_method",
    ),
    "transformer_engine.pytorch.LayerNorm": ("normalized_shape", "eps", "dtype", "device"),
    "transformer_engine.pytorch.autocast": ("enabled", "recipe", "amax_reduction_group"),
    "transformer_engine.pytorch.fp8_autocast": ("enabled", "fp8_recipe", "fp8_group"),
    "transformer_engine.pytorch.is_fp8_available": ("return_reason",),
    "transformer_engine.common.recipe.DelayedScaling": (
        "margin", "fp8_format", "amax_history_len", "amax_compute_algo", "reduce_amax",
    ),
}  # fmt: skip
# Names the docstrings and the book point readers to (existence only).
TE_API_NAMED: tuple[str, ...] = (
    "transformer_engine.pytorch.LayerNormLinear",
    "transformer_engine.pytorch.LayerNormMLP",
    "transformer_engine.pytorch.TransformerLayer",
    "transformer_engine.pytorch.DotProductAttention",
    "transformer_engine.pytorch.quantized_model_init",
    "transformer_engine.common.recipe.Format",
    "transformer_engine.common.recipe.Recipe",
    "transformer_engine.common.recipe.Float8CurrentScaling",
)
# Defaults we rely on by *not* passing an argument, or mirror in our own recipe (source text).
TE_DEFAULTS_ASSUMED: dict[str, dict[str, str]] = {
    "transformer_engine.common.recipe.DelayedScaling": {
        "margin": "0", "fp8_format": "Format.HYBRID", "amax_history_len": "1024",
        "amax_compute_algo": "'max'", "reduce_amax": "True",
    },
    "transformer_engine.pytorch.autocast": {"enabled": "True", "calibrating": "False"},
    "transformer_engine.pytorch.fp8_autocast": {"enabled": "True", "calibrating": "False"},
    "transformer_engine.pytorch.Linear": {
        "return_bias": "False", "parallel_mode": "None", "tp_size": "1",
        "sequence_parallel": "False",
    },
    "transformer_engine.pytorch.LayerNorm": {"zero_centered_gamma": "False"},
    "transformer_engine.pytorch.is_fp8_available": {"return_reason": "False"},
}  # fmt: skip
TE_ENUM_MEMBERS: dict[str, tuple[str, ...]] = {
    "transformer_engine.common.recipe.Format": ("E4M3", "E5M2", "HYBRID"),
}
# Rows of a TE module's scaling state (tex.FP8FwdTensors / FP8BwdTensors for one GEMM).
TE_FWD_INDEX: dict[str, int] = {"input": 0, "weight": 1, "output": 2}
TE_BWD_INDEX: dict[str, int] = {"grad_output": 0, "grad_input": 1}

TE_POLICY_NAME = "te-fp8"
TE_INSTALL_HINT = (
    "Install Transformer Engine on a CUDA machine (book/te_install.md): use NVIDIA's PyTorch "
    "container (nvcr.io/nvidia/pytorch), which ships it, or run "
    '`pip install --no-build-isolation "transformer-engine[pytorch]"` against a CUDA build of '
    "torch, with the CUDA toolkit and cuDNN installed."
)
_TE_FORMATS = ("E4M3", "HYBRID")  # what TE's DelayedScaling accepts (it rejects pure E5M2)


def te_available() -> tuple[bool, str]:
    """Whether ``transformer_engine.pytorch`` imports here, and why not if not."""
    return _te_available()


def _import_te() -> ModuleType:
    """``transformer_engine.pytorch``, or a ``RuntimeError`` saying why not and what to do."""
    ok, reason = te_available()
    if not ok:
        raise RuntimeError(f"Transformer Engine is needed here, but {reason}. {TE_INSTALL_HINT}")
    return importlib.import_module("transformer_engine.pytorch")


def _import_te_recipe() -> ModuleType:
    _import_te()
    return importlib.import_module("transformer_engine.common.recipe")


# ---- layers ------------------------------------------------------------------------------------
def _gpt2_normal_init(weight: torch.Tensor) -> None:
    """GPT-2's Linear init, N(0, 0.02); TE's own default is N(0, 0.023)."""
    nn.init.normal_(weight, mean=0.0, std=0.02)


def _freeze_zero_bias(norm: nn.Module) -> None:
    """TE's LayerNorm always has a bias: pin it to zero and keep it out of training."""
    with torch.no_grad():
        norm.bias.zero_()
    norm.bias.requires_grad_(False)


@dataclass
class TELayers(TorchLayers):
    """A ``LayerFactory`` returning ``te.Linear`` and ``te.LayerNorm``.

    ``GPT.__init__`` only re-initialises ``nn.Linear``, so the Linear layers get GPT-2's
    N(0, 0.02) here (through TE's ``init_method``); the ``proj`` rescaling still applies by
    name. TE's LayerNorm cannot drop its bias: with ``bias=False`` it is pinned to zero and
    frozen. Fused ``LayerNormLinear``/``LayerNormMLP`` layers are future work (module docstring).

    Placement:
        device: where parameters are allocated; None means the current CUDA device.
        params_dtype: parameter (master weight) dtype; None means torch's default (FP32).
    """

    device: torch.device | str | None = None
    params_dtype: torch.dtype | None = None

    def _device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda", torch.cuda.current_device())

    def _dtype(self) -> torch.dtype:
        return self.params_dtype or torch.get_default_dtype()

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        te = _import_te()
        return te.Linear(
            in_features=in_features, out_features=out_features, bias=bias,
            params_dtype=self._dtype(), device=self._device(), init_method=_gpt2_normal_init,
        )  # fmt: skip

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        te = _import_te()
        norm = te.LayerNorm(
            normalized_shape=features, eps=1e-5, dtype=self._dtype(), device=self._device()
        )
        if not bias:
            _freeze_zero_bias(norm)
        return norm


# ---- recipe and autocast -----------------------------------------------------------------------
_RECIPE_FIELDS = ("margin", "fp8_format", "amax_history_len", "amax_compute_algo", "reduce_amax")


def te_recipe_kwargs(recipe: object) -> dict[str, Any]:
    """Keyword arguments for TE's ``DelayedScaling`` from our recipe (read duck-typed).

    ``fp8_format`` comes back as the *name* of a TE ``Format`` member (``"HYBRID"`` or
    ``"E4M3"``), so this runs without TE. Our ``E5M2`` is refused: TE's ``DelayedScaling``
    rejects pure E5M2 training.
    """
    missing = [f for f in _RECIPE_FIELDS if not hasattr(recipe, f)]
    if missing:
        raise TypeError(
            f"{type(recipe).__name__} is not a delayed-scaling recipe: it lacks {missing}. "
            "Pass tutorial_lib.fp8.scaling.DelayedScaling (or TE's own recipe)."
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
    history = int(recipe.amax_history_len)  # type: ignore[attr-defined]
    if history < 1:
        raise ValueError(f"amax_history_len must be >= 1, got {history}.")
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


# ---- converting a built model ------------------------------------------------------------------
def fp8_shape_problems(model: nn.Module) -> list[str]:
    """Linear layers ``convert_to_te`` would swap whose shapes TE's FP8 GEMMs refuse (both weight
    dimensions must be multiples of 16; the token count, a multiple of 8, only the input shows).
    The same rule and wording as our own ``fp8_layer_problems``."""
    return fp8_layer_problems(model)


def _te_linear_like(te: ModuleType, old: nn.Linear, device: torch.device) -> nn.Module:
    new = te.Linear(
        in_features=old.in_features, out_features=old.out_features, bias=old.bias is not None,
        params_dtype=old.weight.dtype, device=device, init_method=_gpt2_normal_init,
    )  # fmt: skip
    with torch.no_grad():
        new.weight.copy_(old.weight)
        if old.bias is not None:
            new.bias.copy_(old.bias)
    new.weight.requires_grad_(old.weight.requires_grad)
    return new


def _te_layernorm_like(te: ModuleType, old: nn.LayerNorm, device: torch.device) -> nn.Module:
    dtype = old.weight.dtype if old.weight is not None else torch.get_default_dtype()
    new = te.LayerNorm(
        normalized_shape=tuple(old.normalized_shape), eps=old.eps, dtype=dtype, device=device
    )
    with torch.no_grad():
        if old.weight is not None:
            new.weight.copy_(old.weight)
        else:  # no affine transform: gain 1, kept out of training
            new.weight.fill_(1.0)
            new.weight.requires_grad_(False)
    if old.bias is not None:
        with torch.no_grad():
            new.bias.copy_(old.bias)
    else:
        _freeze_zero_bias(new)
    return new


def convert_to_te(model: nn.Module, device: torch.device | str | None = None) -> nn.Module:
    """Swap ``nn.Linear`` -> ``te.Linear`` and ``nn.LayerNorm`` -> ``te.LayerNorm`` in place.

    Weights, biases and eps are copied. Subclasses of those types and Linear layers whose weight
    is shared (a tied LM head) are left alone. TE modules are allocated on ``device`` (default:
    the old layer's device if it is a GPU, else the current CUDA device). Returns ``model``.
    """
    te = _import_te()
    problems = fp8_shape_problems(model)
    if problems:
        raise ValueError(
            "TE's FP8 GEMMs need Linear dimensions divisible by 16; these are not: "
            + "; ".join(problems)
            + ". Pick n_embd as a multiple of 16 (e.g. GPTConfig.from_name('tiny'))."
        )
    linears = {id(m) for _, m in convertible_linears(model)}
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in linears:
                new = _te_linear_like(te, child, _target_device(child.weight, device))
            elif type(child) is nn.LayerNorm:
                new = _te_layernorm_like(te, child, _target_device(child.weight, device))
            else:
                continue
            new.train(child.training)
            setattr(parent, child_name, new)
    return model


def _target_device(ref: torch.Tensor | None, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if ref is not None and ref.device.type == "cuda":
        return ref.device
    return torch.device("cuda", torch.cuda.current_device())


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
def check_te_fp8_device(device: torch.device) -> None:
    """Raise ``RuntimeError`` naming every reason ``device`` cannot run the ``te-fp8`` policy."""
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
            f"The {TE_POLICY_NAME!r} precision policy cannot run here: " + " ".join(problems)
            + " Use 'bf16' instead."
        )  # fmt: skip


def make_te_policy(recipe: object | None = None) -> PrecisionPolicy:
    """The ``te-fp8`` policy: TE modules, FP8 GEMMs under ``te_autocast`` with ``recipe``
    (default: delayed scaling with TE's defaults), everything else under BF16 autocast.

    TE refuses delayed scaling inside ``torch.compile`` (TE 2.20 raises at autocast entry), so
    do not compile a model trained under this policy.
    """
    converted: list[Any] = []  # TE's recipe, built on first use and then reused

    def region() -> contextlib.AbstractContextManager[None]:
        if not converted:
            converted.append(te_recipe(recipe))
        return te_autocast(enabled=True, recipe=converted[0])

    return PrecisionPolicy(
        name=TE_POLICY_NAME,
        description="Transformer Engine Linear/LayerNorm, FP8 GEMMs (delayed scaling), BF16 rest",
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp8",
        prepare_model=convert_to_te,
        extra_context=region,
        check=check_te_fp8_device,
    )


def register_te_policy() -> PrecisionPolicy:
    """Register ``te-fp8`` once (later calls return the registered policy); works without TE."""
    existing = POLICIES.get(TE_POLICY_NAME)
    if existing is not None:
        return existing
    return register_policy(make_te_policy())
