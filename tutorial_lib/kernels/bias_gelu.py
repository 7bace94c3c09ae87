"""Fused bias + GELU: ``y = GELU_tanh(x + bias)`` in one pass over memory.

Eager PyTorch runs this as two kernels: the add reads ``x`` and writes ``h = x + bias``; the
GELU reads ``h`` back and writes ``y``. The fused kernel reads ``x`` once and writes ``y`` once,
so it moves about half the bytes (see :mod:`tutorial_lib.kernels.traffic`), and since both ops
are memory-bound it runs about twice as fast.

GELU here is GPT-2's tanh approximation (``F.gelu(h, approximate="tanh")``)::

    GELU(h)  = 0.5 h (1 + tanh(u)),      u = sqrt(2/pi) (h + 0.044715 h^3)
    GELU'(h) = 0.5 (1 + tanh(u)) + 0.5 h (1 - tanh(u)^2) du/dh

The backward recomputes ``h`` from ``x`` (it saves ``x``, not ``y``: the derivative needs ``h``
and recomputing it costs no extra memory traffic because ``x`` must be read anyway).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .runtime import (
    as_rows,
    cdiv,
    check_kernel_inputs,
    next_power_of_2,
    row_tile,
    tl,
    triton,
)

Tensor = torch.Tensor


def bias_gelu_reference(x: Tensor, bias: Tensor | None = None) -> Tensor:
    """Plain PyTorch: compute in float32 (float64 if ``x`` is float64) and return ``x.dtype``."""
    compute = torch.promote_types(x.dtype, torch.float32)
    h = x.to(compute) if bias is None else x.to(compute) + bias.to(compute)
    return F.gelu(h, approximate="tanh").to(x.dtype)


@triton.jit
def gelu_tanh(h):
    """GELU(h) and tanh(u) for a float32 tile ``h`` (the backward reuses tanh(u))."""
    u = 0.7978845608028654 * (h + 0.044715 * h * h * h)  # sqrt(2/pi) * (h + 0.044715 h^3)
    # tanh from exp(-2|u|) <= 1: unlike (e^2u - 1) / (e^2u + 1), it cannot overflow.
    e = tl.exp(-2.0 * tl.abs(u))
    tanh_u = tl.where(u >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)
    return 0.5 * h * (1.0 + tanh_u), tanh_u


@triton.jit
def bias_gelu_fwd_kernel(
    x_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # This program owns a BLOCK_M x BLOCK_N tile of the (M, N) matrix.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)  # the edge tiles hang over the matrix
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]  # int64: M * N may exceed 2**31

    h = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # HBM read: x, once
    if HAS_BIAS:  # one bias row per program, broadcast over its BLOCK_M rows
        h += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y, _ = gelu_tanh(h)  # h never touches HBM
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # HBM write: y, once


@triton.jit
def bias_gelu_bwd_kernel(
    dy_ptr,
    x_ptr,
    bias_ptr,
    dx_ptr,
    dbias_partial_ptr,
    M,
    N,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]

    h = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read x
    if HAS_BIAS:
        h += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read dy
    _, tanh_u = gelu_tanh(h)
    du_dh = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * h * h)
    gelu_grad = 0.5 * (1.0 + tanh_u) + 0.5 * h * (1.0 - tanh_u * tanh_u) * du_dh
    dx = dy * gelu_grad  # 0 where masked, because dy was loaded as 0 there
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)  # write dx
    if HAS_BIAS:
        # dbias = sum of dx over all M rows. Each program adds up its own BLOCK_M rows (in
        # float32, before dx is rounded) and writes one row of partial sums; the launcher then
        # sums the small (M / BLOCK_M, N) buffer.
        tl.store(dbias_partial_ptr + pid_m * N + cols, tl.sum(dx, axis=0), mask=cols < N)


def grid_and_blocks(M: int, N: int, block_m: int | None) -> tuple[tuple[int, int], int, int, int]:
    """A 2-D grid of (row tiles, column tiles). Elementwise work needs no whole rows, so the
    column tile is capped at 4096 and wide matrices get several programs per row tile."""
    block_n = min(next_power_of_2(N), 4096)
    tile = row_tile(M, block_n, block_m)
    return (cdiv(M, tile.block_m), cdiv(N, block_n)), tile.block_m, block_n, tile.num_warps


def bias_gelu_forward(
    x: Tensor,
    bias: Tensor | None = None,
    *,
    block_m: int | None = None,
) -> Tensor:
    """Launch the forward kernel: ``GELU_tanh(x + bias)`` in ``x.dtype``; ``x`` is (..., N)."""
    check_kernel_inputs(x, bias, name="bias_gelu")
    x2 = as_rows(x)
    M, N = x2.shape
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias_gelu: bias must have shape ({N},), got {tuple(bias.shape)}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid, bm, bn, warps = grid_and_blocks(M, N, block_m)
    b = bias.contiguous() if bias is not None else x2  # a dummy pointer when there is no bias
    bias_gelu_fwd_kernel[grid](
        x2, b, y, M, N, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps
    )
    return y


def bias_gelu_backward(
    dy: Tensor,
    x: Tensor,
    bias: Tensor | None = None,
    *,
    block_m: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Launch the backward kernel: ``(dx, dbias)``; ``dbias`` is None when ``bias`` is None."""
    check_kernel_inputs(dy, x, bias, name="bias_gelu backward")
    if dy.shape != x.shape:
        raise ValueError(f"bias_gelu backward: dy {tuple(dy.shape)} != x {tuple(x.shape)}")
    x2, dy2 = as_rows(x), as_rows(dy)
    M, N = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid, bm, bn, warps = grid_and_blocks(M, N, block_m)
    # Dummy pointers (x2) stand in for the bias and the partial sums when there is no bias.
    b = bias.contiguous() if bias is not None else x2
    partial = torch.empty(grid[0], N, device=x.device) if bias is not None else x2
    bias_gelu_bwd_kernel[grid](
        dy2,
        x2,
        b,
        dx,
        partial,
        M,
        N,
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        num_warps=warps,
    )
    dbias = partial.sum(dim=0).to(bias.dtype) if bias is not None else None
    return dx, dbias


class BiasGelu(torch.autograd.Function):
    """Autograd wrapper: saves ``x`` and ``bias`` (not ``y``) and recomputes ``x + bias``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, bias)
        return bias_gelu_forward(x, bias)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, Tensor | None]:
        x, bias = ctx.saved_tensors
        dx, dbias = bias_gelu_backward(dy, x, bias)  # the bias is needed for h even if frozen
        return dx, dbias if ctx.needs_input_grad[1] else None


def bias_gelu(x: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.gelu(x + bias, approximate="tanh")`` as one Triton kernel, differentiable.

    ``x`` is (..., N) in float32, bfloat16 or float16; ``bias`` is (N,) or None. Returns
    ``x.dtype``. Under the hood: :func:`bias_gelu_forward` and :func:`bias_gelu_backward`.
    """
    return BiasGelu.apply(x, bias)
