"""``FP8LinearFunction``: ``FP8Linear``'s one autograd Function, for every recipe.

One forward + backward pass, as TE's ``Linear`` runs it:
    forward   x_q = Q_input(x), w_q = Q_weight(w)   (row-wise copies: scales along K)
              y = x_q @ w_q^T (+ bias), in the activation dtype
    backward  g_q = Q_grad(dy)                      (row-wise)
              dgrad = g_q @ Q_weight^col(w)         (w's copy quantized along its other dimension)
              wgrad = Q_grad^col(dy)^T-GEMM Q_input^col(x), in float32
A column-wise copy is the transposed matrix quantized along its rows, so every GEMM here is
``a @ b^T`` with both operands scaled along the reduced dimension (``quantized_matmul``). The
forward saves the column-wise copies of x and w (what TE saves), not x and w.

Where the quantizers come from (``Operands``): delayed scaling's are stateful (the layer's
scales, its amax history; ``delayed_state.DelayedOperands``), and a column-wise copy is then
the row-wise one transposed; every other recipe's are stateless (``RecipeOperands``: each copy
quantized from the tensor at hand).

The GEMM is chosen in one place, ``quantized_matmul``:
    per-tensor (delayed, current) and row-wise: ``fp8.gemm.scaled_gemm``: ``torch._scaled_mm``
        on FP8 GPUs (row-wise: an ``(M, 1)`` and a ``(1, N)`` scale), else exact FP8 products
        summed (``fp8.gemm.emulated_sums``) and then scaled, as the GPU does.
    block on a GPU: ``fp8.tiled_gemm.block_scaled_mm_call``, torch's blockwise kernel (Hopper),
        which applies the tile scales inside the GEMM; a GEMM it cannot take (off the 16-grid)
        runs the emulation, with a warning once.
    block, emulated: ``fp8.gemm.emulated_sums`` with each row's 128-wide K tiles' scales (the
        arithmetic below; under Hopper's accumulation each tile's sum scaled, ``fp8.mma``).
    tiled, emulated (block as above, MXFP8, NVFP4 everywhere). Each element times its tile's
        scale is exact in float32 (power-of-two scales: block's default and MXFP8's E8M0;
        NVFP4's E2M1 value times an E4M3 scale has at most 6 significant bits), the products are
        summed in float32, and NVFP4's two per-tensor scales multiply the sum, as the tensor
        cores apply block scales inside the GEMM and the global scale to its result. With
        ``power_2_scale=False`` block scales are not powers of two and the scaled elements round.
        Hadamard-transformed operands (NVFP4's wgrad) are multiplied as they are: H is
        orthogonal, so the transforms of both sides cancel in the product.
Whether a recipe may run natively on a device at all is ``native.check_recipe_device``'s call.
Accumulation follows the recipe: fast or split per GEMM (``fp8_gemm_fprop``/``_dgrad``/
``_wgrad``), and how the emulation sums (``accumulation``): float32, or on a CPU as Hopper's
tensor cores do (``fp8.mma``; per-tensor, row-wise and block). MXFP8 and NVFP4 have no Hopper
tensor-core GEMM to model: under "hopper" their sums stay float32, with a warning once. The bias
is added in the activation dtype, as TE does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from . import gemm
from .delayed_state import DelayedOperands
from .gemm import emulated_sums, scaled_gemm, warn_emulated_once
from .quantizers import QuantizedTensor
from .quantizers.base import as_matrix, tile_grid
from .recipes import Recipe
from .tiled_gemm import block_scaled_mm_call, native_block_problem

__all__ = [
    "FP8LinearFunction",
    "Operands",
    "RecipeOperands",
    "quantized_matmul",
]

_PER_ROW = ("current", "delayed", "rowwise")


def quantized_matmul(
    a: QuantizedTensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype,
    emulate: bool,
    use_fast_accum: bool = False,
    bias: torch.Tensor | None = None,
    accumulation: str = "exact",
) -> torch.Tensor:
    """``a @ b^T (+ bias)`` for operands quantized along their last (reduced) dimension (module
    docstring for the arithmetic); ``(M, K) x (N, K) -> (M, N)`` in ``out_dtype``, the bias added
    in float32 before the one rounding to ``out_dtype``, as the delayed-scaling path does.
    ``accumulation``: how an emulated GEMM sums (``fp8.gemm.emulated_sums``)."""
    if a.rht != b.rht:
        raise ValueError("quantized_matmul: both operands or neither must be RHT-encoded.")
    if a.recipe in _PER_ROW and b.recipe in _PER_ROW:
        a_inv = a.scale_inv if a.scale_inv.numel() == 1 else a.scale_inv.reshape(-1, 1)
        b_inv = b.scale_inv if b.scale_inv.numel() == 1 else b.scale_inv.reshape(1, -1)
        a_data, b_data = as_matrix(a.data), as_matrix(b.data)
        return scaled_gemm(
            a_data, a_inv, b_data.t(), b_inv, bias, out_dtype, emulate, use_fast_accum,
            accumulation,
        )  # fmt: skip
    if a.recipe == "block" and not emulate and gemm._is_cuda(a.data):
        problem = native_block_problem(a, b)
        if problem is None:
            return block_scaled_mm_call(a, b, out_dtype, use_fast_accum, bias).run()
        shapes = (tuple(a.shape), tuple(b.shape), a.fmt, b.fmt)
        warn_emulated_once(
            shapes,
            f"block-scaled FP8 GEMM {shapes[0]} x {shapes[1]}^T on a GPU runs through the FP32 "
            f"emulation, without FP8 speed: {problem}.",
        )
    with torch.autocast(a.data.device.type, enabled=False):
        if a.recipe == "block":
            a_data, b_data = as_matrix(a.data), as_matrix(b.data)
            scales = _k_tile_scales(a), _k_tile_scales(b)
            out = emulated_sums(a_data, b_data, use_fast_accum, accumulation, scales)
            return (out if bias is None else out + bias.float()).to(out_dtype)
        if accumulation == "hopper":
            warn_emulated_once(
                ("hopper", a.recipe),
                f"{a.recipe}: Hopper has no tensor cores for this recipe (sm_100 GPUs run it), "
                "so there is no Hopper accumulation to model: its GEMMs keep float32 sums.",
            )
        # element values times their tile scales; NVFP4's per-tensor scales go on the sum, and
        # Hadamard transforms stay (``QuantizedTensor.dequantize`` would undo both)
        a_values, b_values = (as_matrix(q.values()) * q.tile_scales() for q in (a, b))
        out = a_values @ b_values.t()
        if a.tensor_scale_inv is not None and b.tensor_scale_inv is not None:
            out = out * (a.tensor_scale_inv * b.tensor_scale_inv)
        return (out if bias is None else out + bias.float()).to(out_dtype)


def _k_tile_scales(q: QuantizedTensor) -> torch.Tensor:
    """A block-scaled operand's float32 scales as (rows, K tiles): each row's 128-wide tiles."""
    rows, cols = as_matrix(q.data).shape
    grid = q.scale_inv.to(torch.float32).reshape(tile_grid(rows, cols, q.tile))
    return grid.repeat_interleave(q.tile[0], dim=0)[:rows]


@dataclass(eq=False)
class RecipeOperands:
    """A stateless recipe's quantizers: each copy quantized from the tensor at hand.
    ``generator``: the layer's stochastic-rounding generator (NVFP4)."""

    recipe: Recipe
    generator: torch.Generator | None = None

    def rowwise(self, role: str, x: torch.Tensor) -> QuantizedTensor:
        return self.recipe.quantizer(role, False, self.generator).quantize(x)

    def columnwise(
        self, role: str, x: torch.Tensor, rowwise: QuantizedTensor | None
    ) -> QuantizedTensor:
        return self.recipe.quantizer(role, True, self.generator).quantize(x.t())

    def backward_done(self) -> None:
        pass


