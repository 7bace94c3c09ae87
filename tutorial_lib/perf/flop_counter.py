"""Counting FLOPs with PyTorch's own counter, to check the analytic formulas of
``tutorial_lib.flops`` (``GPT.flops_per_token``; ``tests/test_flops.py``).

``torch.utils.flop_counter.FlopCounterMode`` intercepts every aten op and adds a formula's
count for matmul-like ops (mm, addmm, bmm, convolutions, attention kernels); elementwise ops,
softmax and reductions count as zero, exactly like the "model FLOPs" of MFU.

Two facts about attention that the counts below depend on:
    - On the CPU, ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_
      for_cpu``, which torch 2.13's counter has no formula for: it would count attention as 0.
      ``flops_by_op`` adds the same formulas torch uses for the CUDA flash/efficient kernels.
    - Those formulas count a flash backward as 5 matmuls (it *recomputes* Q K^T), so one
      layer's forward + backward attention counts 14 B nh T^2 hs, not 3 x 4 = 12. The extra
      2 B T^2 C per layer is recomputation: hardware FLOPs, not model FLOPs.
``train_step_flops`` therefore runs attention on the "math" backend (plain batched matmuls,
no recomputation), where the count equals ``3 * B * T * GPT.flops_per_token(training=False)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["flops_by_op", "train_step_flops"]


def _sdpa_forward_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """Q K^T and P V over the full s_q x s_k matrix (a causal mask is not subtracted)."""
    b, h, s_q, d_qk = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * s_q * s_k * (d_qk + d_v)


def _sdpa_backward_flops(
    grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *a: Any, **k: Any
) -> int:
    """Recompute Q K^T; dP = dO V^T and dV = P^T dO; dQ = dS K and dK = dS^T Q: 5 matmuls."""
    b, h, s_q, d_qk = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * s_q * s_k * (3 * d_qk + 2 * d_v)


def _cpu_attention_mapping() -> dict[Any, Callable[..., int]]:
    """Formulas for the CPU flash-attention ops, where this torch's counter has none."""
    aten = torch.ops.aten
    pairs: list[tuple[str, Callable[..., int]]] = [
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa_forward_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward_flops),
    ]
    known = getattr(flop_counter, "flop_registry", {})
    return {
        getattr(aten, name): formula
        for name, formula in pairs
        if hasattr(aten, name) and getattr(aten, name) not in known
    }


def flops_by_op(fn: Callable[[], object]) -> dict[str, int]:
    """FLOPs per aten op (e.g. ``"aten.mm"``) while running ``fn()`` once; zero-count ops omitted.
    Their sum is the total ``FlopCounterMode`` counts (any attention backend)."""
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_mapping())
    with counter:
        fn()
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items() if n}


def train_step_flops(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """Model FLOPs of one training step: forward, ``loss.backward()``; gradients zeroed after.

    Attention runs on SDPA's math backend, so every matmul is counted once and none is
    recomputed: for ``GPT`` this equals ``3 * B * T * model.flops_per_token(False, T)``.
    The math backend materialises the (B, nh, T, T) scores: count on a small batch.
    """
    try:
        with sdpa_kernel(SDPBackend.MATH):
            return sum(flops_by_op(lambda: model(idx, targets)[1].backward()).values())
    finally:
        model.zero_grad(set_to_none=True)
