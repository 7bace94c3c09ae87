"""Attention, measured: peak memory as the sequence grows, and PyTorch's attention backends.

``attention_memory(lengths, ...)``: for each T, the most bytes of tensors one forward and backward
pass holds at once (``perf.tensor_peak_bytes``), for the naive three-step attention, PyTorch's
``scaled_dot_product_attention`` and our Triton FlashAttention (``kernels.attention``). Counted
from the tensors themselves, so the same measurement on a CPU and a GPU.

``sdpa_backend_rows(...)``: one causal forward and backward pass per backend of
``torch.nn.attention.sdpa_kernel`` (math, memory-efficient, flash, cuDNN), timed, with its
throughput over the causal FLOPs; a backend that cannot run here gets a ``skipped`` row with
PyTorch's own reason.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..kernels.attention import attention_reference, flash_attention
from ..perf import benchmark, tensor_peak_bytes

__all__ = [
    "ATTENTION_KINDS",
    "attention_memory",
    "causal_attention_flops",
    "sdpa_backend_rows",
]

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ATTENTION_KINDS: dict[str, AttentionFn] = {
    "naive": attention_reference,
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "ours (Triton)": flash_attention,
}


_CUDA_ONLY = {"memory-efficient": "xFormers' kernel", "cuDNN": "NVIDIA's cuDNN library"}


def _qkv(
    batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype, device: Any
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seq)
    shape = (batch, heads, seq, head_dim)
    return [
        torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()
        for _ in range(3)
    ]


def attention_memory(
    lengths: Sequence[int],
    heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_len: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{"kind", "seq", "peak_bytes", "qkv_bytes"}`` for each of ``ATTENTION_KINDS``: one
    causal forward and backward pass (batch 1), its peak above the inputs. ``max_len[kind]``:
    the longest T to run that kind at (our kernel in Triton's interpreter is slow)."""
    rows = []
    for kind, attend in ATTENTION_KINDS.items():
        for seq in lengths:
            if max_len is not None and seq > max_len.get(kind, seq):
                continue
            q, k, v = _qkv(1, heads, seq, head_dim, dtype, device)

            def step(
                q: torch.Tensor = q,
                k: torch.Tensor = k,
                v: torch.Tensor = v,
                attend: AttentionFn = attend,
            ) -> None:
                attend(q, k, v).sum().backward()

            rows.append({
                "kind": kind, "seq": seq, "peak_bytes": tensor_peak_bytes(step),
                "qkv_bytes": 3 * q.numel() * q.element_size(),
            })  # fmt: skip
    return rows


def causal_attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """Forward + backward FLOPs of causal attention as MFU counts them (backward = 2 forwards):
    3 x (Q K^T and P V over the kept scores), 3 x 2 x 2 B H D T(T + 1)/2."""
    return 3.0 * 2 * 2 * batch * heads * head_dim * seq * (seq + 1) / 2


def sdpa_backend_rows(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    iters: int = 10,
) -> list[dict[str, Any]]:
    """One row per SDPA backend: ``backend``, ``time_ms`` (median forward + backward),
    ``tflops`` (``causal_attention_flops`` over that time), or ``skipped`` with the reason."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "math": SDPBackend.MATH,
        "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cuDNN": SDPBackend.CUDNN_ATTENTION,
    }
    q, k, v = _qkv(batch, heads, seq, head_dim, dtype, device)
    flops = causal_attention_flops(batch, heads, seq, head_dim)
    rows: list[dict[str, Any]] = []
    for name, backend in backends.items():
        row: dict[str, Any] = {"backend": name, "shape": f"B{batch} H{heads} T{seq} D{head_dim}"}

        def step(backend: Any = backend) -> None:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                step()
            except RuntimeError as err:
                why = [str(w.message).splitlines()[0] for w in caught] or [str(err)]
                if torch.device(device).type != "cuda" and name in _CUDA_ONLY:
                    why = [f"PyTorch has this backend for CUDA GPUs only ({_CUDA_ONLY[name]})"]
                rows.append({**row, "skipped": "; ".join(dict.fromkeys(why))})
                continue
        rows.append({**row, **_timed(step, flops, iters, device)})
    row = {"backend": "ours (Triton)", "shape": rows[0]["shape"]}
    if torch.device(device).type != "cuda":
        rows.append({**row, "skipped": "runs in Triton's interpreter here: checked, not timed"})
    else:

        def ours() -> None:
            flash_attention(q, k, v).sum().backward()

        rows.append({**row, **_timed(ours, flops, iters, device)})
    return rows


def _timed(
    step: Callable[[], None], flops: float, iters: int, device: torch.device | str
) -> dict[str, float]:
    seconds = benchmark(step, warmup=1, iters=iters, device=device).median
    tflops = round(flops / seconds / 1e12, 4) if seconds > 0 else math.nan
    return {"time_ms": round(seconds * 1e3, 3), "tflops": tflops}
