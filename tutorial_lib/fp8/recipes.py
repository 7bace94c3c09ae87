"""The FP8 (and FP4) training recipes, named as Transformer Engine names them.

    recipe                 ours       per operand                                   state
    DelayedScaling         "delayed"  one scale per tensor, from earlier steps      amax history
    Float8CurrentScaling   "current"  one scale per tensor, from this tensor        none
    Float8BlockScaling     "block"    1x128 tiles (128x128 for weights)             none
    MXFP8BlockScaling      "mxfp8"    1x32 blocks, E8M0 scales                      none
    NVFP4BlockScaling      "nvfp4"    E2M1, 1x16 blocks (16x16 weights), E4M3 +     SR generator
                                      FP32 scales, Hadamard transform on wgrad
    Float8RowwiseScaling   "rowwise"  one scale per row (torchao's ``rowwise``)     none

``DelayedScaling`` is the one with state (an amax history per layer; its update rule is
``scaling``'s). Each is a frozen dataclass with TE's field names and defaults where TE has them (TE nests the
per-tensor options in ``QParams``; here they are flat fields, the same for the three tensors).
``quantizer(role, columnwise)`` gives the ``fp8.quantizers`` quantizer for one GEMM operand:
the row-wise copy feeds the forward GEMM (and grad_output's dgrad), the column-wise copy (the
transposed matrix, quantized along the other dimension, as TE does) feeds the backward GEMMs.
``FP8Linear`` trains with any of them inside ``fp8.autocast(recipe=...)`` (``linear_function``).

Where each runs natively is ``native``'s (``NATIVE``, ``check_recipe_device``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..checks import check_int, check_positive_int
from .gemm import check_accumulation
from .quantizers import Quantizer, get_quantizer
from .scaling import AmaxAlgo, Format, MMParams, check_amax_algo

__all__ = [
    "Recipe",
    "DelayedScaling",
    "Float8CurrentScaling",
    "Float8BlockScaling",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "Float8RowwiseScaling",
    "RECIPES",
    "RECIPE_PRECISIONS",
    "recipe_name",
    "make_recipe",
]

_SPLIT = MMParams(use_split_accumulator=True)
_FAST = MMParams(use_split_accumulator=False)


@dataclass(frozen=True)
class Recipe:
    """What every recipe here has: TE's three GEMM accumulation settings (fast or split), a
    quantizer per operand, and ours, keyword-only, ``accumulation``: how the emulation sums the
    GEMMs on a CPU, "exact" (float32) or "hopper" (as an H100's FP8 tensor cores do, ``fp8.mma``;
    MXFP8 and NVFP4, which Hopper has no units for, keep float32 sums and warn). A GPU's GEMMs
    accumulate as its hardware does, whatever it says (``fp8.gemm``). ``name`` is our short
    name, ``te_name`` TE's class name ("" if not TE's)."""

    name: ClassVar[str] = ""
    te_name: ClassVar[str] = ""
    stateful: ClassVar[bool] = False  # scaling state kept by each layer (delayed scaling only)
    fp8_gemm_fprop: MMParams = _SPLIT
    fp8_gemm_dgrad: MMParams = _SPLIT
    fp8_gemm_wgrad: MMParams = _SPLIT
    accumulation: str = dataclasses.field(default="exact", kw_only=True)

    def __post_init__(self) -> None:
        for gemm in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            if not isinstance(getattr(self, gemm), MMParams):
                raise TypeError(f"{gemm} must be an MMParams, got {getattr(self, gemm)!r}.")
        check_accumulation(self.accumulation, type(self).__name__)

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        """Keyword options of ``get_quantizer(self.name, role, ...)`` for one copy."""
        return {}

    def quantizer(
        self, role: str, columnwise: bool = False, generator: torch.Generator | None = None
    ) -> Quantizer:
        """The quantizer for ``role``'s row-wise (forward) or column-wise (backward) copy."""
        options = self.quantizer_options(role, columnwise)
        if generator is not None and options.get("stochastic_rounding"):
            options["generator"] = generator
        return get_quantizer(self.name, role, **options)

    @property
    def uses_stochastic_rounding(self) -> bool:
        return False

    def shape_problem(self, tokens: int, in_features: int, out_features: int) -> str | None:
        """Why this recipe's emulation cannot run a GEMM of these sizes (None: it can). Tiles
        are padded, so only a transform with a fixed size constrains them (NVFP4's RHT)."""
        return None


