"""Fused cross-entropy straight from the logits: the softmax never touches HBM.

``F.cross_entropy(logits.float(), targets)`` on (M, V) logits first makes a float32 copy of
them, then writes a (M, V) log-softmax, then reads it back for the loss and again in the
backward. With GPT-2's V = 50257 those are the biggest activations of the model. Here:

* **Forward.** Each program takes ``BLOCK_M`` rows and walks the vocabulary in ``BLOCK_V``
  chunks with an *online* logsumexp: it keeps a running max ``m`` and a running sum
  ``s = sum(exp(x - m))``, and when a chunk raises the max it rescales the old sum by
  ``exp(m_old - m_new)``. After one pass ``lse = m + log(s)`` and ``loss = lse - x[target]``.
  It writes only the per-row ``lse`` and ``loss`` (8 bytes per row).
* **Backward.** ``dlogits = (softmax - onehot(target)) * grad / n_valid``, with the softmax
  recomputed chunk by chunk as ``exp(x - lse)``: one more read of the logits, one write of the
  gradient in the logits' dtype.

Rows whose target is ``ignore_index`` contribute 0 and are left out of the mean; their
gradient is 0. If *every* row is ignored the loss is 0 and all gradients are 0 (PyTorch
returns NaN there, from 0 / 0; we prefer a value that cannot poison a training run).
"""

from __future__ import annotations

from typing import Any

import torch

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

DEFAULT_BLOCK_V = 1024


