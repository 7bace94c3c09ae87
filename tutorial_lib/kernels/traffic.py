"""How many bytes each kernel must move through HBM, so we can judge a measured time.

These kernels do a handful of FLOPs per byte, far below Hopper's ridge point (hundreds of
FLOPs per byte), so they are memory-bound: the best possible time is ``bytes / bandwidth``.
Count the bytes first, measure second, and report the fraction of the datasheet bandwidth.

Counting assumptions (the same for every function below):

* the *minimum* traffic: every input read from HBM exactly once and every output written
  exactly once (caches hold nothing between kernels, nothing is read twice);
* a tensor costs ``numel * itemsize``; index tensors (targets) are int64, statistics (mean,
  rstd, logsumexp, per-row loss) and LayerNorm's weight and bias (parameters) float32;
* implementation overheads are *not* counted: the float32 partial-sum buffers of the weight
  gradients (about ``2 * P * N * 4`` bytes for P programs, small next to M x N), the final
  mean of the per-row losses, dtype casts of the gradient in ``add_layer_norm``'s mixed-dtype
  case, and for the eager ("unfused") counts, the kernel launches themselves;
* ``M`` is the number of rows (tokens), ``N`` the row width (hidden size), ``V`` the vocabulary.
"""

from __future__ import annotations

import torch

F32, I64 = torch.float32, torch.int64


def _total(*terms: tuple[int, torch.dtype]) -> int:
    """Sum of ``count * itemsize`` over (element count, dtype) terms."""
    return sum(count * dtype.itemsize for count, dtype in terms)


def bias_gelu_bytes(M: int, N: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Fused bias + GELU. Forward: read x and bias, write y. Backward: read dy, x and bias,
    write dx and dbias (the bias in ``dtype``; without a bias, subtract ``N * itemsize``)."""
    if not backward:
        return _total((M * N, dtype), (N, dtype), (M * N, dtype))
    return _total((2 * M * N, dtype), (N, dtype), (M * N, dtype), (N, dtype))


def bias_gelu_unfused_bytes(M: int, N: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Eager PyTorch, two kernels. Forward: the add reads x and bias and writes h; GELU reads h
    and writes y (twice the fused M x N traffic). Backward: GELU's backward reads dy and h and
    writes dh (which is also dx); the bias gradient reads dh again and writes dbias."""
    if not backward:
        return _total((M * N, dtype), (N, dtype), (M * N, dtype)) + _total((2 * M * N, dtype))
    return _total((3 * M * N, dtype)) + _total((M * N, dtype), (N, dtype))


def layer_norm_bytes(M: int, N: int, dtype: torch.dtype, backward: bool = False) -> int:
    """LayerNorm with weight and bias. Forward: read x, weight, bias; write y, mean, rstd.
    Backward: read dy, x, weight, mean, rstd; write dx, dweight, dbias."""
    if not backward:
        return _total((2 * M * N, dtype), (2 * N, F32), (2 * M, F32))
    return _total((3 * M * N, dtype), (N, F32), (2 * M, F32), (2 * N, F32))


def add_layer_norm_bytes(M: int, N: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Fused ``s = x + residual; y = LayerNorm(s)`` (x, residual, s, y all in ``dtype``).
    Forward: read x, residual, weight, bias; write s, y, mean, rstd. Backward: read dy, ds, s,
    weight, mean, rstd; write one ds_total (it is both dx and dresidual), dweight, dbias."""
    if not backward:
        return _total((4 * M * N, dtype), (2 * N, F32), (2 * M, F32))
    return _total((4 * M * N, dtype), (N, F32), (2 * M, F32), (2 * N, F32))


def add_layer_norm_unfused_bytes(M: int, N: int, dtype: torch.dtype) -> int:
    """Eager forward: the add reads x and residual and writes s, then LayerNorm reads s back
    (``5 M N`` element moves against the fused ``4 M N``)."""
    return _total((3 * M * N, dtype)) + layer_norm_bytes(M, N, dtype)


def softmax_bytes(M: int, N: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Row softmax. Forward: read x, write y. Backward: read dy and y, write dx."""
    return _total(((3 if backward else 2) * M * N, dtype))


def cross_entropy_bytes(M: int, V: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Fused cross-entropy on (M, V) logits. Forward: read the logits and targets, write the
    per-row logsumexp and loss. Backward: read logits, targets and logsumexp, write dlogits."""
    if not backward:
        return _total((M * V, dtype), (M, I64), (2 * M, F32))
    return _total((2 * M * V, dtype), (M, I64), (M, F32))


def cross_entropy_unfused_bytes(M: int, V: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Eager ``F.cross_entropy(logits.float(), targets)``. Forward: the cast reads the logits and
    writes a float32 copy (skipped for float32 logits); log_softmax reads it and writes float32
    log-probabilities; the NLL gathers one value per row (with the targets). Backward: the NLL
    backward writes a float32 (M, V) gradient; log_softmax's backward reads it and the
    log-probabilities and writes another; the cast's backward reads that and writes dlogits."""
    cast = dtype != F32
    if not backward:
        copy = _total((M * V, dtype), (M * V, F32)) if cast else 0
        return copy + _total((2 * M * V, F32), (M, I64), (M, F32))
    cast_back = _total((M * V, F32), (M * V, dtype)) if cast else 0
    return _total((M, I64), (M * V, F32), (3 * M * V, F32)) + cast_back