@dataclass(frozen=True, kw_only=True)
class DelayedScaling(Recipe):
    """The delayed-scaling recipe: scales from the amax history of earlier steps. The one
    recipe with state (``stateful``): each ``FP8Linear`` keeps an amax history and scales for
    its operands (``delayed_state``), and ``fp8.autocast`` updates them after every step.
    Fields are keyword-only.

    Format:
        fp8_format: Format.HYBRID (default) or Format.E4M3. Format.E5M2 is rejected: pure E5M2
            training is not supported, as in TE.
        margin: the scale maps the amax to ``fp8_max * 2**-margin``; each unit of margin
            leaves one more binade of headroom. Integer >= 0.
    History:
        amax_history_len: rows L of the history (steps remembered), >= 1.
        amax_compute_algo: "max" (largest amax in the window), "most_recent" (this step's),
            or a callable taking the ``(L, n)`` float32 history (row 0 = this step) and
            returning the ``(n,)`` amaxes.
    Distributed:
        reduce_amax: MAX all-reduce this step's amaxes over the autocast's group before the
            update, so that every rank gets the same scales.
    Attention (accepted for TE compatibility; unused here):
        fp8_dpa: FP8 dot-product attention. fp8_mha: FP8 multi-head attention.
    GEMM accumulation (an ``MMParams`` per GEMM of ``FP8Linear``):
        fp8_gemm_fprop: the forward GEMM, default ``MMParams(use_split_accumulator=False)``
            (fast accumulation). fp8_gemm_dgrad, fp8_gemm_wgrad: the input- and weight-gradient
            GEMMs, default ``MMParams(use_split_accumulator=True)`` (sums promoted to float32).
        These are what TE runs under delayed scaling: its ``DelayedScaling`` has no such fields
        and its modules use ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``
        (``pytorch/module/base.py``); the field names and ``MMParams`` are those of TE's
        ``Float8CurrentScaling``, whose defaults are the same. On a GPU they reach
        ``torch._scaled_mm(use_fast_accum=...)``; the CPU emulation follows them with
        ``accumulation="hopper"`` (with "exact", its float32 sums make them change nothing).
    TE also takes ``scaling_factor_compute_algo`` (a custom amax -> scale function); this
    package always uses the built-in rule (``update_amax_and_scale``).
    """

    name: ClassVar[str] = "delayed"
    te_name: ClassVar[str] = "DelayedScaling"
    stateful: ClassVar[bool] = True
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: AmaxAlgo = "max"
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    fp8_gemm_fprop: MMParams = _FAST

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_format(self)
        check_int(self.margin, "DelayedScaling.margin", 0)
        check_positive_int(self.amax_history_len, "DelayedScaling.amax_history_len")
        check_amax_algo(self.amax_compute_algo)


@dataclass(frozen=True)
class Float8CurrentScaling(Recipe):
    """TE's ``Float8CurrentScaling``: each tensor scaled by its own amax, every time.

    fp8_format: ``Format.HYBRID`` (TE's default: E4M3 forward, E5M2 gradients) or E4M3.
    power_2_scale, amax_epsilon: TE's ``QParams`` (defaults False and 0.0).
    Accumulation: TE's defaults, fast in the forward GEMM, split in dgrad and wgrad.
    No scaling state: nothing to update or synchronize (an ``FP8Linear`` keeps its delayed-
    scaling buffers all the same, unused, so state dicts keep one layout for every recipe).
    """

    name: ClassVar[str] = "current"
    te_name: ClassVar[str] = "Float8CurrentScaling"
    fp8_format: Format = Format.HYBRID
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    fp8_gemm_fprop: MMParams = _FAST

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_format(self)
        _check_epsilon(self.amax_epsilon)

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        return {
            "fp8_format": self.fp8_format,
            "power_2_scale": self.power_2_scale,
            "amax_epsilon": self.amax_epsilon,
        }


