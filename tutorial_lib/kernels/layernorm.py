"""LayerNorm, and residual-add + LayerNorm, as Triton kernels with a hand-written backward.

Forward, per row of N values (up to ``runtime.MAX_ROW_BLOCK`` = 4096 values the whole row sits
in one tile, so each element is read once; wider rows go through the two-pass kernels of
``wide_rows.py``)::

    mean = sum(x) / N,   rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)
    xhat = (x - mean) * rstd,   y = xhat * weight + bias

The forward also writes ``mean`` and ``rstd`` (one float32 each per row, tiny) so the backward
need not recompute them. With ``g = dy * weight``, the backward is::

    dx      = rstd * (g - mean(g) - xhat * mean(g * xhat))      (means over the row)
    dweight = sum over rows of dy * xhat,    dbias = sum over rows of dy

``dx`` is per row, but ``dweight`` and ``dbias`` are sums over *all* M rows: a reduction across
programs. Each program accumulates its rows into float32 registers and writes one row of
partial sums to a (P, N) buffer; ``part.sum(0)`` then adds the P partial rows column by column,
as in ``bias_gelu.py``. No atomics, so the result is deterministic.

``add_layer_norm`` fuses the residual add of a pre-norm transformer block into the same pass:
``s = x + residual`` (the new residual stream, returned) and ``y = LayerNorm(s)``. One kernel
reads ``x`` and ``residual`` once and writes ``s`` and ``y`` once. In the backward, ``s`` gets
gradient from both outputs (``ds + LayerNorm'(dy)``), and the same backward kernel adds the
incoming ``ds`` before it writes, so that is one pass too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .runtime import (
    INTERPRETER_PROGRAMS,
    as_rows,
    cdiv,
    check_kernel_inputs,
    interpreter_mode,
    row_block,
    row_tile,
    tl,
    triton,
)
from .wide_rows import layer_norm_backward_chunked, layer_norm_fwd_chunked_kernel

Tensor = torch.Tensor


def layer_norm_reference(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> Tensor:
    """Plain PyTorch: LayerNorm over the last dim in float32 (float64 for float64 ``x``)."""
    compute = torch.promote_types(x.dtype, torch.float32)
    w = weight.to(compute) if weight is not None else None
    b = bias.to(compute) if bias is not None else None
    return F.layer_norm(x.to(compute), x.shape[-1:], w, b, eps).to(x.dtype)


def add_layer_norm_reference(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> tuple[Tensor, Tensor]:
    """Plain PyTorch: ``s = x + residual`` (in their promoted dtype), ``(s, LayerNorm(s))``."""
    s = x + residual
    return s, layer_norm_reference(s, weight, bias, eps)


@triton.jit
def layer_norm_fwd_kernel(
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
    # This program normalises BLOCK_M whole rows; BLOCK_N >= N so each row fits one tile.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]

    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read x once
    if HAS_RESIDUAL:  # fused residual add: read the residual once, write s once
        x += tl.load(res_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        s = x.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + offsets, s, mask=mask)
        x = s.to(tl.float32)  # normalise the stored (rounded) s, exactly what autograd saw

    mean = tl.sum(x, axis=1) / N  # (BLOCK_M,); padding columns are 0 and add nothing
    xc = tl.where(col_ok[None, :], x - mean[:, None], 0.0)  # keep the padding out of var
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)  # write y once
    tl.store(mean_ptr + rows, mean, mask=row_ok)  # 8 bytes per row for the backward
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def layer_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
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
    # A grid of P programs walks the row tiles: program p takes tiles p, p + P, p + 2P, ...
    # so the partial-sum buffers stay (P, N) however many rows there are.
    pid, num_programs = tl.program_id(0), tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) if HAS_WEIGHT else 1.0
    dw_acc = tl.zeros((BLOCK_N,), tl.float32)  # this program's share of dweight
    db_acc = tl.zeros((BLOCK_N,), tl.float32)  # ... and of dbias
    for tile in range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & col_ok[None, :]
        offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read x
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read dy
        mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w
        mean_g = tl.sum(g, axis=1) / N
        mean_gx = tl.sum(g * xhat, axis=1) / N
        dx = rstd[:, None] * (g - mean_g[:, None] - xhat * mean_gx[:, None])
        if HAS_DS:  # add_layer_norm: s also received gradient directly (the residual stream)
            dx += tl.load(ds_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)  # write dx
        if WEIGHT_GRADS:  # masked rows hold dy = 0 and add nothing
            dw_acc += tl.sum(dy * xhat, axis=0)
            db_acc += tl.sum(dy, axis=0)
    if WEIGHT_GRADS:  # one row of partial sums per program
        tl.store(dw_part_ptr + pid * N + cols, dw_acc, mask=col_ok)
        tl.store(db_part_ptr + pid * N + cols, db_acc, mask=col_ok)


def _checked_params(
    N: int, weight: Tensor | None, bias: Tensor | None, name: str
) -> tuple[Tensor | None, Tensor | None]:
    """``weight`` and ``bias`` made contiguous, after checking they have shape (N,)."""
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (N,):
            raise ValueError(f"{name}: {what} must have shape ({N},), got {tuple(t.shape)}")
    w = weight.contiguous() if weight is not None else None
    b = bias.contiguous() if bias is not None else None
    return w, b


def add_layer_norm_forward(
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float = 1e-5,
    *,
    block_m: int | None = None,
) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
    """Launch the fused kernel: ``(s, y, mean, rstd)`` with ``s = x + residual`` in
    ``torch.result_type(x, residual)`` and ``y = LayerNorm(s)`` in the same dtype; with
    ``residual`` None, ``s`` is None and ``y = LayerNorm(x)`` (``layer_norm_forward``)."""
    name = "layer_norm" if residual is None else "add_layer_norm"
    check_kernel_inputs(x, residual, weight, bias, name=name)
    x2 = as_rows(x)
    M, N = x2.shape
    weight, bias = _checked_params(N, weight, bias, name)
    block_n, chunked = row_block(N)
    tile = row_tile(M, block_n, block_m)
    s = r2 = None
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"{name}: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        r2 = as_rows(residual)
        s = torch.empty(x.shape, dtype=torch.result_type(x, residual), device=x.device)
    y = torch.empty(x.shape, dtype=s.dtype if s is not None else x.dtype, device=x.device)
    mean = torch.empty(M, dtype=torch.float32, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    dummy = x2  # stands in for absent tensors; the constexpr flags keep it from being touched
    kernel = layer_norm_fwd_chunked_kernel if chunked else layer_norm_fwd_kernel
    kernel[(cdiv(M, tile.block_m),)](
        x2,
        r2 if r2 is not None else dummy,
        s if s is not None else dummy,
        weight if weight is not None else dummy,
        bias if bias is not None else dummy,
        y,
        mean,
        rstd,
        M,
        N,
        eps,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=tile.block_m,
        BLOCK_N=block_n,
        num_warps=tile.num_warps,
    )
    return s, y, mean, rstd


def layer_norm_forward(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float = 1e-5,
    *,
    block_m: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the forward kernel on ``x`` (..., N): ``(y, mean, rstd)``, mean/rstd float32 (M,).

    ``y`` has ``x``'s dtype; ``weight`` and ``bias`` (N,) may have another (under autocast they
    are float32 parameters while ``x`` is bfloat16), or be None (1 and 0). Rows wider than
    ``runtime.MAX_ROW_BLOCK`` run the two-pass chunked kernel.
    """
    _, y, mean, rstd = add_layer_norm_forward(x, None, weight, bias, eps, block_m=block_m)
    return y, mean, rstd


