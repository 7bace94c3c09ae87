"""FP8 training, from the formats up: E4M3/E5M2, scaled quantization, and TE's delayed scaling.

Modules: ``formats`` (the formats, ``quantize``/``dequantize``), ``scaling`` (delayed
scaling's per-module state, the update rule, amax reduction), ``stats``
(quantization statistics and capture of a model's GEMM operands), ``gemm`` (``scaled_gemm``:
``torch._scaled_mm`` on FP8 GPUs, ``emulated_gemm``, an FP32 emulation, elsewhere),
``linear`` (``FP8Linear``), ``delayed_state`` (its delayed-scaling state and quantizers),
``convert`` (``convert_to_fp8``), ``recipes`` (every recipe, by TE's
names, and where each runs natively), ``quantizers`` (one
quantizer per recipe and operand), ``linear_function`` (``FP8Linear``'s one autograd Function
and the GEMM it picks), ``autocast`` (the FP8 region, named and behaving like
``transformer_engine.pytorch.autocast``), ``recompute`` (``checkpoint``: activation
checkpointing that replays the first forward's scales, TE's ``checkpoint``), ``policy`` (the
``fp8`` precision policy), and the
optional Transformer Engine backend: ``te_contract`` (the TE API it relies on, checked against
TE's source; the guarded TE import), ``te_convert`` (``TELayers``, ``convert_to_te``, fused or
not), ``te_policy`` (``te_autocast`` and the ``te-fp8`` and ``te-fp8-fused`` policies) and
``te_state`` (TE's FP8 ``_extra_state`` as tensors and plain data, no pickle) and
``te_checkpoint`` (``convert_checkpoint``: a delayed-scaling run moved between ``fp8`` and
``te-fp8``). ``ddp`` keeps
the FP8 buffers out of ``DistributedDataParallel``'s buffer broadcast.
Importing this package registers ``fp8``, ``fp8-current``, ``fp8-block``, ``mxfp8``, ``nvfp4``,
``fp8-rowwise``, ``te-fp8`` and ``te-fp8-fused`` in ``tutorial_lib.precision``.
"""

from __future__ import annotations

from ..hardware import te_available
from . import te_policy  # imports te_contract and te_convert too
from .autocast import (
    FP8AutocastState,
    autocast,
    get_autocast_state,
    is_fp8_enabled,
    reduce_amax,
)
from .convert import convert_to_fp8, convertible_linears, fp8_layer_problems
from .ddp import exclude_fp8_from_ddp, fp8_buffer_names
from .formats import (
    E4M3,
    E5M2,
    FP8_FORMATS,
    FP8Format,
    dequantize,
    finite_fp8_values,
    get_fp8_format,
    quantize,
)
from .gemm import emulated_gemm, scaled_gemm
from .linear import FP8_MIN_CC, FP8_SHAPE_RULE, FP8Linear
from .linear_function import quantized_matmul
from .native import NATIVE, check_recipe_device
from .policy import (
    FP8_LOSS_TOLERANCE,
    FP8_POLICY_NAME,
    check_fp8_device,
    make_fp8_policy,
    register_fp8_policies,
    register_fp8_policy,
)
from .quantizers import QuantizedTensor, Quantizer, get_quantizer
from .recipes import (
    RECIPE_PRECISIONS,
    RECIPES,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8RowwiseScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    make_recipe,
    recipe_name,
)
from .recompute import checkpoint
from .scaling import (
    FLT_MAX,
    GEMM1_INPUT,
    GEMM1_OUTPUT,
    GEMM1_WEIGHT,
    GRAD_INPUT1,
    GRAD_OUTPUT1,
    AmaxAlgo,
    Format,
    FP8BwdTensors,
    FP8FwdTensors,
    FP8ModuleState,
    MMParams,
    ScalingMeta,
    update_amax_and_scale,
)
from .stats import (
    QuantStats,
    ScaleTrace,
    capture_gemm_tensors,
    error_vs_scale,
    quant_stats,
    scale_for,
)
from .te_checkpoint import convert_checkpoint
from .te_state import from_te_extra_state, to_te_extra_state

__all__ = [
    "te_available",
    # formats
    "FP8Format",
    "E4M3",
    "E5M2",
    "FP8_FORMATS",
    "get_fp8_format",
    "finite_fp8_values",
    "quantize",
    "dequantize",
    # scaling
    "Format",
    "DelayedScaling",
    "MMParams",
    "AmaxAlgo",
    "FP8FwdTensors",
    "FP8BwdTensors",
    "GEMM1_INPUT",
    "GEMM1_WEIGHT",
    "GEMM1_OUTPUT",
    "GRAD_OUTPUT1",
    "GRAD_INPUT1",
    "FLT_MAX",
    "update_amax_and_scale",
    "ScalingMeta",
    "FP8ModuleState",
    "reduce_amax",
    # stats
    "QuantStats",
    "ScaleTrace",
    "quant_stats",
    "scale_for",
    "error_vs_scale",
    "capture_gemm_tensors",
    # autocast
    "FP8AutocastState",
    "autocast",
    "get_autocast_state",
    "is_fp8_enabled",
    # quantizers (per-recipe reference quantizers)
    "get_quantizer",
    "Quantizer",
    "QuantizedTensor",
    # recipes other than delayed scaling
    "Recipe",
    "Float8CurrentScaling",
    "Float8BlockScaling",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "Float8RowwiseScaling",
    "RECIPES",
    "RECIPE_PRECISIONS",
    "NATIVE",
    "make_recipe",
    "recipe_name",
    "check_recipe_device",
    "quantized_matmul",
    # recompute
    "checkpoint",
    # gemm
    "scaled_gemm",
    "emulated_gemm",
    # linear
    "FP8Linear",
    "FP8_MIN_CC",
    "FP8_SHAPE_RULE",
    "convert_to_fp8",
    "convertible_linears",
    "fp8_layer_problems",
    # ddp
    "exclude_fp8_from_ddp",
    "fp8_buffer_names",
    # TE extra state
    "to_te_extra_state",
    "convert_checkpoint",
    "from_te_extra_state",
    # policy
    "FP8_POLICY_NAME",
    "FP8_LOSS_TOLERANCE",
    "check_fp8_device",
    "make_fp8_policy",
    "register_fp8_policy",
    "register_fp8_policies",
]

# The precision policies of this package: ours (``fp8`` and one per other recipe) and Transformer
# Engine's (``te-fp8``, ``te-fp8-fused``; registered lazily by ``tutorial_lib.precision``).
register_fp8_policies()
te_policy.register_te_policy()
