"""The ``te-fp8`` backends: NVIDIA Transformer Engine (TE) modules behind the book's interfaces.

Importing this module never imports TE: every function that needs TE imports it lazily and
raises a ``RuntimeError`` naming the reason and the install route (``book/te_install.md``) when
it is missing. So the package, its tests and the book build run on machines without TE.

What it offers:
    - ``TELayers``: a ``LayerFactory`` (see ``layers.py``) that returns ``te.Linear`` and
      ``te.LayerNorm``, so ``GPT(cfg, layers=TELayers())`` is built from TE modules;
    - ``convert_to_te``: swaps the ``nn.Linear``/``nn.LayerNorm`` layers of an existing model
      for TE modules with the same weights (the tied embedding/LM head stays as it is); with
      ``fused=True`` it also merges each block's LayerNorms into the layers they feed
      (``te.LayerNormLinear``, ``te.LayerNormMLP``; see ``convert_to_te``);
    - ``te_recipe``/``te_autocast``: our delayed-scaling recipe as TE's, and TE's FP8 autocast
      (``te.autocast`` since TE 2.9, ``te.fp8_autocast`` before);
    - ``make_te_policy``/``register_te_policy``: the ``te-fp8`` and ``te-fp8-fused`` policies.

The TE names, keyword arguments, defaults and parameter names this module relies on are declared
below in ``TE_API_USED`` and its siblings; ``tests/test_te_contract.py`` checks them against
TE's source.
"""

from __future__ import annotations

import contextlib
import functools
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
from ..model import Block
from ..precision import POLICIES, PrecisionPolicy, register_policy
from .linear import convertible_linears, fp8_layer_problems

__all__ = [
    "TE_API_USED",
    "TE_API_NAMED",
    "TE_DEFAULTS_ASSUMED",
    "TE_PARAMETER_NAMES",
    "TE_ENUM_MEMBERS",
    "TE_FWD_INDEX",
    "TE_BWD_INDEX",
    "TE_POLICY_NAME",
    "TE_FUSED_POLICY_NAME",
    "TELayers",
    "TEFusedMLP",
    "te_available",
    "te_recipe_kwargs",
    "te_recipe",
    "te_autocast",
    "fp8_shape_problems",
    "convert_to_te",
    "te_scaling_state",
    "check_te_fp8_device",
    "make_te_policy",
    "register_te_policy",
]

