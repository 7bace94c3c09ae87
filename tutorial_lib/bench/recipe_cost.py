"""What each FP8/FP4 recipe costs one Linear layer's training step: a roofline model.

A *model* from datasheet numbers (``hardware.SPECS``), never a measurement. For a Linear layer
with input x (M, K), weight w (N, K) and output gradient dy (M, N), where M = ``tokens``,
K = ``in_features``, N = ``out_features``, it adds two terms:

    gemm_s  forward y = x w^T, dgrad dx = dy w, wgrad dw = dy^T x, each 2·M·N·K FLOPs, timed
            ``max(FLOPs / peak, bytes / bandwidth)`` by ``Roof.time`` at the recipe's math peak
            (FP8 for the FP8 recipes, FP4 for nvfp4, BF16 for the ``"bf16"`` baseline). FLOPs
            and the BF16 outputs (2 bytes per element of y, dx, dw) come from
            ``bench.fp8_model``; the operand bytes are the quantized copies each GEMM reads
            (payload + scales): forward x_row + w_row, dgrad dy_row + w_col, wgrad dy_col + x_col.
    cast_s  the quantize kernels' HBM traffic over the HBM bandwidth (memory-bound, no FLOPs):
            for each of x, w, dy: ``2 · reads · numel`` (reads of the BF16 tensor) plus the
            bytes written (payload and scales of every copy).

    total_s = gemm_s + cast_s: **no overlap** of casts with GEMMs, no fusion of a cast into the
    op before it (TE fuses x's cast into ``LayerNormLinear``'s norm), no launch latency. The
    weight is quantized once per step (one micro-batch per step); dw is written in BF16 (TE
    may accumulate it into an FP32 main_grad instead); delayed scaling's amax-history update
    and every scale computation (a few scalars each) are not counted.

Copies (``quantized_tensors``). A row-wise copy is the tensor as stored, quantized along its
last dimension; a column-wise copy is the transpose, quantized along the other dimension, which
the backward GEMMs need (the GEMM's reduction dimension must carry the scales):

    recipe   reads (x, w, dy)   copy of an (r, c) matrix: payload + scales (bytes)
    delayed  1, 1, 1            r·c + 4 (one fp32 scale_inv per tensor, stored once)
    current  2, 2, 2            r·c + 4
    block    1, 1, 1            r·c + 4·⌈r/tr⌉·⌈c/128⌉; tr = 1 for x, dy (1x128), 128 for w
    mxfp8    1, 1, 1            r·c + ⌈c/32⌉·r (E8M0, 1 byte per 32 elements)
    nvfp4    3, 2, 3            ⌈c/2⌉·r + ⌈c/16⌉·r + 4 (E2M1 two per byte, E4M3 per 16,
                                fp32 amax per copy)
    rowwise  2, 2, 2            r·c + 4·r (one fp32 scale per row)

    reads: delayed folds the amax into its cast (TE's cast-transpose), current scaling reads
    the tensor for its amax first; block and mxfp8 find each tile's amax inside the one kernel
    that writes both copies; nvfp4 (TE ``NVFP4Quantizer::quantize_impl``) reads once for the
    amax (with RHT: the amax of x and of RHT(x^T) together), once for the row-wise cast, and
    once more for the RHT column-wise cast of x and dy (the fused RHT kernel needs rows % 64
    and cols % 128; TE's fallback first writes RHT(x^T) in BF16, not modelled); rowwise quantizes each copy from BF16
    in its own pass, amax fused (torch.compile; eager torchao reads twice per copy).
    Per-tensor FP8 (delayed, current) needs a separate transposed copy only where FP8 GEMMs
    take TN layouts alone (Hopper, TE ``is_non_tn_fp8_gemm_supported``); on sm_100 the
    row-wise copy serves all three GEMMs. The others always write both copies (nvfp4 weights:
    TE stores a 16x16 block's scale once per row, the 1x16 layout cuBLAS reads, so the scale
    bytes are those of 1x16 blocks). Scale padding (TE: multiples of 4 and 128) is left out.
    ``scale_bytes`` counts the scales the casts write (the GEMMs read them again).

Native: ``native.NATIVE[recipe].min_cc`` against the GPU's compute capability
(``COMPUTE_CAPABILITY``). Hopper (sm_90) has no MXFP8 or FP4 tensor cores, so mxfp8 and nvfp4
there get ``gemm_s``, ``cast_s`` and ``total_s`` of None: they have no native kernel to model,
and an emulation's cost is not a roofline number. Block scaling on Hopper is timed at the FP8
peak; real blockwise kernels lose some of it to promoting partial sums to CUDA cores every 128
elements (DeepSeek-V3, arXiv 2412.19437), by an amount this model does not know. NATIVE has
block scaling from sm_90 up (TE: cc >= 9.0 and CUDA >= 12.9), so B200 times it natively too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..checks import check_positive_int
from ..fp8.native import NATIVE
from ..fp8.quantizers.block import BLOCK_LEN, MXFP8_BLOCK
from ..fp8.quantizers.nvfp4 import NVFP4_BLOCK
from ..fp8.recipes import RECIPES
from ..hardware import SPECS, DeviceSpec
from ..perf.roofline import Op, roof_from_spec
from .fp8_model import training_gemms

__all__ = [
    "COMPUTE_CAPABILITY",
    "COST_RECIPES",
    "CopyBytes",
    "LayerMemory",
    "TensorBytes",
    "RecipeCost",
    "quantized_tensors",
    "recipe_layer_cost",
    "recipe_memory_bytes",
    "recipe_cost_table",
]

# CUDA compute capability of each SPECS entry (NVIDIA's CUDA GPUs list).
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "H100 SXM": (9, 0),
    "H100 PCIe": (9, 0),
    "H200": (9, 0),
    "A100": (8, 0),
    "B200": (10, 0),
}
COST_RECIPES = ("bf16", *RECIPES)  # the BF16 baseline, then every recipe
_MATH = {"bf16": "bf16", "nvfp4": "fp4"}  # math dtype of each recipe's GEMMs; "fp8" otherwise
_READS = {"delayed": 1, "current": 2, "block": 1, "mxfp8": 1, "rowwise": 2}  # nvfp4: see doc
_FP32 = 4  # bytes of a float32 scale


@dataclass(frozen=True)
class CopyBytes:
    """One quantized copy of a GEMM operand: low-precision payload and scale bytes."""

    payload: int
    scales: int

    @property
    def total(self) -> int:
        return self.payload + self.scales


@dataclass(frozen=True)
class TensorBytes:
    """One tensor's quantization: ``numel`` BF16 elements read ``reads`` times, written as a
    row-wise copy and a column-wise copy (None: the row-wise copy serves the backward GEMM)."""

    name: str  # "x", "w" or "dy"
    numel: int
    reads: int
    rowwise: CopyBytes
    columnwise: CopyBytes | None

    @property
    def backward(self) -> CopyBytes:
        """The copy the backward GEMM reads (dgrad for w, wgrad for x and dy)."""
        return self.columnwise if self.columnwise is not None else self.rowwise

    @property
    def cast_bytes(self) -> int:
        """``2 · reads · numel`` read, plus every copy's payload and scales written."""
        written = self.rowwise.total + (self.columnwise.total if self.columnwise else 0)
        return 2 * self.reads * self.numel + written

    @property
    def scale_bytes(self) -> int:
        return self.rowwise.scales + (self.columnwise.scales if self.columnwise else 0)


