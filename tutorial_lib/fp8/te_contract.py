"""The Transformer Engine (TE) API the ``te-fp8`` backends rely on, and the guarded TE import.

Importing this module never imports TE. ``_import_te`` imports it lazily and raises a
``RuntimeError`` naming the reason and the install route (``book/te_install.md``) when it is
missing, so the package, its tests and the book build run on machines without TE. Whether TE
imports at all is ``tutorial_lib.hardware.te_available``.

The TE names, keyword arguments, defaults and parameter names that ``te_convert`` and
``te_policy`` rely on are declared here in ``TE_API_USED`` and its siblings;
``tests/test_te_contract.py`` checks them against TE's source (and that those two modules pass TE
no keyword these tables do not declare).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..hardware import te_available

__all__ = [
    "TE_API_USED",
    "TE_API_NAMED",
    "TE_DEFAULTS_ASSUMED",
    "TE_PARAMETER_NAMES",
    "TE_ENUM_MEMBERS",
    "TE_FWD_INDEX",
    "TE_BWD_INDEX",
    "TE_INSTALL_HINT",
]

# ---- the TE API the backends use (checked by tests/test_te_contract.py) --------------------
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

TE_INSTALL_HINT = (
    "Install Transformer Engine on a CUDA machine (book/te_install.md): use NVIDIA's PyTorch "
    "container (nvcr.io/nvidia/pytorch), which ships it, or run "
    '`pip install --no-build-isolation "transformer-engine[pytorch]"` against a CUDA build of '
    "torch, with the CUDA toolkit and cuDNN installed."
)


def _import_te() -> ModuleType:
    """``transformer_engine.pytorch``, or a ``RuntimeError`` saying why not and what to do."""
    ok, reason = te_available()
    if not ok:
        raise RuntimeError(f"Transformer Engine is needed here, but {reason}. {TE_INSTALL_HINT}")
    return importlib.import_module("transformer_engine.pytorch")


def _import_te_recipe() -> ModuleType:
    _import_te()
    return importlib.import_module("transformer_engine.common.recipe")
