"""FlashAttention in Triton: exact attention without the T x T score matrix in memory.

Written naively, attention for one head is three steps over (T, D) matrices Q, K and V::

    S = Q K^T / sqrt(D)        (T, T) scores, written to memory
    P = softmax(S)             (T, T) probabilities, written (and kept for the backward)
    O = P V                    (T, D)

so the (T, T) matrices travel through memory several times and the backward keeps P: memory
grows as T^2 while the useful FLOPs grow as T^2 D, and for D = 64 or 128 the step is bound by
memory traffic, not by the tensor cores (FlashAttention, Dao et al. 2022).

**Forward.** Each program owns ``BLOCK_M`` query rows and walks the keys in ``BLOCK_N``
blocks, keeping per row a running max ``m``, a running sum ``l`` of ``exp(s - m)`` and an
unnormalised output ``acc``. A block that raises the max rescales both by ``exp(m_old - m_new)``
(the online softmax of ``cross_entropy.py``'s logsumexp, applied to a weighted sum). At the end
``O = acc / l`` and the row's logsumexp ``L = m + log(l)`` is stored: 4 bytes per row instead of
T. Under the causal mask a query block stops at its own diagonal, so about half the key blocks
are never loaded.

**Backward** (as FlashAttention-2 organises it). Nothing of P was kept: each key block
recomputes ``P = exp(Q K^T / sqrt(D) - L)`` from Q, K and the stored L. With
``delta = rowsum(dO * O)`` (one pass, ``attn_delta_kernel``)::

    dV = P^T dO        dP = dO V^T        dS = P * (dP - delta)        dK = dS^T Q / sqrt(D)
    dQ = dS K / sqrt(D)

``attn_bwd_dkdv_kernel`` gives each program a key block and loops over the query blocks that
see it (dK and dV accumulate in registers); ``attn_bwd_dq_kernel`` gives each program a query
block and loops over the key blocks it sees. Both recompute P (and dO V^T), so the backward
reads Q, K, V, O, dO and L and never holds more than a (BLOCK_M, BLOCK_N) tile of P. That is
the price: 7 tile GEMMs where the forward does 2 (3.5x its FLOPs, against 2x for a backward
that kept P); FlashAttention-2 computes dQ inside the dK/dV loop with atomic adds instead of a
second kernel, which saves two of them (5 GEMMs, 2.5x).

Inputs are (B, H, T, D) in float32, float16 or bfloat16 (the GEMMs accumulate in float32; P is
cast to V's dtype before ``P V``, as FlashAttention does). ``flash_attention`` is differentiable;
on a CPU it runs in Triton's interpreter (correct, slow: use it for checking, not for speed).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .runtime import cdiv, check_kernel_inputs, interpreter_mode, next_power_of_2, tl, triton

Tensor = torch.Tensor

__all__ = ["attention_reference", "flash_attention", "flash_attention_forward"]


def attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The naive three steps with the causal mask, in float32 (float64 for float64 inputs): the
    (T, T) scores and probabilities are materialised. Returns the inputs' dtype."""
    compute = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = (t.to(compute) for t in (q, k, v))
    scores = qf @ kf.transpose(-2, -1) / math.sqrt(q.shape[-1])
    T, S = scores.shape[-2:]
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