@dataclass(frozen=True)
class Float8BlockScaling(Recipe):
    """TE's ``Float8BlockScaling`` (DeepSeek-V3's scheme): float32 scales per tile.

    fp8_format: ``Format.E4M3`` (TE's default: E4M3 in both passes) or HYBRID.
    power_2_scale (True), amax_epsilon (0.0): TE's ``QParams`` defaults for this recipe.
    x_block_scaling_dim, w_block_scaling_dim, grad_block_scaling_dim: 1 (1x128 tiles) or 2
        (128x128); TE's defaults 1, 2, 1.
    Accumulation: split in all three GEMMs (TE's defaults for this recipe).
    """

    name: ClassVar[str] = "block"
    te_name: ClassVar[str] = "Float8BlockScaling"
    fp8_format: Format = Format.E4M3
    power_2_scale: bool = True
    amax_epsilon: float = 0.0
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1

    def __post_init__(self) -> None:
        """TE's checks (``Float8BlockScaling.__post_init__``), as ValueErrors."""
        super().__post_init__()
        _check_format(self)
        _check_epsilon(self.amax_epsilon)
        dims = {
            "x_block_scaling_dim": self.x_block_scaling_dim,
            "w_block_scaling_dim": self.w_block_scaling_dim,
            "grad_block_scaling_dim": self.grad_block_scaling_dim,
        }
        bad = [f"{k}={v!r}" for k, v in dims.items() if v not in (1, 2)]
        if bad:
            raise ValueError(f"Float8BlockScaling: {', '.join(bad)}; use 1 (1x128) or 2 (128x128).")
        two_d = [k for k, v in dims.items() if v == 2]
        if len(two_d) > 1:
            raise ValueError(
                f"Float8BlockScaling: {' and '.join(two_d)} are both 2 (128x128), so one GEMM "
                "would multiply two 2-D-blocked operands, which TE does not support."
            )
        gemms = ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad")
        fast = [g for g in gemms if not getattr(self, g).use_split_accumulator]
        if fast:
            raise ValueError(
                f"Float8BlockScaling needs split accumulation in every GEMM (TE); {fast} ask "
                "for fast accumulation."
            )

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        dims = {
            "input": self.x_block_scaling_dim,
            "weight": self.w_block_scaling_dim,
            "grad_output": self.grad_block_scaling_dim,
        }
        return {
            "fp8_format": self.fp8_format,
            "power_2_scale": self.power_2_scale,
            "amax_epsilon": self.amax_epsilon,
            "block_scaling_dim": dims[role],
        }


@dataclass(frozen=True)
class MXFP8BlockScaling(Recipe):
    """TE's ``MXFP8BlockScaling`` (OCP MX): 32 elements along a row share an E8M0 scale.

    fp8_format: ``Format.E4M3`` (TE's default) or HYBRID. TE's ``margin`` is not offered
    (its MXFP8 kernels ignore it). The column-wise copy is quantized from the high-precision
    tensor along the other dimension, not transposed (a 1x32 block is not a 32x1 block).
    """

    name: ClassVar[str] = "mxfp8"
    te_name: ClassVar[str] = "MXFP8BlockScaling"
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_format(self)

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        return {"fp8_format": self.fp8_format}


@dataclass(frozen=True)
class NVFP4BlockScaling(Recipe):
    """TE's ``NVFP4BlockScaling``: E2M1 elements, E4M3 scales per 16 elements and a float32
    scale per tensor (``quantizers.nvfp4``).

    As TE's defaults (each switch off with its ``disable_*`` field):
        2-D quantization: 16x16 blocks for weights (so the weight's transpose reuses them);
        random Hadamard transform: on the column-wise copies of inputs and gradients, the
            operands of the wgrad GEMM (both sides, so the transforms cancel in the product);
        stochastic rounding: of gradients (row-wise and column-wise copies), drawn from each
            layer's own seeded generator, which checkpoints keep (``FP8Linear``).
    """

    name: ClassVar[str] = "nvfp4"
    te_name: ClassVar[str] = "NVFP4BlockScaling"
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        return {
            "block_2d": role == "weight" and not self.disable_2d_quantization,
            "rht": columnwise and role != "weight" and not self.disable_rht,
            "stochastic_rounding": role == "grad_output" and not self.disable_stochastic_rounding,
        }

    @property
    def uses_stochastic_rounding(self) -> bool:
        return not self.disable_stochastic_rounding

    def shape_problem(self, tokens: int, in_features: int, out_features: int) -> str | None:
        if self.disable_rht or tokens % 16 == 0:
            return None
        return (
            f"NVFP4's random Hadamard transform mixes 16 tokens at a time in the wgrad GEMM, so "
            f"the token count (batch x sequence) must be a multiple of 16, not {tokens}; "
            "choose such a batch, or NVFP4BlockScaling(disable_rht=True)"
        )