# ---- the TE API this module uses (checked by tests/test_te_contract.py) --------------------
# Callables we call -> the keyword arguments we pass them (always by keyword).
TE_API_USED: dict[str, tuple[str, ...]] = {
    "transformer_engine.pytorch.Linear": (
        "in_features",
        "out_features",
        "bias",
        "params_dtype",
        "device",
        "init_method",
    ),
    "transformer_engine.pytorch.LayerNorm": ("normalized_shape", "eps", "dtype", "device"),
    "transformer_engine.pytorch.LayerNormLinear": (
        "in_features",
        "out_features",
        "eps",
        "bias",
        "normalization",
        "params_dtype",
        "device",
        "init_method",
    ),
    "transformer_engine.pytorch.LayerNormMLP": (
        "hidden_size",
        "ffn_hidden_size",
        "eps",
        "bias",
        "normalization",
        "activation",
        "params_dtype",
        "device",
        "init_method",
        "output_layer_init_method",
    ),
    "transformer_engine.pytorch.autocast": ("enabled", "recipe", "amax_reduction_group"),
    "transformer_engine.pytorch.fp8_autocast": ("enabled", "fp8_recipe", "fp8_group"),
    "transformer_engine.pytorch.is_fp8_available": ("return_reason",),
    "transformer_engine.common.recipe.DelayedScaling": (
        "margin",
        "fp8_format",
        "amax_history_len",
        "amax_compute_algo",
        "reduce_amax",
    ),
}
# Names the docstrings and the book point readers to (existence only).
TE_API_NAMED: tuple[str, ...] = (
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
        "margin": "0",
        "fp8_format": "Format.HYBRID",
        "amax_history_len": "1024",
        "amax_compute_algo": "'max'",
        "reduce_amax": "True",
    },
    "transformer_engine.pytorch.autocast": {"enabled": "True", "calibrating": "False"},
    "transformer_engine.pytorch.fp8_autocast": {"enabled": "True", "calibrating": "False"},
    "transformer_engine.pytorch.Linear": {
        "return_bias": "False",
        "parallel_mode": "None",
        "tp_size": "1",
        "sequence_parallel": "False",
    },
    "transformer_engine.pytorch.LayerNorm": {"zero_centered_gamma": "False"},
    # One output tensor, one unsplit weight called "weight", no tensor parallelism, gain 1 + 0.
    "transformer_engine.pytorch.LayerNormLinear": {
        "return_bias": "False",
        "return_layernorm_output": "False",
        "parameters_split": "None",
        "parallel_mode": "None",
        "tp_size": "1",
        "sequence_parallel": "False",
        "zero_centered_gamma": "False",
    },
    "transformer_engine.pytorch.LayerNormMLP": {
        "return_bias": "False",
        "return_layernorm_output": "False",
        "set_parallel_mode": "False",
        "tp_size": "1",
        "sequence_parallel": "False",
        "zero_centered_gamma": "False",
    },
    "transformer_engine.pytorch.is_fp8_available": {"return_reason": "False"},
}
# The parameter names we copy weights into (test_te_contract.py finds each in the class's source).
TE_PARAMETER_NAMES: dict[str, tuple[str, ...]] = {
    "transformer_engine.pytorch.Linear": ("weight", "bias"),
    "transformer_engine.pytorch.LayerNorm": ("weight", "bias"),
    "transformer_engine.pytorch.LayerNormLinear": (
        "layer_norm_weight",
        "layer_norm_bias",
        "weight",
        "bias",
    ),
    "transformer_engine.pytorch.LayerNormMLP": (
        "layer_norm_weight",
        "layer_norm_bias",
        "fc1_weight",
        "fc1_bias",
        "fc2_weight",
        "fc2_bias",
    ),
}
TE_ENUM_MEMBERS: dict[str, tuple[str, ...]] = {
    "transformer_engine.common.recipe.Format": ("E4M3", "E5M2", "HYBRID"),
}
# Rows of a TE module's scaling state (tex.FP8FwdTensors / FP8BwdTensors for one GEMM).
TE_FWD_INDEX: dict[str, int] = {"input": 0, "weight": 1, "output": 2}
TE_BWD_INDEX: dict[str, int] = {"grad_output": 0, "grad_input": 1}

TE_POLICY_NAME = "te-fp8"
TE_FUSED_POLICY_NAME = "te-fp8-fused"
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


# What a TE module's parameter gets: a tensor is copied (and keeps its requires_grad); a number
# fills a parameter TE cannot drop and keeps it out of training (a LayerNorm's missing bias is 0,
# a missing gain 1); None leaves a parameter the source does not have (a Linear without bias).
_Sources = dict[str, torch.Tensor | float | None]


def _copy_into(new: nn.Module, sources: _Sources) -> nn.Module:
    """The one place weights enter a TE module: ``new.<name>`` from ``sources[name]``."""
    with torch.no_grad():
        for name, source in sources.items():
            param = getattr(new, name)
            if isinstance(source, torch.Tensor):
                param.copy_(source)
                param.requires_grad_(source.requires_grad)
            elif source is not None:
                param.fill_(source)
                param.requires_grad_(False)
    return new


def _norm_sources(norm: nn.LayerNorm, prefix: str = "") -> _Sources:
    return {
        f"{prefix}weight": 1.0 if norm.weight is None else norm.weight,
        f"{prefix}bias": 0.0 if norm.bias is None else norm.bias,
    }


def _linear_sources(linear: nn.Linear, prefix: str = "") -> _Sources:
    return {f"{prefix}weight": linear.weight, f"{prefix}bias": linear.bias}


