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
TE's source; the guarded TE import), ``te_convert`` (``convert_to_te``, fused or
not), ``te_policy`` (``te_autocast`` and the ``te-fp8`` and ``te-fp8-fused`` policies) and
``te_state`` (TE's FP8 ``_extra_state`` as tensors and plain data, no pickle) and
``te_checkpoint`` (``convert_checkpoint``: a delayed-scaling run moved between ``fp8`` and
``te-fp8``). ``ddp`` keeps
the FP8 buffers out of ``DistributedDataParallel``'s buffer broadcast.
The precision policies ``fp8``, ``fp8-current``, ``fp8-block``, ``mxfp8``, ``nvfp4``,
``fp8-rowwise``, ``te-fp8`` and ``te-fp8-fused`` register in ``tutorial_lib.precision`` on first
use: ``precision.get_policy`` imports ``fp8.policy`` and ``fp8.te_policy`` when asked for one.
"""

from __future__ import annotations

from ..hardware import te_available
from .autocast import autocast, get_autocast_state, reduce_amax
from .convert import convert_to_fp8, fp8_layer_problems
from .ddp import exclude_fp8_from_ddp
from .formats import E4M3, E5M2, FP8_FORMATS, FP8Format, dequantize, get_fp8_format, quantize
from .gemm import emulated_gemm, scaled_gemm
from .linear import FP8_SHAPE_RULE, FP8Linear
from .native import NATIVE, check_recipe_device
from .policy import FP8_LOSS_TOLERANCE, make_fp8_policy
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
    FP8ModuleState,
    MMParams,
    ScalingMeta,
    update_amax_and_scale,
)
from .stats import QuantStats, ScaleTrace, capture_gemm_tensors, quant_stats, scale_for
from .te_checkpoint import convert_checkpoint

__all__ = [
    "te_available",
    # formats
    "FP8Format",
    "E4M3",
    "E5M2",
    "FP8_FORMATS",
    "get_fp8_format",
    "quantize",
    "dequantize",
    # scaling
    "Format",
    "DelayedScaling",
    "MMParams",
    "AmaxAlgo",
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
    "capture_gemm_tensors",
    # autocast
    "autocast",
    "get_autocast_state",
    # quantizers (per-recipe reference quantizers)
    "get_quantizer",
    "Quantizer",
    "QuantizedTensor",
    # recipes other than delayed scaling
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
    # recompute
    "checkpoint",
    # gemm
    "scaled_gemm",
    "emulated_gemm",
    # linear
    "FP8Linear",
    "FP8_SHAPE_RULE",
    "convert_to_fp8",
    "fp8_layer_problems",
    # ddp
    "exclude_fp8_from_ddp",
    # TE checkpoints
    "convert_checkpoint",
    # policy
    "FP8_LOSS_TOLERANCE",
    "make_fp8_policy",
]