def cross_entropy_reference(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Plain PyTorch: ``F.cross_entropy`` in float32 (float64 for float64 logits), mean over the
    rows that are not ignored, returning 0 (not NaN) when every row is ignored."""
    compute = torch.promote_types(logits.dtype, torch.float32)
    losses = torch.nn.functional.cross_entropy(
        logits.to(compute), targets, ignore_index=ignore_index, reduction="none"
    )
    n_valid = (targets != ignore_index).sum().clamp(min=1)
    return losses.sum() / n_valid


def _check_targets(targets: Tensor, M: int, V: int, ignore_index: int) -> None:
    """Clear errors for the mistakes that would otherwise read out of bounds in the kernel."""
    if targets.shape != (M,):
        raise ValueError(
            f"cross_entropy: targets must have shape ({M},) to match logits ({M}, {V}), "
            f"got {tuple(targets.shape)}; flatten both, e.g. logits.view(-1, V), targets.view(-1)"
        )
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"cross_entropy: targets must be integer class ids, got {targets.dtype}")
    bad = ((targets < 0) & (targets != ignore_index)) | (targets >= V)
    if bool(bad.any()):  # one device sync; an out-of-range id would read outside the row
        first = targets[bad][0].item()
        raise ValueError(
            f"cross_entropy: target {first} is outside [0, {V}) and is not ignore_index "
            f"({ignore_index}); check the vocabulary size and the padding id"
        )


@triton.jit
def cross_entropy_fwd_kernel(
    logits_ptr,
    targets_ptr,
    lse_ptr,
    loss_ptr,
    M,
    V,
    ignore_index,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    # Rows past the end re-read row M - 1 (never stored): a row of only -inf would make
    # m - m_new below -inf - -inf = NaN.
    row_start = tl.minimum(rows, M - 1).to(tl.int64) * V  # int64: M * V can exceed 2**31
    m = tl.full((BLOCK_M,), -float("inf"), tl.float32)  # running max per row
    s = tl.zeros((BLOCK_M,), tl.float32)  # running sum of exp(x - m)
    for v0 in range(0, V, BLOCK_V):  # the only pass over the logits
        cols = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(
            logits_ptr + row_start[:, None] + cols[None, :],
            mask=cols[None, :] < V,
            other=-float("inf"),
        ).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        # Rescale what we summed so far to the new max, then add this chunk. While a row has
        # seen only -inf (a masked chunk), shift by 0 instead: -inf - -inf would be NaN.
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
        m = m_new
    lse = m + tl.log(s)  # log(sum(exp(x))), never overflowing

    target = tl.load(targets_ptr + rows, mask=row_ok, other=ignore_index)
    valid = row_ok & (target != ignore_index)
    # One scalar gather per row: the target's logit (ignored rows read nothing).
    x_target = tl.load(logits_ptr + row_start + target, mask=valid, other=0.0).to(tl.float32)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(loss_ptr + rows, tl.where(valid, lse - x_target, 0.0), mask=row_ok)


@triton.jit
def cross_entropy_bwd_kernel(
    logits_ptr,
    targets_ptr,
    lse_ptr,
    scale_ptr,
    dlogits_ptr,
    M,
    V,
    ignore_index,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_start = rows.to(tl.int64) * V
    target = tl.load(targets_ptr + rows, mask=row_ok, other=ignore_index)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    # grad_loss / n_valid, read from memory so the host never waits for the GPU; 0 if ignored.
    scale = tl.where(target != ignore_index, tl.load(scale_ptr), 0.0)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols[None, :] < V)
        offsets = row_start[:, None] + cols[None, :]
        x = tl.load(logits_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # read logits
        p = tl.exp(x - lse[:, None])  # the softmax, recomputed: it was never stored
        p -= tl.where(cols[None, :] == target[:, None], 1.0, 0.0)  # minus onehot(target)
        dx = p * scale[:, None]
        tl.store(dlogits_ptr + offsets, dx.to(dlogits_ptr.dtype.element_ty), mask=mask)


def _blocks(M: int, V: int, block_v: int | None, block_m: int | None) -> tuple[int, int, int]:
    bv = next_power_of_2(block_v or min(V, DEFAULT_BLOCK_V))
    tile = row_tile(M, bv, block_m)
    return bv, tile.block_m, tile.num_warps


def cross_entropy_forward(
    logits: Tensor,
    targets: Tensor,
    ignore_index: int = -100,
    *,
    block_v: int | None = None,
    block_m: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Launch the forward kernel on (M, V) logits and (M,) integer targets.

    Returns ``(loss, lse, row_losses, n_valid)``: the 0-d float32 mean loss, the per-row
    logsumexp and loss (float32, (M,); ignored rows have loss 0), and the number of rows that
    count (an int64 0-d tensor). ``block_v`` sets the vocabulary chunk (default 1024, rounded up
    to a power of two) so a test can force many chunks.
    """
    check_kernel_inputs(logits, name="cross_entropy")
    if logits.dim() != 2:
        raise ValueError(
            f"cross_entropy: logits must be (M, V), got shape {tuple(logits.shape)}; "
            "flatten the leading dims with logits.view(-1, V)"
        )
    logits = as_rows(logits)
    M, V = logits.shape
    _check_targets(targets, M, V, ignore_index)
    targets = targets.contiguous()
    lse = torch.empty(M, dtype=torch.float32, device=logits.device)
    losses = torch.empty(M, dtype=torch.float32, device=logits.device)
    bv, bm, warps = _blocks(M, V, block_v, block_m)
    cross_entropy_fwd_kernel[(cdiv(M, bm),)](
        logits,
        targets,
        lse,
        losses,
        M,
        V,
        ignore_index,
        BLOCK_M=bm,
        BLOCK_V=bv,
        num_warps=warps,
    )
    n_valid = (targets != ignore_index).sum()
    loss = losses.sum() / n_valid.clamp(min=1)  # a mean over M values: negligible traffic
    return loss, lse, losses, n_valid


def cross_entropy_backward(
    grad: Tensor,
    logits: Tensor,
    targets: Tensor,
    lse: Tensor,
    n_valid: Tensor,
    ignore_index: int = -100,
    *,
    block_v: int | None = None,
    block_m: int | None = None,
) -> Tensor:
    """Launch the backward kernel: ``dlogits`` (M, V) in the logits' dtype.

    ``grad`` is the incoming gradient of the mean loss (a 0-d tensor); ``lse`` and ``n_valid``
    come from the forward.
    """
    check_kernel_inputs(logits, name="cross_entropy backward")
    logits = as_rows(logits)
    M, V = logits.shape
    targets = targets.contiguous()
    scale = (grad.float() / n_valid.clamp(min=1)).reshape(1)  # stays on the device
    dx = torch.empty(M, V, dtype=logits.dtype, device=logits.device)
    bv, bm, warps = _blocks(M, V, block_v, block_m)
    cross_entropy_bwd_kernel[(cdiv(M, bm),)](
        logits,
        targets,
        lse,
        scale,
        dx,
        M,
        V,
        ignore_index,
        BLOCK_M=bm,
        BLOCK_V=bv,
        num_warps=warps,
    )
    return dx


class CrossEntropyFunction(torch.autograd.Function):
    """Autograd wrapper: saves the logits, targets, per-row ``lse`` and the valid-row count."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
        loss, lse, _, n_valid = cross_entropy_forward(logits, targets, ignore_index)
        ctx.save_for_backward(logits, targets, lse, n_valid)
        ctx.ignore_index = ignore_index
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        logits, targets, lse, n_valid = ctx.saved_tensors
        dx = cross_entropy_backward(grad, logits, targets, lse, n_valid, ctx.ignore_index)
        return dx, None, None


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy of (M, V) logits against (M,) targets, differentiable.

    Like ``F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)``, but the logits
    stay in their dtype (float32, bfloat16 or float16; math in float32) and neither a float32
    copy nor the softmax is ever written to memory. Returns a 0-d float32 loss; 0 (not NaN) if
    every target is ``ignore_index``.
    """
    return CrossEntropyFunction.apply(logits, targets, ignore_index)