def _sizes(tokens: int, in_features: int, out_features: int) -> tuple[int, int, int]:
    """(M, K, N), each checked to be a positive integer."""
    return (
        check_positive_int(tokens, "tokens"),
        check_positive_int(in_features, "in_features"),
        check_positive_int(out_features, "out_features"),
    )


def _copy(recipe: str, role: str, rows: int, cols: int) -> CopyBytes:
    """Payload and scales of an (rows, cols) matrix quantized along ``cols`` (module doc)."""
    if recipe in ("delayed", "current"):
        return CopyBytes(rows * cols, _FP32)
    if recipe == "rowwise":
        return CopyBytes(rows * cols, _FP32 * rows)
    if recipe == "block":
        tile_rows = BLOCK_LEN if role == "weight" else 1
        return CopyBytes(
            rows * cols, _FP32 * math.ceil(rows / tile_rows) * math.ceil(cols / BLOCK_LEN)
        )
    if recipe == "mxfp8":
        return CopyBytes(rows * cols, rows * math.ceil(cols / MXFP8_BLOCK))
    if recipe == "nvfp4":
        blocks = rows * math.ceil(cols / NVFP4_BLOCK)
        return CopyBytes(rows * math.ceil(cols / 2), blocks + _FP32)
    raise ValueError(f"Unknown recipe {recipe!r}; choose one of {', '.join(map(repr, RECIPES))}.")


def quantized_tensors(
    recipe: str, tokens: int, in_features: int, out_features: int, transposed_copy: bool = True
) -> list[TensorBytes]:
    """x (M, K), w (N, K) and dy (M, N) as ``recipe`` quantizes them (byte rules: module doc).

    ``transposed_copy``: whether per-tensor FP8 (delayed, current) writes a separate transposed
    copy (True: Hopper's TN-only FP8 GEMMs); the other recipes always write two copies.
    """
    m, k, n = _sizes(tokens, in_features, out_features)
    result = []
    for name, role, rows, cols in (
        ("x", "input", m, k),
        ("w", "weight", n, k),
        ("dy", "grad_output", m, n),
    ):
        row = _copy(recipe, role, rows, cols)
        col: CopyBytes | None = _copy(recipe, role, cols, rows)
        if recipe in ("delayed", "current"):  # one scale_inv per tensor, shared by both copies
            col = CopyBytes(rows * cols, 0) if transposed_copy else None
        if recipe == "nvfp4":
            reads = 2 if role == "weight" else 3
        else:
            reads = _READS[recipe]
        result.append(TensorBytes(name, rows * cols, reads, row, col))
    return result