# The quantizers of one ``FP8Linear`` call, one per operand role ("input", "weight",
# "grad_output"): ``rowwise`` for the forward GEMM and dgrad, ``columnwise`` (given the row-wise
# copy if one was made) for the backward GEMMs; ``backward_done`` when the backward pass of the
# call is over.
Operands = DelayedOperands | RecipeOperands


class FP8LinearFunction(torch.autograd.Function):
    """``y = x w^T + b`` with the GEMMs of any recipe (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        operands: Operands,
        out_dtype: torch.dtype,
        emulate: bool,
        backward: bool,
    ) -> torch.Tensor:
        recipe = operands.recipe
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, x.shape[-1])
            x_q = operands.rowwise("input", x2)
            w_q = operands.rowwise("weight", weight)
            b = None if bias is None else bias.to(out_dtype)
            fast, acc = recipe.fp8_gemm_fprop.use_fast_accum, recipe.accumulation
            out = quantized_matmul(x_q, w_q, out_dtype, emulate, fast, b, acc)
            # the column-wise copies only where a backward GEMM will use them (not under no_grad)
            need_x, need_w = (backward and n for n in ctx.needs_input_grad[:2])
            x_col = operands.columnwise("input", x2, x_q) if need_w else None
            w_col = operands.columnwise("weight", weight, w_q) if need_x else None
        _save(ctx, x_col, w_col)
        ctx.operands, ctx.emulate = operands, emulate
        ctx.x_shape, ctx.x_dtype, ctx.out_dtype = x.shape, x.dtype, out_dtype
        ctx.w_dtype, ctx.b_dtype = weight.dtype, None if bias is None else bias.dtype
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        operands: Operands = ctx.operands
        recipe = operands.recipe
        x_col, w_col = _saved(ctx)
        dgrad = wgrad = bgrad = None
        with torch.autocast(grad_out.device.type, enabled=False):
            g = grad_out.reshape(-1, grad_out.shape[-1])
            g_q = operands.rowwise("grad_output", g) if need_x else None
            if g_q is not None:
                assert w_col is not None  # saved by the forward, which knew dgrad would run
                fast, acc = recipe.fp8_gemm_dgrad.use_fast_accum, recipe.accumulation
                dgrad = quantized_matmul(g_q, w_col, ctx.out_dtype, ctx.emulate, fast, None, acc)
                dgrad = dgrad.reshape(ctx.x_shape).to(ctx.x_dtype)
            if need_w:
                assert x_col is not None
                g_col = operands.columnwise("grad_output", g, g_q)
                fast, acc = recipe.fp8_gemm_wgrad.use_fast_accum, recipe.accumulation
                wgrad = quantized_matmul(g_col, x_col, torch.float32, ctx.emulate, fast, None, acc)
                wgrad = wgrad.to(ctx.w_dtype)
            if need_b and ctx.b_dtype is not None:
                bgrad = g.float().sum(0).to(ctx.b_dtype)
        operands.backward_done()
        return dgrad, wgrad, bgrad, None, None, None, None


_TENSOR_FIELDS = ("data", "scale_inv", "amax", "tensor_scale_inv")


def _save(ctx: Any, *copies: QuantizedTensor | None) -> None:
    """Save the copies' tensors with ``save_for_backward`` (so that activation checkpointing can
    free and recompute them) and the rest of each copy, its tensors left out, on ``ctx``."""
    tensors: list[torch.Tensor] = []
    ctx.copies = []
    for q in copies:
        if q is None:
            ctx.copies.append(None)
            continue
        fields = [f for f in _TENSOR_FIELDS if getattr(q, f) is not None]
        tensors += [getattr(q, f) for f in fields]
        left_out: dict[str, Any] = dict.fromkeys(fields)
        ctx.copies.append((dataclasses.replace(q, **left_out), fields))
    ctx.save_for_backward(*tensors)


def _saved(ctx: Any) -> list[QuantizedTensor | None]:
    """The copies ``_save`` saved, whole again."""
    tensors, at = ctx.saved_tensors, 0
    out: list[QuantizedTensor | None] = []
    for entry in ctx.copies:
        if entry is None:
            out.append(None)
            continue
        shell, fields = entry
        out.append(dataclasses.replace(shell, **dict(zip(fields, tensors[at:], strict=False))))
        at += len(fields)
    return out
