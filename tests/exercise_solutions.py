"""Worked solutions of the exercises in which the reader writes code.

Each solution is a section that starts with a ``# Exercise N.1`` line; ``solution_source("N.1")``
returns that section's text (for a notebook's hidden answer) and ``solution("N.1")`` the
function, which ``test_exercise_checks.py`` passes through ``check``. Each chapter's solution
cell in ``book/exercises/`` shows its section (a test checks they are the same), so the
answers live here, with the tests, and not in the package the reader imports. Lines stay under
80 characters: they are shown in a notebook. Each section runs with only its stub's imports (a
test checks), so it may leave an argument unannotated where the stub does.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tutorial_lib.kernels.runtime import tl, triton

__all__ = ["solution", "solution_source"]


# Exercise 1.1: causal self-attention by hand
def causal_self_attention(attn, x: torch.Tensor) -> torch.Tensor:
    B, T, C = x.shape
    hs = attn.head_dim
    q, k, v = attn.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
    # (B, T, C) -> (B, nh, T, hs)
    q, k, v = (t.view(B, T, C // hs, hs).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = scores.softmax(dim=-1) @ v  # (B, nh, T, hs)
    y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
    return attn.proj(y)


# Exercise 2.1: the roofline time of a GEMM
def gemm_roofline(
    m: int,
    n: int,
    k: int,
    dtype_bytes: int,
    peak_flops: float,
    bandwidth: float,
) -> tuple[float, str]:
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * dtype_bytes
    compute_s, memory_s = flops / peak_flops, nbytes / bandwidth
    bound = "compute" if compute_s > memory_s else "memory"
    return max(compute_s, memory_s), bound


# Exercise 3.1: round FP32 to BF16
def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    # int64, so that the carry of the rounding can never overflow
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (bits >> 16) & 1  # the lowest bit we keep: ties go to even
    top = ((bits + 0x7FFF + lsb) >> 16) & 0xFFFF
    top = torch.where(torch.isnan(x), (bits >> 16) | 0x0040, top)  # quiet NaN
    signed = torch.where(top >= 0x8000, top - 0x10000, top)  # fits int16
    return signed.to(torch.int16).view(torch.bfloat16)


# Exercise 4.1: an E4M3 quantizer with scale and saturation
def quantize_e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    y = x.to(torch.float32) * torch.tensor(scale, dtype=torch.float32)
    a = y.abs().clamp(max=448.0)  # saturate (inf too); NaN passes
    binade = torch.frexp(a).exponent - 1  # a = 1.f * 2**binade
    step = torch.exp2((binade.clamp(min=-6) - 3).to(torch.float32))
    q = torch.round(a / step) * step  # round half to even
    return torch.where(torch.isnan(y), y, torch.copysign(q, y))


# Exercise 5.1: the amax-history roll and scale update
def delayed_scaling_update(
    amax_history: torch.Tensor,
    scale: torch.Tensor,
    fp8_max: float,
    margin: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    current = amax_history[0]
    window = torch.cat([amax_history[1:], current[None]])  # (L, n)
    amax = window.amax(dim=0)
    rolled = torch.cat([torch.zeros_like(current)[None], window[1:]])
    seen = current != 0
    new_history = torch.where(seen, rolled, amax_history)
    scaled_max = torch.tensor(fp8_max * 2.0**-margin, dtype=torch.float32)
    safe_amax = torch.where(seen, amax, torch.ones_like(amax))
    new_scale = torch.where(seen, scaled_max / safe_amax, scale)
    return new_history, new_scale


# Exercise 6.1: a 1x128 block quantizer
def block_quantize_1x128(
    x: torch.Tensor, fp8_max: float = 448.0
) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.reshape(-1, x.shape[-1]).to(torch.float32)  # (rows, cols)
    rows, cols = m.shape
    n_tiles = -(-cols // 128)  # ceil(cols / 128)
    # pad the last tile with zeros: they never change an amax
    padded = torch.nn.functional.pad(m, (0, n_tiles * 128 - cols))
    tiles = padded.reshape(rows, n_tiles, 128)
    amax = tiles.abs().amax(dim=2)  # (rows, n_tiles)
    scale = torch.full_like(amax, fp8_max) / amax  # float32 division
    bits = scale.view(torch.int32) & -(1 << 23)  # clear the mantissa
    scale = torch.where(amax == 0, 1.0, bits.view(torch.float32))
    y = (tiles * scale[..., None]).clamp(-fp8_max, fp8_max)
    data = y.reshape(rows, -1)[:, :cols].to(torch.float8_e4m3fn)
    return data.reshape(x.shape), 1.0 / scale


# Exercise 7.1: a fused bias + GELU kernel in Triton
@triton.jit
def bias_gelu_kernel(
    x_ptr,
    bias_ptr,
    y_ptr,
    N,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * N + cols
    h = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    h += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
    tanh_u = 1.0 - 2.0 / (1.0 + tl.exp(2.0 * u))
    y = 0.5 * h * (1.0 + tanh_u)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    M, N = x.shape
    grid = (M,)
    bias_gelu_kernel[grid](x, bias, y, N, BLOCK_N=triton.next_power_of_2(N))
    return y


# Exercise 8.1: MFU from a step time
def mfu_from_step(
    cfg,
    batch_size: int,
    step_seconds: float,
    peak_flops: float,
) -> float:
    L, C, T, V = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    n_params = 12 * L * C**2 + V * C  # matmul weights, LM head included
    flops_per_token = 6 * n_params + 12 * L * T * C
    tokens_per_s = batch_size * T / step_seconds
    return tokens_per_s * flops_per_token / peak_flops


# Exercise 9.1: ZeRO's memory per data-parallel rank
def bytes_per_rank(
    n_params: int,
    dp: int,
    stage: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optim_bytes: int = 8,
) -> tuple[float, float, float]:
    full = (
        n_params * param_bytes,
        n_params * grad_bytes,
        n_params * optim_bytes,
    )
    # which of the three are split over the ranks at this stage
    split = (stage >= 3, stage >= 2, stage >= 1)
    held = []
    for total, is_split in zip(full, split, strict=True):
        held.append(total / dp if is_split else float(total))
    params, grads, optim = held
    return params, grads, optim


# Exercise 10.1: a column-parallel linear layer, uneven shards
def column_parallel_forward(
    x: torch.Tensor,
    linear: nn.Linear,
    t: int,
) -> list[torch.Tensor]:
    n_out = linear.out_features
    base, extra = divmod(n_out, t)
    outputs, start = [], 0
    for r in range(t):
        rows = slice(start, start + base + (1 if r < extra else 0))
        b = None if linear.bias is None else linear.bias[rows]
        outputs.append(nn.functional.linear(x, linear.weight[rows], b))
        start = rows.stop
    return outputs


# Exercise 11.1: how likely a replica survives random failures
def replica_survival(
    n_gpus: int,
    gpus_per_replica: int,
    n_failed: int,
) -> float:
    from math import comb

    outside = n_gpus - gpus_per_replica  # GPUs that are not in the replica
    return comb(outside, n_failed) / comb(n_gpus, n_failed)


# ---- lookup (not part of any solution) -------------------------------------------------------
_SOLUTIONS: dict[str, Callable[..., Any]] = {
    "1.1": causal_self_attention,
    "2.1": gemm_roofline,
    "3.1": round_to_bf16,
    "4.1": quantize_e4m3,
    "5.1": delayed_scaling_update,
    "6.1": block_quantize_1x128,
    "7.1": fused_bias_gelu,
    "8.1": mfu_from_step,
    "9.1": bytes_per_rank,
    "10.1": column_parallel_forward,
    "11.1": replica_survival,
}


def solution(exercise_id: str) -> Callable[..., Any]:
    """The worked solution's function for an exercise id ("4.1")."""
    try:
        return _SOLUTIONS[exercise_id]
    except KeyError:
        raise KeyError(f"No solution for {exercise_id!r}; have {', '.join(_SOLUTIONS)}.") from None


def solution_source(exercise_id: str) -> str:
    """The source of a solution: its section of this file, from the ``# Exercise`` line on."""
    solution(exercise_id)  # a clear KeyError for an unknown id
    text = inspect.getsource(inspect.getmodule(solution) or solution)
    start = text.index(f"# Exercise {exercise_id}:")
    ends = [text.find(mark, start + 1) for mark in ("\n# Exercise ", "\n# ---- lookup")]
    end = min(e for e in ends if e != -1)
    return text[start:end].strip() + "\n"