@triton.jit
def attn_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    T,
    D,
    scale,
    F32_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64) * T * D  # (B * H) heads, each (T, D), contiguous
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    q = tl.load(
        q_ptr + head + rows[:, None] * D + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    if F32_DOT:  # (see flash_attention_forward)
        q = q.to(tl.float32)
    m = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    # keys past this block's last query are masked for every row of it: skip them
    end = tl.minimum((tl.program_id(0) + 1) * BLOCK_M, T)
    for n0 in range(0, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < T
        kv = head + cols[:, None] * D + dims[None, :]
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + kv, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv, mask=kv_mask, other=0.0)
        if F32_DOT:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = (
            tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * scale
        )  # (BLOCK_M, BLOCK_N)
        keep = col_ok[None, :] & (cols[None, :] <= rows[:, None])  # the causal mask
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # key 0 is always kept, so after the first block m_new is finite
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(
            tl.float32
        )
        m = m_new
    out = acc / l_sum[:, None]
    tl.store(
        o_ptr + head + rows[:, None] * D + dims[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )
    lse_rows = tl.program_id(1).to(tl.int64) * T + rows
    tl.store(lse_ptr + lse_rows, m + tl.log(l_sum), mask=row_ok)


@triton.jit
def attn_delta_kernel(
    o_ptr,
    do_ptr,
    delta_ptr,
    R,
    D,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < R) & (dims[None, :] < D)
    at = rows[:, None].to(tl.int64) * D + dims[None, :]
    o = tl.load(o_ptr + at, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < R)


@triton.jit
def _probs_and_dscores(
    q,
    k,
    v,
    do,
    lse,
    delta,
    rows,
    cols,
    row_ok,
    col_ok,
    scale,
    DOT_PRECISION: tl.constexpr,
):
    """The backward kernels' shared core on a (query block, key block) tile: P recomputed from
    the stored logsumexp L (zero where masked), and dS = P * (dO V^T - delta)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * scale
    keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] <= rows[:, None])
    p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION).to(tl.float32)
    return p, p * (dp - delta[:, None])


@triton.jit
def attn_bwd_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    T,
    D,
    scale,
    F32_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64) * T * D
    head_rows = tl.program_id(1).to(tl.int64) * T
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's keys
    dims = tl.arange(0, BLOCK_D)
    col_ok, dim_ok = cols < T, dims < D
    kv = head + cols[:, None] * D + dims[None, :]
    kv_mask = col_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_ptr + kv, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + kv, mask=kv_mask, other=0.0)
    if F32_DOT:
        k, v = k.to(tl.float32), v.to(tl.float32)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    # queries before this key block never see it
    start = (tl.program_id(0) * BLOCK_N // BLOCK_M) * BLOCK_M
    for m0 in range(start, T, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        qo = head + rows[:, None] * D + dims[None, :]
        qo_mask = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(q_ptr + qo, mask=qo_mask, other=0.0)
        do = tl.load(do_ptr + qo, mask=qo_mask, other=0.0)
        if F32_DOT:
            q, do = q.to(tl.float32), do.to(tl.float32)
        lse = tl.load(lse_ptr + head_rows + rows, mask=row_ok, other=0.0)
        delta = tl.load(delta_ptr + head_rows + rows, mask=row_ok, other=0.0)
        p, ds = _probs_and_dscores(
            q, k, v, do, lse, delta, rows, cols, row_ok, col_ok, scale, DOT_PRECISION
        )
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION).to(tl.float32)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION).to(tl.float32)
    tl.store(dk_ptr + kv, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def attn_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    T,
    D,
    scale,
    F32_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64) * T * D
    head_rows = tl.program_id(1).to(tl.int64) * T
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's queries
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    qo = head + rows[:, None] * D + dims[None, :]
    qo_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + qo, mask=qo_mask, other=0.0)
    do = tl.load(do_ptr + qo, mask=qo_mask, other=0.0)
    if F32_DOT:
        q, do = q.to(tl.float32), do.to(tl.float32)
    lse = tl.load(lse_ptr + head_rows + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + head_rows + rows, mask=row_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = tl.minimum((tl.program_id(0) + 1) * BLOCK_M, T)
    for n0 in range(0, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < T
        kv = head + cols[:, None] * D + dims[None, :]
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + kv, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv, mask=kv_mask, other=0.0)
        if F32_DOT:
            k, v = k.to(tl.float32), v.to(tl.float32)
        _, ds = _probs_and_dscores(
            q, k, v, do, lse, delta, rows, cols, row_ok, col_ok, scale, DOT_PRECISION
        )
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION).to(tl.float32)
    tl.store(dq_ptr + qo, (dq * scale).to(dq_ptr.dtype.element_ty), mask=qo_mask)


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_kernel_inputs(t, name=f"flash_attention {name}")
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "flash_attention: q, k and v must have the same shape (B, H, T, D), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; self-attention only "
            "(for other key lengths use torch.nn.functional.scaled_dot_product_attention)"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"flash_attention: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"flash_attention: head dim {q.shape[-1]} > 256 is not supported")


def _f32_dot(q: Tensor) -> bool:
    """Triton's interpreter multiplies tiles with NumPy, which has no bfloat16: there the
    kernels convert BF16 tiles to float32 (exact) before each ``tl.dot``, so P is not rounded
    to BF16 before ``P V`` as on a GPU (where the tensor cores take BF16)."""
    return interpreter_mode() and q.dtype == torch.bfloat16


def _dot_precision(q: Tensor) -> str:
    """FP32 inputs multiply in full FP32 ("ieee"), as the float64 check expects, not TF32 (which
    ``tl.dot`` would use on a GPU by default); 16-bit inputs use the tensor cores as they are."""
    return "ieee" if q.dtype == torch.float32 or _f32_dot(q) else "tf32"


def _blocks(T: int, D: int) -> tuple[int, int]:
    """(BLOCK, BLOCK_D): one square tile size for queries and keys (16 at least: ``tl.dot``'s
    minimum), 64 at most."""
    return min(64, max(16, next_power_of_2(T))), max(16, next_power_of_2(D))


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: ``(O, L)``, O in the inputs' dtype and shape, L the float32
    logsumexp of each query row's scores, (B, H, T)."""
    _check(q, k, v)
    B, H, T, D = q.shape
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    size, block_d = _blocks(T, D)
    attn_fwd_kernel[(cdiv(T, size), B * H)](
        q, k, v, o, lse, T, D, 1.0 / math.sqrt(D),
        F32_DOT=_f32_dot(q), DOT_PRECISION=_dot_precision(q), BLOCK_M=size, BLOCK_N=size, BLOCK_D=block_d,
    )  # fmt: skip
    return o, lse


def flash_attention_backward(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the backward kernels: ``(dQ, dK, dV)`` from dO, the inputs, O and L."""
    B, H, T, D = q.shape
    do = do.contiguous()
    size, block_d = _blocks(T, D)
    delta = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    rows = B * H * T
    attn_delta_kernel[(cdiv(rows, 64),)](o, do, delta, rows, D, BLOCK=64, BLOCK_D=block_d)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(D)
    grid = (cdiv(T, size), B * H)
    attn_bwd_dkdv_kernel[grid](
        q, k, v, do, lse, delta, dk, dv, T, D, scale,
        F32_DOT=_f32_dot(q), DOT_PRECISION=_dot_precision(q), BLOCK_M=size, BLOCK_N=size, BLOCK_D=block_d,
    )  # fmt: skip
    attn_bwd_dq_kernel[grid](
        q, k, v, do, lse, delta, dq, T, D, scale,
        F32_DOT=_f32_dot(q), DOT_PRECISION=_dot_precision(q), BLOCK_M=size, BLOCK_N=size, BLOCK_D=block_d,
    )  # fmt: skip
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))  # once: the kernels and the backward
        o, lse = flash_attention_forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx: Any, do: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, o, lse = ctx.saved_tensors
        return flash_attention_backward(do, q, k, v, o, lse)


def flash_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Exact causal self-attention of (B, H, T, D) ``q``, ``k``, ``v`` with softmax scale
    ``1/sqrt(D)``: ``scaled_dot_product_attention(q, k, v, is_causal=True)``, computed tile by
    tile (module docstring). Differentiable; it keeps O and the (B, H, T) logsumexp for the
    backward, not the (T, T) probabilities. Queries and keys come in square tiles of up to 64
    (at least 16)."""
    return _FlashAttention.apply(q, k, v)
