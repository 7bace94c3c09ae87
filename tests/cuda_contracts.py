"""The preconditions of torch's CUDA FP8 GEMMs on Hopper (sm_90), as predicates.

A CPU test cannot call these kernels, and their CPU and meta versions check less (the CPU
``_scaled_mm`` takes a float32 bias; the meta one skips layouts for CPU tensors). So the rules
are written out here, read from torch's CUDA sources: ``aten/src/ATen/native/cuda/
ScaledBlas.cpp`` (in 2.13 its recipe checks moved to ``aten/src/ATen/native/ScaledBlasUtils.cpp``),
``aten/src/ATen/cuda/CUDABlas.cpp``, ``cuBlasCommonArgs.h`` and ``torch/nn/functional.py``'s
``scaled_mm`` over ``torch._scaled_mm_v2``. The sources read were the nearest stored to the
2.11 and 2.13 releases; the error strings quoted in torch's words (the operand, ``e5m2``,
divisibility, cuBLASLt layout, bias, blockwise shape/stride and fast-accumulation messages) were
found verbatim in ``libtorch_cuda.so`` of both torch 2.11.0+cu130 (the lent H200's torch) and
2.13.0+cu130 (our pin), and no FP8 rule for sm_90 differed between them. A few messages are
ours, where torch words the rule differently or only implies it: the float32 scale dtype, the
contiguous 1-D bias (torch checks its element count), the shape of a per-tensor or row-wise
scale, and BF16/float32 as the blockwise outputs (the ones torch's own sm_90 tests use).

Each function returns the problems torch would raise, in torch's words (empty: it would run).
``tests/test_cuda_gemm_contract.py`` applies them to every call the GPU path makes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, *FP8)
TORCH_VERSIONS = ("2.11.0", "2.13.0")  # whose CUDA sources and binaries these rules were read from


def _row_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= t.shape[1]


def _col_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(0) == 1 and t.stride(1) >= t.shape[0]


def operand_problems(mat_a: torch.Tensor, mat_b: torch.Tensor) -> list[str]:
    """Shapes, dtypes and layouts: the checks both entry points make on sm_90."""
    problems = []
    if mat_a.dim() != 2 or mat_b.dim() != 2:
        return ["mat1 must be a matrix"]
    (m, k), (k2, n) = mat_a.shape, mat_b.shape
    if k != k2:
        problems.append(f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n})")
    for name, t in (("mat1", mat_a), ("mat2", mat_b)):
        if t.dtype not in FP8:
            problems.append(f"Expected {name} to be Float8 or Float4_x2 matrix got {t.dtype}")
    if mat_a.dtype == mat_b.dtype == torch.float8_e5m2:
        problems.append("Multiplication of two Float8_e5m2 matrices is not supported")
    if k % 16:
        problems.append(
            f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({m}x{k})"
        )
    if k2 % 16 or n % 16:
        problems.append(f"mat2 shape ({k2}x{n}) must be divisible by 16")
    # cuBLASLt on sm_90: "Only multiplication of row-major and column-major matrices is
    # supported by cuBLASLt" (transa == 't', transb == 'n' in CUDABlas.cpp's scaled_gemm)
    if not _row_major(mat_a) or not _col_major(mat_b):
        problems.append(
            "Only multiplication of row-major and column-major matrices is supported by cuBLASLt "
            f"(mat1 strides {tuple(mat_a.stride())}, mat2 strides {tuple(mat_b.stride())})"
        )
    return problems


def bias_problems(bias: torch.Tensor | None, n: int, out_dtype: torch.dtype) -> list[str]:
    """The bias checks, in torch's order (identical text in 2.11 and 2.13)."""
    if bias is None:
        return []
    problems = []
    if bias.numel() != n:
        problems.append(f"Bias must be size {n} but got {bias.numel()}")
    if bias.dim() != 1 or not bias.is_contiguous():
        problems.append(f"bias must be a contiguous 1-D tensor, got shape {tuple(bias.shape)}")
    if out_dtype == torch.float32:
        problems.append("Bias is not supported when out_dtype is set to Float32")
    if bias.dtype not in (torch.bfloat16, torch.float16):
        problems.append(f"Bias must be BFloat16 or Half, but got {bias.dtype}")
    elif out_dtype == torch.bfloat16 and bias.dtype != torch.bfloat16:
        problems.append(
            f"Bias must be BFloat16 to compute {out_dtype} output, but got {bias.dtype}"
        )
    elif out_dtype == torch.float16 and bias.dtype != torch.float16:
        problems.append(f"Bias must be Float16 to compute {out_dtype} output, but got {bias.dtype}")
    return problems


