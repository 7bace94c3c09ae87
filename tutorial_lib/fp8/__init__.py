"""FP8 training, from the formats up: E4M3/E5M2, scaled quantization, and TE's delayed scaling.

Modules: ``formats`` (the formats, ``quantize``/``dequantize``), ``scaling`` (delayed
scaling's per-module state, the update rule, amax reduction), ``stats``
(quantization statistics and capture of a model's GEMM operands), ``gemm`` (``scaled_gemm``:
``torch._scaled_mm`` on FP8 GPUs, ``emulated_gemm``, an FP32 emulation, elsewhere), ``mma``
(``mma_accumulate``: the sums of Hopper's FP8 tensor cores, emulated bit for bit),
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

from .autocast import autocast
from .convert import convert_to_fp8
from .ddp import exclude_fp8_from_ddp
from .formats import E4M3, E5M2, dequantize, quantize
from .gemm import scaled_gemm
from .linear import FP8_SHAPE_RULE
from .mma import mma_accumulate
from .native import NATIVE
from .quantizers import get_quantizer
from .recipes import RECIPE_PRECISIONS, RECIPES, DelayedScaling
from .recompute import checkpoint
from .scaling import update_amax_and_scale
from .stats import QuantStats, ScaleTrace, capture_gemm_tensors, quant_stats, scale_for
from .te_checkpoint import convert_checkpoint

__all__ = [
    # formats
    "E4M3",
    "E5M2",
    "quantize",
    "dequantize",
    # scaling
    "DelayedScaling",
    "update_amax_and_scale",
    # stats
    "QuantStats",
    "ScaleTrace",
    "quant_stats",
    "scale_for",
    "capture_gemm_tensors",
    # autocast
    "autocast",
    # quantizers (per-recipe reference quantizers)
    "get_quantizer",
    # recipes
    "RECIPES",
    "RECIPE_PRECISIONS",
    "NATIVE",
    # recompute
    "checkpoint",
    # gemm
    "scaled_gemm",
    "mma_accumulate",
    # linear
    "FP8_SHAPE_RULE",
    "convert_to_fp8",
    # ddp
    "exclude_fp8_from_ddp",
    # TE checkpoints
    "convert_checkpoint",
]
