"""LayerNorm for rows wider than one tile: walk the row in chunks, in two passes.

LayerNorm needs a whole row's statistics before it can write any element of it. Up to
``runtime.MAX_ROW_BLOCK`` (4096) values, a program loads whole rows as one tile, keeps them in
registers and reads them once (``layernorm.py``). A wider row as one tile would
not fit: 65536 float32 values are 256 KB, the whole register file of a Hopper SM (64K 32-bit
registers), and one thread may use at most 255 registers. The compiler would spill the excess to
local memory (per-thread storage in device memory, cached in L1 and L2), and every spilled value
would make extra round trips. So for wide rows these kernels keep only one chunk of ``BLOCK_N``
columns live at a time:

* **LayerNorm forward.** Pass 1 walks the chunks and merges each chunk's mean and sum of squared
  deviations into the running ones (Chan, Golub and LeVeque's pairwise update, which does not
  lose precision the way ``sum(x^2) - N mean^2`` does). Pass 2 walks the chunks again to
  normalise and write ``y`` (and ``s = x + residual``, recomputed rather than read back).
* **LayerNorm backward.** ``dx`` needs two row means, of ``g = dy * w`` and of ``g * xhat``: a
  first kernel computes them per row (pass 1). A second kernel, one program per (row tiles,
  column chunk), then writes ``dx`` for its chunk and accumulates that chunk's weight-gradient
  partial sums, exactly as the one-tile kernel does for whole rows (pass 2).

Each pass reads the row again: a wide row costs one more read of its inputs than the one-tile
kernels' minimum traffic, which is the price of never spilling.
"""

from __future__ import annotations

from typing import Any

import torch

from .runtime import cdiv, tl, triton

Tensor = torch.Tensor


@triton.jit
def _sum_of_inputs(x_ptr, res_ptr, s_ptr, offsets, mask, HAS_RESIDUAL: tl.constexpr):
    """A chunk of ``x`` in float32, or of ``s = x + residual`` rounded to ``s``'s dtype."""
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        x = x.to(s_ptr.dtype.element_ty).to(tl.float32)  # what the one-tile kernel normalises
    return x