@dataclass(frozen=True)
class RecipeCost:
    """Modelled cost of one Linear layer's training step under one recipe on one GPU.

    native: the GPU runs the recipe's GEMMs natively (``native.NATIVE``). If not, or if the
    spec has no datasheet peak for ``math`` ("bf16", "fp8" or "fp4"), ``gemm_s``, ``cast_s``
    and ``total_s`` are None and ``note`` says why.
    cast_bytes, scale_bytes: HBM bytes of the quantize kernels, and of the scales among them.
    """

    device: str
    recipe: str
    native: bool
    math: str
    gemm_s: float | None
    cast_bytes: int
    cast_s: float | None
    scale_bytes: int
    total_s: float | None
    note: str = ""


def _non_tn(cc: tuple[int, int]) -> bool:
    """TE's ``is_non_tn_fp8_gemm_supported``: FP8 GEMMs in any layout (sm_100 to sm_11x, 13+)."""
    return (10, 0) <= cc < (12, 0) or cc >= (13, 0)


def _gemm_seconds(
    spec: DeviceSpec, math_dtype: str, tensors: list[TensorBytes], m: int, n: int, k: int
) -> float:
    """The three GEMMs on ``spec``'s roof: FLOPs and BF16 outputs from ``training_gemms``,
    plus the quantized operands each reads (forward x, w row-wise; dgrad dy row-wise, w
    backward copy; wgrad dy and x backward copies)."""
    roof = roof_from_spec(spec, math_dtype)
    if math_dtype == "bf16":
        return sum(roof.time(op) for op in training_gemms(m, n, k, operand_bytes=2))
    x, w, dy = tensors
    operands = {
        "forward": x.rowwise.total + w.rowwise.total,
        "dgrad": dy.rowwise.total + w.backward.total,
        "wgrad": dy.backward.total + x.backward.total,
    }
    ops = training_gemms(m, n, k, operand_bytes=0)  # bytes: the BF16 output only
    return sum(roof.time(Op(op.name, op.flops, op.bytes + operands[op.name])) for op in ops)


def recipe_layer_cost(
    spec: DeviceSpec,
    recipe: str,
    tokens: int,
    in_features: int,
    out_features: int,
    compute_capability: tuple[int, int] | None = None,
) -> RecipeCost:
    """Modelled cost of one training step of a Linear layer (M = ``tokens``, K =
    ``in_features``, N = ``out_features``) under ``recipe`` on ``spec`` (formulas and
    assumptions: module doc). ``recipe``: ``"bf16"`` (the baseline: BF16 GEMMs, no casts) or a
    name of ``recipes.RECIPES``. ``compute_capability``: the GPU's; None looks ``spec.name``
    up in ``COMPUTE_CAPABILITY``. Times are None where the recipe is not native, or where
    ``spec`` has no datasheet peak for its math (``note`` says which)."""
    if recipe not in COST_RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}; choose one of {', '.join(COST_RECIPES)}.")
    cc = compute_capability or COMPUTE_CAPABILITY.get(spec.name)
    if cc is None:
        raise ValueError(
            f"No compute capability known for {spec.name!r}: pass compute_capability= or add "
            f"it to COMPUTE_CAPABILITY (known: {', '.join(COMPUTE_CAPABILITY)})."
        )
    m, k, n = _sizes(tokens, in_features, out_features)
    math_dtype = _MATH.get(recipe, "fp8")
    tensors = [] if recipe == "bf16" else quantized_tensors(recipe, m, k, n, not _non_tn(cc))
    cast_bytes = sum(t.cast_bytes for t in tensors)
    scale_bytes = sum(t.scale_bytes for t in tensors)
    native = recipe == "bf16" or cc >= NATIVE[recipe].min_cc
    note = ""
    if not native:
        note = f"not native: needs {NATIVE[recipe].gpus}; {spec.name} is sm_{cc[0]}{cc[1]}"
    elif spec.peak(math_dtype) is None:
        note = f"no datasheet {math_dtype} peak for {spec.name}"
    if note:
        return RecipeCost(
            spec.name, recipe, native, math_dtype, None, cast_bytes, None, scale_bytes, None, note
        )
    gemm_s = _gemm_seconds(spec, math_dtype, tensors, m, n, k)
    cast_s = cast_bytes / spec.hbm_bandwidth
    total_s = gemm_s + cast_s
    return RecipeCost(
        spec.name, recipe, True, math_dtype, gemm_s, cast_bytes, cast_s, scale_bytes, total_s
    )


