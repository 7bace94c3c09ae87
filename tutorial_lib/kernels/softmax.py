"""Row softmax over the last dimension, forward and backward: one tile per row, up to 4096 values.

Numerically stable: subtract the row maximum before ``exp`` so the largest exponent is
``exp(0) = 1`` and nothing overflows (``softmax(x) == softmax(x - c)`` for any ``c``)::

    y = exp(x - max(x)) / sum(exp(x - max(x)))

The backward needs only ``y`` (saved by the forward) and ``dy``::

    dx = y * (dy - sum(dy * y))

Each program loads whole rows as one tile (``BLOCK_N >= N``), so the forward reads ``x`` once
and writes ``y`` once: the minimum traffic, with the row in registers. Rows are limited to
``runtime.MAX_ROW_BLOCK`` (4096) values: a wider row as one tile would not fit in registers
(65536 float32 values are 256 KB, a whole SM's register file) and the compiler would spill it to
local memory. The book's softmax rows (attention scores over a context of at most 2048 tokens)
all fit; LayerNorm, which meets wider rows, walks them in chunks (``wide_rows.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import runtime
from .runtime import as_rows, cdiv, check_kernel_inputs, next_power_of_2, row_tile, tl, triton

Tensor = torch.Tensor


def softmax_reference(x: Tensor) -> Tensor:
    """Plain PyTorch: softmax over the last dim in float32 (float64 for float64 ``x``)."""
    compute = torch.promote_types(x.dtype, torch.float32)
    return torch.softmax(x.to(compute), dim=-1).to(x.dtype)


@triton.jit
def softmax_fwd_kernel(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    # Rows past the end re-read row M - 1, so every row of the tile holds real numbers (a row of
    # only -inf would give -inf - -inf = NaN); their results are never stored.
    safe_rows = tl.minimum(rows, M - 1)
    offsets = safe_rows[:, None].to(tl.int64) * N + cols[None, :]
    # Padding columns load as -inf: they cannot be the max and exp(-inf) = 0 adds nothing.
    x = tl.load(x_ptr + offsets, mask=cols[None, :] < N, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=1)[:, None])  # every exponent <= 0: no overflow
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # read x, write y: once


@triton.jit
def softmax_bwd_kernel(
    dy_ptr,
    y_ptr,
    dx_ptr,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read y
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read dy
    dot = tl.sum(dy * y, axis=1)  # (BLOCK_M,): the only cross-column coupling
    dx = y * (dy - dot[:, None])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)  # write dx


def _block_n(N: int, name: str) -> int:
    """One tile per row: refuse rows wider than ``runtime.MAX_ROW_BLOCK`` (they would spill)."""
    if N > runtime.MAX_ROW_BLOCK:
        raise ValueError(
            f"{name}: rows of at most {runtime.MAX_ROW_BLOCK} values fit one tile, got {N}"
        )
    return next_power_of_2(N)


def softmax_forward(x: Tensor, *, block_m: int | None = None) -> Tensor:
    """Launch the forward kernel: softmax of ``x`` (..., N) over its last dim, in ``x.dtype``."""
    check_kernel_inputs(x, name="softmax")
    x2 = as_rows(x)
    M, N = x2.shape
    block_n = _block_n(N, "softmax")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tile = row_tile(M, block_n, block_m)
    softmax_fwd_kernel[(cdiv(M, tile.block_m),)](
        x2, y, M, N, BLOCK_M=tile.block_m, BLOCK_N=block_n, num_warps=tile.num_warps
    )
    return y


def softmax_backward(dy: Tensor, y: Tensor, *, block_m: int | None = None) -> Tensor:
    """Launch the backward kernel: ``dx = y * (dy - sum(dy * y))`` per row, in ``y.dtype``."""
    check_kernel_inputs(dy, y, name="softmax backward")
    if dy.shape != y.shape:
        raise ValueError(f"softmax backward: dy {tuple(dy.shape)} != y {tuple(y.shape)}")
    y2, dy2 = as_rows(y), as_rows(dy)
    M, N = y2.shape
    block_n = _block_n(N, "softmax backward")
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    tile = row_tile(M, block_n, block_m)
    softmax_bwd_kernel[(cdiv(M, tile.block_m),)](
        dy2, y2, dx, M, N, BLOCK_M=tile.block_m, BLOCK_N=block_n, num_warps=tile.num_warps
    )
    return dx


class SoftmaxFunction(torch.autograd.Function):
    """Autograd wrapper: saves the output ``y`` (the backward needs nothing else)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return softmax_backward(dy, y)


def softmax(x: Tensor) -> Tensor:
    """``torch.softmax(x, dim=-1)`` on the Triton kernels, differentiable; returns ``x.dtype``.

    ``x`` is (..., N) in float32, bfloat16 or float16, with N up to ``runtime.MAX_ROW_BLOCK``
    (4096).
    """
    return SoftmaxFunction.apply(x)