@triton.jit
def layer_norm_fwd_chunked_kernel(
    x_ptr,
    res_ptr,
    s_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    M,
    N,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Same arguments as layer_norm_fwd_kernel, but N > BLOCK_N: the row comes in chunks.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_start = rows.to(tl.int64) * N
    count = tl.zeros((BLOCK_M,), tl.float32)  # values merged so far
    mean = tl.zeros((BLOCK_M,), tl.float32)
    m2 = tl.zeros((BLOCK_M,), tl.float32)  # sum of squared deviations from mean
    for c0 in range(0, N, BLOCK_N):  # pass 1: the statistics, one chunk live at a time
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = row_start[:, None] + cols[None, :]
        x = _sum_of_inputs(x_ptr, res_ptr, s_ptr, offsets, mask, HAS_RESIDUAL)
        n_c = tl.sum(col_ok.to(tl.float32), axis=0)  # valid columns in this chunk
        mean_c = tl.sum(x, axis=1) / n_c
        d = tl.where(col_ok[None, :], x - mean_c[:, None], 0.0)
        delta = mean_c - mean  # merge (count, mean, m2) with (n_c, mean_c, sum(d * d))
        total = count + n_c
        mean += delta * (n_c / total)
        m2 += tl.sum(d * d, axis=1) + delta * delta * (count * n_c / total)
        count = total
    rstd = 1.0 / tl.sqrt(m2 / N + eps)
    for c0 in range(0, N, BLOCK_N):  # pass 2: normalise and write
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = row_start[:, None] + cols[None, :]
        x = _sum_of_inputs(x_ptr, res_ptr, s_ptr, offsets, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(s_ptr + offsets, x.to(s_ptr.dtype.element_ty), mask=mask)
        y = (x - mean[:, None]) * rstd[:, None]
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def layer_norm_bwd_row_means_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    mean_g_ptr,
    mean_gx_ptr,
    M,
    N,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Backward pass 1: the row means of g = dy * w and of g * xhat, chunk by chunk.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_start = rows.to(tl.int64) * N
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    sum_g = tl.zeros((BLOCK_M,), tl.float32)
    sum_gx = tl.zeros((BLOCK_M,), tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = row_start[:, None] + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        g = dy
        if HAS_WEIGHT:
            g = dy * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        sum_g += tl.sum(g, axis=1)
        sum_gx += tl.sum(g * xhat, axis=1)
    tl.store(mean_g_ptr + rows, sum_g / N, mask=row_ok)
    tl.store(mean_gx_ptr + rows, sum_gx / N, mask=row_ok)


@triton.jit
def layer_norm_bwd_chunked_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    mean_g_ptr,
    mean_gx_ptr,
    ds_ptr,
    dx_ptr,
    dw_part_ptr,
    db_part_ptr,
    M,
    N,
    HAS_WEIGHT: tl.constexpr,
    HAS_DS: tl.constexpr,
    WEIGHT_GRADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Backward pass 2, on a (P, column chunks) grid: program (p, c) owns columns chunk c of row
    # tiles p, p + P, ...; it writes their dx and one chunk of row p of the partial sums.
    pid, num_programs = tl.program_id(0), tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) if HAS_WEIGHT else 1.0
    dw_acc = tl.zeros((BLOCK_N,), tl.float32)
    db_acc = tl.zeros((BLOCK_N,), tl.float32)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        mean_g = tl.load(mean_g_ptr + rows, mask=row_ok, other=0.0)
        mean_gx = tl.load(mean_gx_ptr + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        dx = rstd[:, None] * (dy * w - mean_g[:, None] - xhat * mean_gx[:, None])
        if HAS_DS:
            dx += tl.load(ds_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRADS:
            dw_acc += tl.sum(dy * xhat, axis=0)
            db_acc += tl.sum(dy, axis=0)
    if WEIGHT_GRADS:
        part = pid.to(tl.int64) * N + cols
        tl.store(dw_part_ptr + part, dw_acc, mask=col_ok)
        tl.store(db_part_ptr + part, db_acc, mask=col_ok)


def layer_norm_backward_chunked(
    dy2: Tensor,
    x2: Tensor,
    w2: Tensor,
    mean: Tensor,
    rstd: Tensor,
    ds2: Tensor,
    dx: Tensor,
    part_w: Tensor,
    part_b: Tensor,
    grid: int,
    flags: dict[str, Any],
) -> None:
    """Launch the LayerNorm backward for rows wider than one tile (``layernorm.py``'s
    ``layer_norm_backward`` prepares the arguments and reduces the partial sums): pass 1 computes
    each row's means of ``g`` and ``g * xhat``; pass 2 writes ``dx`` and the (grid, N) partial
    sums on a (grid, column chunks) grid. ``flags`` are the one-tile kernel's constexprs."""
    M, N = x2.shape
    mean_g = torch.empty(M, dtype=torch.float32, device=x2.device)
    mean_gx = torch.empty(M, dtype=torch.float32, device=x2.device)
    block_m, block_n = flags["BLOCK_M"], flags["BLOCK_N"]
    layer_norm_bwd_row_means_kernel[(cdiv(M, block_m),)](
        dy2,
        x2,
        w2,
        mean,
        rstd,
        mean_g,
        mean_gx,
        M,
        N,
        HAS_WEIGHT=flags["HAS_WEIGHT"],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=flags["num_warps"],
    )
    layer_norm_bwd_chunked_kernel[(grid, cdiv(N, block_n))](
        dy2, x2, w2, mean, rstd, mean_g, mean_gx, ds2, dx, part_w, part_b, M, N, **flags
    )