@dataclass(frozen=True)
class Float8RowwiseScaling(Recipe):
    """torchao's ``rowwise`` float8 training recipe (not a TE recipe): one scale per row of
    every GEMM operand, along the dimension the GEMM does not reduce (``torch._scaled_mm``'s
    row-wise mode), E4M3 everywhere, scales rounded down to powers of two (``power_2_scale``,
    torchao's ``round_scales_to_power_of_2``)."""

    name: ClassVar[str] = "rowwise"
    te_name: ClassVar[str] = ""
    power_2_scale: bool = True
    fp8_gemm_fprop: MMParams = _FAST

    def quantizer_options(self, role: str, columnwise: bool) -> dict[str, Any]:
        return {"power_2_scale": self.power_2_scale}


def _check_format(recipe: Any) -> None:
    """``fp8_format`` a ``Format`` (TypeError) other than E5M2 (TE refuses pure E5M2 training)."""
    name, fmt = type(recipe).__name__, recipe.fp8_format
    if not isinstance(fmt, Format):
        raise TypeError(f"{name}.fp8_format must be a Format, got {fmt!r}.")
    if fmt is Format.E5M2:
        raise ValueError(
            f"{name}: pure E5M2 training is not supported (as in Transformer Engine). Use "
            "fp8_format=Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3."
        )


def _check_epsilon(epsilon: float) -> None:
    if not epsilon >= 0.0:
        raise ValueError(f"amax_epsilon must be >= 0, got {epsilon!r}.")


RECIPES: dict[str, type[Recipe]] = {
    "delayed": DelayedScaling,
    "current": Float8CurrentScaling,
    "block": Float8BlockScaling,
    "mxfp8": MXFP8BlockScaling,
    "nvfp4": NVFP4BlockScaling,
    "rowwise": Float8RowwiseScaling,
}
# The precision policy that trains with each recipe (``fp8.policy``; ``--precision``).
RECIPE_PRECISIONS: dict[str, str] = {
    "delayed": "fp8",
    "current": "fp8-current",
    "block": "fp8-block",
    "mxfp8": "mxfp8",
    "nvfp4": "nvfp4",
    "rowwise": "fp8-rowwise",
}
_TE_NAMES = {cls.te_name: name for name, cls in RECIPES.items() if cls.te_name}


def recipe_name(recipe: object) -> str:
    """Our short name of a recipe object, a short name, or TE's class name."""
    if isinstance(recipe, str):
        name = _TE_NAMES.get(recipe, recipe)
        if name not in RECIPES:
            raise ValueError(
                f"Unknown FP8 recipe {recipe!r}. Choose one of {', '.join(map(repr, RECIPES))} "
                f"(or TE's names {', '.join(map(repr, _TE_NAMES))})."
            )
        return name
    for name, cls in RECIPES.items():
        if type(recipe) is cls:
            return name
    raise TypeError(
        f"{type(recipe).__name__} is not an FP8 recipe of this package; use one of "
        f"{', '.join(cls.__name__ for cls in RECIPES.values())}."
    )


def make_recipe(recipe: object = "delayed", **options: Any) -> Any:
    """A recipe object from a name (ours or TE's) and its fields; a recipe object is returned
    as it is (no options allowed then)."""
    if not isinstance(recipe, str):
        recipe_name(recipe)  # type check
        if options:
            raise TypeError("make_recipe: pass options only with a recipe name.")
        return recipe
    cls = RECIPES[recipe_name(recipe)]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"{cls.__name__} has no field {', '.join(map(repr, unknown))}; its fields are "
            f"{', '.join(allowed)}."
        )
    return cls(**options)