@dataclass
class TELayers(TorchLayers):
    """A ``LayerFactory`` returning ``te.Linear`` and ``te.LayerNorm``.

    ``GPT.__init__`` only re-initialises ``nn.Linear``, so the Linear layers get GPT-2's
    N(0, 0.02) here (through TE's ``init_method``); the ``proj`` rescaling still applies by
    name. TE's LayerNorm cannot drop its bias: with ``bias=False`` it is pinned to zero and
    frozen. A factory builds one layer at a time, so it cannot return TE's fused
    ``LayerNormLinear``/``LayerNormMLP`` (a LayerNorm merged into the layer it feeds): build the
    GPT, then ``convert_to_te(model, fused=True)``, as the ``te-fp8-fused`` policy does.

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
            in_features=in_features,
            out_features=out_features,
            bias=bias,
            params_dtype=self._dtype(),
            device=self._device(),
            init_method=_gpt2_normal_init,
        )

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        te = _import_te()
        norm = te.LayerNorm(
            normalized_shape=features, eps=1e-5, dtype=self._dtype(), device=self._device()
        )
        return norm if bias else _copy_into(norm, {"bias": 0.0})


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
        in_features=old.in_features,
        out_features=old.out_features,
        bias=old.bias is not None,
        params_dtype=old.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
    )
    return _copy_into(new, _linear_sources(old))


def _te_layernorm_like(te: ModuleType, old: nn.LayerNorm, device: torch.device) -> nn.Module:
    dtype = old.weight.dtype if old.weight is not None else torch.get_default_dtype()
    new = te.LayerNorm(
        normalized_shape=tuple(old.normalized_shape), eps=old.eps, dtype=dtype, device=device
    )
    return _copy_into(new, _norm_sources(old))


def convert_to_te(
    model: nn.Module, device: torch.device | str | None = None, fused: bool = False
) -> nn.Module:
    """Swap ``nn.Linear`` -> ``te.Linear`` and ``nn.LayerNorm`` -> ``te.LayerNorm`` in place.

    Weights, biases and eps are copied. Subclasses of those types and Linear layers whose weight
    is shared (a tied LM head) are left alone. TE modules are allocated on ``device`` (default:
    the old layer's device if it is a GPU, else the current CUDA device). Returns ``model``.

    ``fused=True`` first merges, in every GPT ``Block``, each LayerNorm into what it feeds:
        ``ln1`` + ``attn.qkv`` -> ``te.LayerNormLinear`` as ``attn.qkv``, ``ln1`` -> Identity;
        ``ln2`` + ``mlp`` -> ``TEFusedMLP`` (``te.LayerNormMLP`` + the MLP's dropout) as ``mlp``,
        ``ln2`` -> Identity.
    The rest (``attn.proj``, ``ln_f``) is swapped as above. The function is the same: TE's
    ``"gelu"`` is GPT-2's tanh approximation (see ``_te_layernorm_mlp_like``). What fusion buys:
    the normalised activation goes from the LayerNorm kernel straight into the GEMM (under FP8,
    TE's LayerNorm can write it in FP8 directly), and TE's GELU kernel can write FC2's FP8 input
    directly; under delayed scaling the backward pass can fuse GELU's derivative with FC1's bias
    gradient (``module/layernorm_linear.py``, ``module/layernorm_mlp.py`` in TE 2.9 and 2.20).
    The state dict changes names (``attn.qkv.layer_norm_weight``, ``mlp.layernorm_mlp.fc1_weight``
    ...), so checkpoints of the fused and unfused models do not load into each other.

    We stop there. ``te.TransformerLayer`` would fuse the whole block, attention included (TE's
    ``DotProductAttention``: flash or cuDNN kernels, and the residual adds and dropouts inside),
    but it replaces our attention with TE's, defaults to sequence-first inputs
    (``attn_input_format="sbhd"``) and interleaves Q, K and V per head in a fused QKV weight
    (``qkv_weight_interleaved=True``). Keeping our ``CausalSelfAttention`` keeps one attention
    implementation in the book and a state we can compare layer by layer with the other policies.
    """
    te = _import_te()
    problems = fp8_shape_problems(model)
    if problems:
        raise ValueError(
            "TE's FP8 GEMMs need Linear dimensions divisible by 16; these are not: "
            + "; ".join(problems)
            + ". Pick n_embd as a multiple of 16 (e.g. GPTConfig.from_name('tiny'))."
        )
    if fused:
        _fuse_blocks(te, model, device)
    linears = {id(m) for _, m in convertible_linears(model)}
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in linears:
                new = _te_linear_like(te, child, _target_device(child.weight, device))
            elif type(child) is nn.LayerNorm:
                new = _te_layernorm_like(te, child, _target_device(child.weight, device))
            else:
                continue
            _install(parent, child_name, new)
    return model


def _install(parent: nn.Module, name: str, new: nn.Module) -> None:
    new.train(getattr(parent, name).training)
    setattr(parent, name, new)


# ---- fused blocks: TE's LayerNormLinear and LayerNormMLP -----------------------------------
class TEFusedMLP(nn.Module):
    """``te.LayerNormMLP`` (LayerNorm, FC1, GELU, FC2 in one module) and then the MLP's dropout,
    which TE's module does not have. ``convert_to_te(fused=True)`` installs it as ``Block.mlp``."""

    def __init__(self, layernorm_mlp: nn.Module, dropout: float) -> None:
        super().__init__()
        self.layernorm_mlp = layernorm_mlp
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.layernorm_mlp(x))  # (B, T, C): the residual stream, not normalised


_FUSED_PARTS = {
    "ln1": nn.LayerNorm,
    "attn.qkv": nn.Linear,
    "ln2": nn.LayerNorm,
    "mlp.fc": nn.Linear,
    "mlp.proj": nn.Linear,
}


def _fusion_problems(name: str, block: nn.Module) -> list[str]:
    """Why ``block`` is not the plain-PyTorch ``Block`` that fusion expects (empty: it is)."""
    problems = []
    for part, kind in _FUSED_PARTS.items():
        module = _submodule_or_none(block, part)
        if type(module) is not kind:
            found = "missing" if module is None else type(module).__name__
            problems.append(f"{name}.{part} is {found}, not {kind.__name__}")
    if not problems and (block.mlp.fc.bias is None) != (block.mlp.proj.bias is None):
        problems.append(f"{name}.mlp: fc and proj must both have a bias or neither")
    return problems


def _submodule_or_none(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _fuse_blocks(te: ModuleType, model: nn.Module, device: torch.device | str | None) -> None:
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, Block)]
    problems = [p for name, block in blocks for p in _fusion_problems(name, block)]
    if not blocks or problems:
        raise ValueError(
            "convert_to_te(fused=True) fuses the LayerNorms of plain-PyTorch GPT blocks "
            "(nn.LayerNorm, nn.Linear) into TE's LayerNormLinear/LayerNormMLP; "
            + ("; ".join(problems) if problems else "this model has no Block")
            + ". Convert a GPT built with the default TorchLayers, or use fused=False."
        )
    for _, block in blocks:
        target = _target_device(block.attn.qkv.weight, device)
        _install(
            block.attn, "qkv", _te_layernorm_linear_like(te, block.ln1, block.attn.qkv, target)
        )
        _install(block, "mlp", _te_layernorm_mlp_like(te, block.ln2, block.mlp, target))
        block.ln1, block.ln2 = nn.Identity(), nn.Identity()


def _te_layernorm_linear_like(
    te: ModuleType, norm: nn.LayerNorm, linear: nn.Linear, device: torch.device
) -> nn.Module:
    new = te.LayerNormLinear(
        in_features=linear.in_features,
        out_features=linear.out_features,
        eps=norm.eps,
        bias=linear.bias is not None,
        normalization="LayerNorm",
        params_dtype=linear.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
    )
    return _copy_into(new, {**_norm_sources(norm, "layer_norm_"), **_linear_sources(linear)})


def _te_layernorm_mlp_like(
    te: ModuleType, norm: nn.LayerNorm, mlp: nn.Module, device: torch.device
) -> nn.Module:
    fc, proj = mlp.fc, mlp.proj
    # TE's "gelu" is the tanh approximation, GPT-2's: transformer_engine/common/util/math.h
    # computes x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 * x^2))), i.e. sqrt(2/pi) and
    # sqrt(2/pi) * 0.044715; the Python side agrees (ops/basic/activation.py's GELU docstring,
    # jit.py's bias_gelu_fused_, LayerNormMLP's ONNX path: F.gelu(approximate="tanh")).
    # "qgelu" is a different function, x * sigmoid(1.702 x).
    new = te.LayerNormMLP(
        hidden_size=fc.in_features,
        ffn_hidden_size=fc.out_features,
        eps=norm.eps,
        bias=fc.bias is not None,
        normalization="LayerNorm",
        activation="gelu",
        params_dtype=fc.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
        output_layer_init_method=_gpt2_normal_init,
    )
    sources = {
        **_norm_sources(norm, "layer_norm_"),
        **_linear_sources(fc, "fc1_"),
        **_linear_sources(proj, "fc2_"),
    }
    dropout = getattr(_submodule_or_none(mlp, "drop"), "p", 0.0)
    return TEFusedMLP(_copy_into(new, sources), dropout)


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