@dataclass(frozen=True)
class LayerMemory:
    """Bytes a Linear layer saves for backward beyond its weight (``recipe_memory_bytes``)."""

    recipe: str
    activation: int  # x as saved for the wgrad GEMM: BF16, or its column-wise copy + scales
    weight_copy: int  # the quantized weight copy the dgrad GEMM reads, + scales (0 for BF16)

    @property
    def total(self) -> int:
        return self.activation + self.weight_copy


def recipe_memory_bytes(
    recipe: str, tokens: int, in_features: int, out_features: int
) -> LayerMemory:
    """What the layer saves for its backward pass (TE, ``fp8.linear_function``), as a
    ``LayerMemory``: ``activation`` (x, M x K) + ``weight_copy`` (w, N x K) = ``total``.

    ``"bf16"`` saves x (2 bytes per element) and runs dgrad on the weight parameter itself.
    The FP8/FP4 recipes save x's column-wise copy x^T (K x M, the wgrad operand) *and* w's
    column-wise copy w^T (K x N, the dgrad operand), each payload + scales by the module doc's
    rules, so the weight copy is memory on top of the master weight. Bytes:

        recipe   activation                    weight_copy
        bf16     2·M·K                         0
        delayed  M·K + 4                       N·K + 4          (per-tensor fp32 scale_inv)
        current  M·K + 4                       N·K + 4
        block    M·K + 4·K·⌈M/128⌉             N·K + 4·⌈K/128⌉·⌈N/128⌉
        mxfp8    M·K + K·⌈M/32⌉                N·K + K·⌈N/32⌉
        nvfp4    K·⌈M/2⌉ + K·⌈M/16⌉ + 4        K·⌈N/2⌉ + K·⌈N/16⌉ + 4
        rowwise  M·K + 4·K                     N·K + 4·K

    Against BF16's 2·M·K, FP8 (about 1 byte per element) saves less only while N·K + scales <
    M·K, roughly out_features < tokens; NVFP4 (9/16 byte) while N < 23/9·M. For few tokens and
    a wide layer the weight copy dominates. Sizes are the same on every GPU (module doc).
    """
    m, k, n = _sizes(tokens, in_features, out_features)
    if recipe == "bf16":
        return LayerMemory(recipe, 2 * m * k, 0)
    x, w, _ = quantized_tensors(recipe, m, k, n)
    # delayed/current: the column-wise copy shares the row-wise copy's one scale_inv
    x_col, w_col = ((t.backward.payload + (t.backward.scales or t.rowwise.scales)) for t in (x, w))
    return LayerMemory(recipe, x_col, w_col)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def recipe_cost_table(tokens: int = 16384, width: int = 8192) -> list[dict[str, Any]]:
    """One row per device (H100 SXM, H200, B200) x recipe (``COST_RECIPES``) for a ``width`` x
    ``width`` Linear layer on ``tokens``.

    Keys: device, recipe, native, math, tokens, in_features, out_features, gemm_ms, cast_ms,
    total_ms (None where not native), speedup (BF16's total_s on the same device over the
    recipe's), cast_MB, scale_MB, activation_MB, weight_copy_MB and saved_MB (their sum):
    ``recipe_memory_bytes`` (MB = 1e6 bytes), note.
    """
    rows = []
    for spec in (SPECS["H100 SXM"], SPECS["H200"], SPECS["B200"]):
        base = recipe_layer_cost(spec, "bf16", tokens, width, width).total_s
        for recipe in COST_RECIPES:
            cost = recipe_layer_cost(spec, recipe, tokens, width, width)
            speedup = None if cost.total_s is None or base is None else base / cost.total_s
            memory = recipe_memory_bytes(recipe, tokens, width, width)
            rows.append(
                {
                    "device": spec.name,
                    "recipe": recipe,
                    "native": cost.native,
                    "math": cost.math,
                    "tokens": tokens,
                    "in_features": width,
                    "out_features": width,
                    "gemm_ms": _ms(cost.gemm_s),
                    "cast_ms": _ms(cost.cast_s),
                    "total_ms": _ms(cost.total_s),
                    "speedup": speedup,
                    "cast_MB": cost.cast_bytes / 1e6,
                    "scale_MB": cost.scale_bytes / 1e6,
                    "activation_MB": memory.activation / 1e6,
                    "weight_copy_MB": memory.weight_copy / 1e6,
                    "saved_MB": memory.total / 1e6,
                    "note": cost.note,
                }
            )
    return rows
