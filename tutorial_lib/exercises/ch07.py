"""Exercise 7.1: a fused bias + GELU kernel in Triton, checked against
``kernels.bias_gelu_reference`` (on the CPU it runs in Triton's interpreter, so shapes are tiny)."""

from __future__ import annotations

import torch

from ..kernels.bias_gelu import bias_gelu_reference
from ..kernels.runtime import interpreter_mode, triton_status
from .base import Case, Exercise

STUB = '''\
import torch

from tutorial_lib.kernels.runtime import tl, triton  # Triton, or a stand-in


@triton.jit
def bias_gelu_kernel(x_ptr, bias_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    # One program per row of x (M, N): y[row] = GELU(x[row] + bias).
    # row = tl.program_id(0); cols = tl.arange(0, BLOCK_N); mask = cols < N
    # Load x[row, cols] and bias[cols] (masked) as float32 and add them:
    # GELU(h) = 0.5 h (1 + tanh(u)), u = sqrt(2 / pi) (h + 0.044715 h^3),
    # tanh(u) = 1 - 2 / (1 + exp(2 u)). Store y[row, cols] as y's dtype.
    pass


def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU_tanh(x + bias) with one launch of bias_gelu_kernel.

    x: (M, N) contiguous; bias: (N,). Returns a new (M, N) tensor of
    x's dtype, computed in float32 inside the kernel.
    """
    y = torch.empty_like(x)
    M, N = x.shape
    raise NotImplementedError  # write the kernel, then delete this line
    grid = (M,)
    bias_gelu_kernel[grid](x, bias, y, N, BLOCK_N=triton.next_power_of_2(N))
    return y
'''

TASK = (
    "Write the kernel: each program loads one row of `x` and the bias once, adds them, applies "
    "GPT-2's tanh GELU in float32 registers and stores the row once, so `x + bias` never makes "
    "a round trip through memory. The launcher is written for you: delete its `raise` line "
    'when the kernel is done; the result must match `F.gelu(x + bias, approximate="tanh")`. '
    "On a CPU the kernel runs in Triton's interpreter, slowly, so the checked shapes are small."
)


def _device() -> torch.device:
    return torch.device("cpu" if interpreter_mode() else "cuda")


def _unavailable() -> str | None:
    ok, reason = triton_status()
    return None if ok else reason


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(606)
    out = []
    for m, n, dtype in [(3, 37, torch.float32), (2, 130, torch.float32), (4, 8, torch.float16)]:
        x = (torch.randn(m, n, generator=g) * 3).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype)
        label = f"x of shape ({m}, {n}), {str(dtype).removeprefix('torch.')}"
        out.append(Case(label, {"x": x.to(_device()), "bias": bias.to(_device())}))
    return out


EXERCISES = [
    Exercise(
        id="7.1",
        title="a fused bias + GELU kernel in Triton",
        function="fused_bias_gelu",
        signature="fused_bias_gelu(x: Tensor (M, N), bias: Tensor (N,)) -> Tensor (M, N)",
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=bias_gelu_reference,
        reference_name="tutorial_lib.kernels.bias_gelu_reference",
        unavailable=_unavailable,
    )
]
