"""Exercise 2.1: the roofline time of a GEMM, checked against ``perf.roofline``."""

from __future__ import annotations

from typing import Any

from ..hardware import SPECS
from ..perf.roofline import Roof, gemm
from .base import Case, Exercise

STUB = '''\
def gemm_roofline(
    m: int,
    n: int,
    k: int,
    dtype_bytes: int,
    peak_flops: float,
    bandwidth: float,
) -> tuple[float, str]:
    """Roofline lower bound on the time of an (m, k) @ (k, n) GEMM.

    dtype_bytes: bytes per element of A, B and C (2 for BF16).
    peak_flops: FLOP/s; bandwidth: memory bytes/s.
    Returns (seconds, bound): bound is "compute" if the arithmetic
    takes strictly longer than the memory traffic, else "memory".
    """
    raise NotImplementedError
'''

TASK = (
    "Count the GEMM's FLOPs (one multiply and one add per term: 2mnk) and the least bytes it "
    "must move (read A and B once, write C once: (mk + kn + mn) elements of `dtype_bytes`). "
    "The op takes at least the longer of the two times, FLOPs / peak and bytes / bandwidth; "
    'return that time and which of the two it was ("compute" only when the FLOP time is '
    'strictly longer, else "memory").'
)


def _cases() -> list[Case]:
    out = []
    shapes = [
        ("H100 SXM", "bf16", 2, (4096, 4096, 4096), "a large square GEMM"),
        ("H100 SXM", "bf16", 2, (1, 4096, 4096), "a matrix-vector product (m = 1)"),
        ("H200", "fp8", 1, (8192, 128, 8192), "a skinny GEMM, FP8"),
        ("A100", "fp32", 4, (17, 333, 1025), "odd sizes, FP32"),
        ("H200", "bf16", 2, (512, 50304, 768), "a GPT-2 LM head, 512 tokens"),
    ]
    for device, dtype, nbytes, (m, n, k), what in shapes:
        spec = SPECS[device]
        peak = spec.peak(dtype)
        assert peak is not None
        args: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype_bytes": nbytes}
        args |= {"peak_flops": peak, "bandwidth": spec.hbm_bandwidth}
        out.append(Case(f"{what}: m, n, k = {m}, {n}, {k} on {device} ({dtype})", args))
    return out


def _reference(
    m: int, n: int, k: int, dtype_bytes: int, peak_flops: float, bandwidth: float
) -> tuple[float, str]:
    op = gemm(m, n, k, dtype_bytes)
    roof = Roof("exercise", peak_flops, bandwidth, "exercise 2.1")
    return roof.time(op), roof.bound(op)


EXERCISES = [
    Exercise(
        id="2.1",
        title="the roofline time of a GEMM",
        function="gemm_roofline",
        signature=(
            "gemm_roofline(m: int, n: int, k: int, dtype_bytes: int, peak_flops: float, "
            "bandwidth: float) -> tuple[float, str]"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="tutorial_lib.perf.roofline (gemm, Roof.time, Roof.bound)",
        outputs=("seconds", "bound"),
    )
]
