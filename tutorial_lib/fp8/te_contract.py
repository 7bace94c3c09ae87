"""The Transformer Engine (TE) API the ``te-fp8`` backends rely on, and the guarded TE import.

Importing this module never imports TE. ``import_te`` imports it lazily and raises a
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
from dataclasses import dataclass
from types import ModuleType

from ..hardware import te_available

__all__ = [
    "import_te",
    "TE_API_USED",
    "TE_API_NAMED",
    "TE_RECIPE_FIELDS",
    "TE_RECIPE_POWER_2_FLAGS",
    "TE_RECIPE_QPARAMS",
    "TE_DEFAULTS_ASSUMED",
    "TE_PARAMETER_NAMES",
    "TE_ENUM_MEMBERS",
    "TE_GPU_NEEDS",
    "TEGPUNeed",
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
    "transformer_engine.pytorch.is_fp8_block_scaling_available": ("return_reason",),
    "transformer_engine.pytorch.is_mxfp8_available": ("return_reason",),
    "transformer_engine.pytorch.is_nvfp4_available": ("return_reason",),
    # dataclasses.replace(qparams, power_2_scale=...): see TE_RECIPE_POWER_2_FLAGS.
    "transformer_engine.common.recipe.QParams": ("power_2_scale",),
}
# TE's recipe classes (``transformer_engine.common.recipe``) -> the constructor fields that
# ``te_policy.te_recipe_by_name`` passes through: every dataclass field that all cached TE
# versions (2.9.0 and 2.20.2) have; tests/test_te_contract.py checks that it is exactly that set.
# TE 2.20 adds more (e.g. ``backward_override``, ``enable_2d_quantization``), not accepted here.
TE_RECIPE_FIELDS: dict[str, tuple[str, ...]] = {
    "DelayedScaling": (
        "margin",
        "fp8_format",
        "amax_history_len",
        "amax_compute_algo",
        "scaling_factor_compute_algo",
        "reduce_amax",
        "fp8_dpa",
        "fp8_mha",
    ),
    "Float8CurrentScaling": (
        "use_power_2_scales",
        "fp8_format",
        "fp8_gemm_fprop",
        "fp8_gemm_dgrad",
        "fp8_gemm_wgrad",
        "fp8_dpa",
        "fp8_mha",
    ),
    "Float8BlockScaling": (
        "use_f32_scales",
        "fp8_format",
        "x_block_scaling_dim",
        "w_block_scaling_dim",
        "grad_block_scaling_dim",
        "fp8_gemm_fprop",
        "fp8_gemm_dgrad",
        "fp8_gemm_wgrad",
        "fp8_dpa",
        "fp8_mha",
    ),
    "MXFP8BlockScaling": ("margin", "fp8_format", "fp8_dpa", "fp8_mha"),
    "NVFP4BlockScaling": (
        "disable_rht",
        "disable_stochastic_rounding",
        "disable_2d_quantization",
        "fp4_format",
        "fp8_format",
        "fp8_dpa",
        "fp8_mha",
    ),
}
TE_API_USED.update(
    {f"transformer_engine.common.recipe.{cls}": f for cls, f in TE_RECIPE_FIELDS.items()}
)
# A scale flag of a recipe -> True if ``power_2_scale`` equals the flag, False if its negation.
# TE's modules read ``recipe.fp8_quant_*.power_2_scale`` (TE_RECIPE_QPARAMS), class attributes
# set once at import from the flag's environment default, so the constructor flag alone does
# not reach te.Linear (TE 2.9 and 2.20); te_recipe_by_name sets those three on the instance.
TE_RECIPE_POWER_2_FLAGS: dict[str, tuple[str, bool]] = {
    "Float8CurrentScaling": ("use_power_2_scales", True),
    "Float8BlockScaling": ("use_f32_scales", False),
}
TE_RECIPE_QPARAMS = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")
# Names the docstrings and the book point readers to (existence only).
TE_API_NAMED: tuple[str, ...] = (
    "transformer_engine.pytorch.TransformerLayer",
    "transformer_engine.pytorch.DotProductAttention",
    "transformer_engine.pytorch.quantized_model_init",
    "transformer_engine.common.recipe.Format",
    "transformer_engine.common.recipe.Recipe",
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
    "transformer_engine.common.recipe.Format": ("E2M1", "E4M3", "E5M2", "HYBRID"),
}


@dataclass(frozen=True)
class TEGPUNeed:
    """What a TE recipe needs of the GPU, as TE's ``check_*_support`` in
    ``pytorch/quantization.py`` (TE 2.9 and 2.20) tests it; ``te_policy.check_te_fp8_device``
    checks this without TE, then calls ``te_check`` (which returns that ``check_*_support()``)."""

    min_cc: tuple[int, int]  # compute capability, at least
    below_cc: tuple[int, int] | None  # and below (TE has no MXFP8 on sm_120+ yet)
    min_cuda: tuple[int, int] | None  # torch.version.cuda, at least
    te_check: str  # transformer_engine.pytorch.<te_check>(return_reason=True)
    label: str  # "TE reports no <label> support"
    text: str  # the GPUs, in words


_FP8 = TEGPUNeed((8, 9), None, None, "is_fp8_available", "FP8", "sm_89+ (Ada or Hopper)")
# Our short recipe names (te_policy.TE_RECIPE_SHORT_NAMES) -> what TE checks.
TE_GPU_NEEDS: dict[str, TEGPUNeed] = {
    "delayed": _FP8,  # Ada also needs CUDA 12.1+ and cuBLASLt 12.1.3+ (TE checks those)
    "current": _FP8,
    "block": TEGPUNeed(
        (9, 0), None, (12, 9), "is_fp8_block_scaling_available", "FP8 block scaling",
        "sm_90+ (Hopper) with CUDA 12.9+",
    ),
    "mxfp8": TEGPUNeed(
        (10, 0), (12, 0), None, "is_mxfp8_available", "MXFP8",
        "sm_100 to sm_11x (Blackwell; TE has no MXFP8 on sm_120+ yet)",
    ),
    "nvfp4": TEGPUNeed((10, 0), None, None, "is_nvfp4_available", "NVFP4", "sm_100+ (Blackwell)"),
}  # fmt: skip


# Rows of a TE module's scaling state (tex.FP8FwdTensors / FP8BwdTensors for one GEMM).
TE_FWD_INDEX: dict[str, int] = {"input": 0, "weight": 1, "output": 2}
TE_BWD_INDEX: dict[str, int] = {"grad_output": 0, "grad_input": 1}

TE_INSTALL_HINT = (
    "Install Transformer Engine on a CUDA machine (book/te_install.md): use NVIDIA's PyTorch "
    "container (nvcr.io/nvidia/pytorch), which ships it, or run "
    '`pip install --no-build-isolation "transformer-engine[pytorch]"` against a CUDA build of '
    "torch, with the CUDA toolkit and cuDNN installed."
)


def import_te() -> ModuleType:
    """``transformer_engine.pytorch``, or a ``RuntimeError`` saying why not and what to do."""
    ok, reason = te_available()
    if not ok:
        raise RuntimeError(f"Transformer Engine is needed here, but {reason}. {TE_INSTALL_HINT}")
    return importlib.import_module("transformer_engine.pytorch")


def _import_te_recipe() -> ModuleType:
    import_te()
    return importlib.import_module("transformer_engine.common.recipe")