def scaled_mm_problems(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
) -> list[str]:
    """``torch._scaled_mm`` on sm_90 with per-tensor or row-wise scales (what ``fp8.gemm``
    calls). The scaling is inferred from the scales; nothing else is refused here."""
    problems = operand_problems(mat_a, mat_b)
    if problems[:1] == ["mat1 must be a matrix"]:
        return problems
    m, n = mat_a.shape[0], mat_b.shape[1]
    if out_dtype not in OUT_DTYPES:
        problems.append(f"out_dtype {out_dtype} is not a type torch._scaled_mm returns")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            problems.append(f"{name} must be float32 (got {s.dtype})")
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    rowwise = (
        scale_a.dim() == 2
        and tuple(scale_a.shape) == (m, 1)
        and scale_a.is_contiguous()
        and scale_b.dim() == 2
        and tuple(scale_b.shape) == (1, n)
        and scale_b.t().is_contiguous()
    )
    if not (tensorwise or rowwise):
        problems.append(
            "Invalid scaling configuration: per-tensor scales have one element each; row-wise "
            f"scales are a contiguous ({m}, 1) and a (1, {n}); got {tuple(scale_a.shape)} and "
            f"{tuple(scale_b.shape)}"
        )
    return problems + bias_problems(bias, n, out_dtype)


def _block_scale_problems(
    name: str, scale: torch.Tensor, recipe: str, rows: int, k: int
) -> list[str]:
    """The blockwise scale layouts of ``_scaled_mm_v2`` (torch 2.11 and 2.13)."""
    k_tiles = math.ceil(k / 128)
    problems = (
        [] if scale.dtype == torch.float32 else [f"{name} must be float32, got {scale.dtype}"]
    )
    if recipe == "BlockWise1x128":
        if tuple(scale.shape) != (rows, k_tiles):
            problems.append(
                f"{name} must have shape {rows} x {k_tiles} Float elements, got {tuple(scale.shape)}"
            )
        elif not (
            scale.stride(0) == 1
            and (scale.stride(1) == rows or (k_tiles == 1 and scale.stride(1) == 1))
        ):
            problems.append(f"{name} strides must be (1, {rows}); got: {tuple(scale.stride())}")
    elif recipe == "BlockWise128x128":
        padded = 4 * math.ceil(k_tiles / 4)
        row_tiles = math.ceil(rows / 128)
        if tuple(scale.shape) != (padded, row_tiles):
            problems.append(
                f"{name} must have shape {padded} x {row_tiles} Float elements, got {tuple(scale.shape)}"
            )
        elif scale.stride(0) != 1 or (row_tiles > 1 and scale.stride(1) != padded):
            problems.append(f"{name} must have strides (1, {padded}); got {tuple(scale.stride())}")
    else:
        problems.append(f"{name}: {recipe} is not a DeepSeek-style (1x128, 128x128) recipe")
    return problems


def blockwise_problems(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor,
    recipe_a: str,
    scale_b: torch.Tensor,
    recipe_b: str,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
) -> list[str]:
    """``torch.nn.functional.scaled_mm`` with 1x128 / 128x128 block scales on sm_90 (cuBLAS
    12.9+), what ``fp8.tiled_gemm`` calls."""
    problems = operand_problems(mat_a, mat_b)
    if problems[:1] == ["mat1 must be a matrix"]:
        return problems
    (m, k), n = mat_a.shape, mat_b.shape[1]
    if not (mat_a.dtype == mat_b.dtype == torch.float8_e4m3fn):
        problems.append(
            f"Invalid scaling configuration: DeepSeek-style block scaling takes Float8_e4m3fn "
            f"operands only, got {mat_a.dtype} x {mat_b.dtype}"
        )
    pairs: Sequence[tuple[str, str]] = (
        ("BlockWise1x128", "BlockWise128x128"),
        ("BlockWise128x128", "BlockWise1x128"),
        ("BlockWise1x128", "BlockWise1x128"),
    )
    if (recipe_a, recipe_b) not in pairs:
        problems.append(f"Invalid scaling configuration: {recipe_a} x {recipe_b}")
    problems += _block_scale_problems("scale_a", scale_a, recipe_a, m, k)
    problems += _block_scale_problems("scale_b", scale_b, recipe_b, n, k)
    if use_fast_accum:
        tile = "1x128" if "1x128" in recipe_b else "128x128"
        problems.append(f"scaled_gemm doesn't support fast accum with {tile} blockwise scaling")
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        problems.append(f"output_dtype {out_dtype}: torch's sm_90 tests use BF16 and float32 only")
    return problems + bias_problems(bias, n, out_dtype)