def layer_norm_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    *,
    bias: Tensor | None = None,
    weight_grads: bool = True,
    ds: Tensor | None = None,
    block_m: int | None = None,
    num_programs: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Launch the backward kernels: ``(dx, dweight, dbias)``.

    ``dweight`` is None when ``weight`` is None, ``dbias`` when ``bias`` is None (the bias is
    passed only for that and for its dtype), both when ``weight_grads`` is False. Weight grads
    come back in the parameters' dtypes. ``ds`` (same shape as ``x``) is gradient that reached
    ``x`` by another path and is added to ``dx`` in the same pass (``add_layer_norm``). ``dx``
    has ``x``'s dtype. ``block_m`` and ``num_programs`` override the tiling, so tests can force
    several row tiles per program and ragged tails; rows wider than ``runtime.MAX_ROW_BLOCK``
    take the two-pass chunked kernels. The (P, N) partial sums are added up by ``part.sum(0)``.
    """
    check_kernel_inputs(dy, x, weight, ds, name="layer_norm backward")
    x2, dy2 = as_rows(x), as_rows(dy)
    M, N = x2.shape
    if dy.shape != x.shape or (ds is not None and ds.shape != x.shape):
        raise ValueError("layer_norm backward: dy (and ds) must have x's shape")
    weight, _ = _checked_params(N, weight, None, "layer_norm backward")
    block_n, chunked = row_block(N)
    tile = row_tile(M, block_n, block_m)
    if num_programs is None:  # a few waves of SMs: each program loops over row tiles
        num_programs = INTERPRETER_PROGRAMS
        if x.device.type == "cuda" and not interpreter_mode():
            num_programs = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = min(cdiv(M, tile.block_m), num_programs)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    wanted = weight_grads and (weight is not None or bias is not None)
    part_w = torch.empty(grid, N, device=x.device) if wanted else x2
    part_b = torch.empty(grid, N, device=x.device) if wanted else x2
    w2 = weight if weight is not None else x2
    ds2 = as_rows(ds) if ds is not None else x2
    flags: dict[str, Any] = dict(
        HAS_WEIGHT=weight is not None,
        HAS_DS=ds is not None,
        WEIGHT_GRADS=wanted,
        BLOCK_M=tile.block_m,
        BLOCK_N=block_n,
        num_warps=tile.num_warps,
    )
    if chunked:
        layer_norm_backward_chunked(dy2, x2, w2, mean, rstd, ds2, dx, part_w, part_b, grid, flags)
    else:
        layer_norm_bwd_kernel[(grid,)](
            dy2, x2, w2, mean, rstd, ds2, dx, part_w, part_b, M, N, **flags
        )
    dw = part_w.sum(0).to(weight.dtype) if wanted and weight is not None else None
    db = part_b.sum(0).to(bias.dtype) if wanted and bias is not None else None
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``x``, the parameters and the per-row ``mean`` and ``rstd``."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
    ) -> Tensor:
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        _, need_w, need_b, _ = ctx.needs_input_grad
        dx, dw, db = layer_norm_backward(
            dy, x, weight, mean, rstd, bias=bias, weight_grads=need_w or need_b
        )
        return dx, dw if need_w else None, db if need_b else None, None


class AddLayerNormFunction(torch.autograd.Function):
    """Autograd wrapper for ``(s, y) = (x + residual, LayerNorm(x + residual))``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
    ) -> tuple[Tensor, Tensor]:
        s, y, mean, rstd = add_layer_norm_forward(x, residual, weight, bias, eps)
        assert s is not None
        ctx.save_for_backward(s, weight, bias, mean, rstd)
        ctx.dtypes = (x.dtype, residual.dtype)
        return s, y

    @staticmethod
    def backward(ctx: Any, ds: Tensor | None, dy: Tensor | None) -> tuple[Tensor | None, ...]:
        s, weight, bias, mean, rstd = ctx.saved_tensors
        need_x, need_r, need_w, need_b, _ = ctx.needs_input_grad
        if dy is None:  # only s was used: LayerNorm contributes nothing
            dy = torch.zeros_like(s)
        # ds_total = ds + LayerNorm'(dy), one kernel; then hand it to both inputs of the add.
        ds_total, dw, db = layer_norm_backward(
            dy, s, weight, mean, rstd, bias=bias, weight_grads=need_w or need_b, ds=ds
        )
        x_dtype, r_dtype = ctx.dtypes
        dx = ds_total.to(x_dtype) if need_x else None
        dr = ds_total.to(r_dtype) if need_r else None
        return dx, dr, dw if need_w else None, db if need_b else None, None


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm(x, x.shape[-1:], weight, bias, eps)`` on the Triton kernels, differentiable.

    ``x`` is (..., N) in float32, bfloat16 or float16 and the output has its dtype; ``weight``
    and ``bias`` are (N,) in any of those dtypes (or None) and get grads in their own dtype.
    """
    return LayerNormFunction.apply(x, weight, bias, eps)


def add_layer_norm(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> tuple[Tensor, Tensor]:
    """``s = x + residual`` and ``y = LayerNorm(s)`` in one kernel; returns ``(s, y)``.

    ``s`` (the updated residual stream) has dtype ``torch.result_type(x, residual)`` and ``y``
    the same. Both outputs are differentiable; ``x`` and ``residual`` get the same gradient
    (``ds + LayerNorm'(dy)``), each cast to its own dtype.
    """
    return AddLayerNormFunction.apply(x, residual, weight, bias, eps)
