"""The Transformer Engine (TE) API the ``te-fp8`` backends rely on, and the guarded TE import.

Importing this module never imports TE. ``import_te`` imports it lazily and raises a
``RuntimeError`` naming the reason and the install route (``book/te_install.md``) when it is
missing, so the package, its tests and the book build run on machines without TE. Whether TE
imports at all is ``tutorial_lib.hardware.te_available``.

The tables here are those ``te_policy`` reads at run time: TE's recipe fields and scale flags,
its ``Format`` members, and what each recipe needs of the GPU. ``tests/test_te_contract.py``
checks them against TE's source, together with the tables of what ``te_convert`` and
``te_policy`` call, name and assume (``tests/te_contract_tables.py``: every keyword those
modules pass TE is declared there).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from ..hardware import te_available

__all__ = [
    "import_te",
    "TE_RECIPE_FIELDS",
    "TE_RECIPE_POWER_2_FLAGS",
    "TE_RECIPE_QPARAMS",
    "TE_ENUM_MEMBERS",
    "TE_GPU_NEEDS",
    "TEGPUNeed",
    "TE_INSTALL_HINT",
]

# TE's recipe classes (``transformer_engine.common.recipe``) -> the constructor fields that
# ``te_policy.te_recipe`` passes through when it builds a recipe by name: every dataclass field
# that all cached TE versions (2.9.0 and 2.20.2) have; tests/test_te_contract.py checks that it
# is exactly that set. TE 2.20 adds more (e.g. ``backward_override``,
# ``enable_2d_quantization``), not accepted here.
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
# A scale flag of a recipe -> True if ``power_2_scale`` equals the flag, False if its negation.
# TE's modules read ``recipe.fp8_quant_*.power_2_scale`` (TE_RECIPE_QPARAMS), class attributes
# set once at import from the flag's environment default, so the constructor flag alone does
# not reach te.Linear (TE 2.9 and 2.20); te_recipe sets those three on the instance.
TE_RECIPE_POWER_2_FLAGS: dict[str, tuple[str, bool]] = {
    "Float8CurrentScaling": ("use_power_2_scales", True),
    "Float8BlockScaling": ("use_f32_scales", False),
}
TE_RECIPE_QPARAMS = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")
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
