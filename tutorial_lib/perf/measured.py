"""Statements about speed that come from a measurement on the machine in front of the reader.

The book never asserts how fast BF16 is on "a CPU": CPUs differ (one without BF16 matrix
instructions runs BF16 GEMMs tens of times slower than FP32; one with AMX runs them several
times faster). A chapter measures, then prints what it measured with these helpers:

    rates = measure_gemm_rates(512, ("fp32", "bf16"))
    print(rates.compare("bf16", "fp32"))
    # BF16 ran 4.5x faster than FP32 on this CPU (Intel Xeon ...; BF16 matrix instructions: ...)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..hardware import default_device, describe_device
from .timing import benchmark

__all__ = ["GemmRates", "compare_times", "measure_gemm_rates", "on_this_device", "NOISE"]

NOISE = 0.10  # below a 10% difference, one short measurement cannot tell two speeds apart
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compare_times(name_a: str, seconds_a: float, name_b: str, seconds_b: float, where: str) -> str:
    """One sentence comparing two measured times of the same work: "A ran 4.5x faster than B
    {where}", "... slower ...", or, within ``NOISE``, "A and B ran within 10% of each other"."""
    if seconds_a <= 0 or seconds_b <= 0:
        raise ValueError(f"times must be positive, got {seconds_a} and {seconds_b} seconds")
    ratio = seconds_b / seconds_a  # > 1: A is faster
    if ratio > 1 + NOISE:
        return f"{name_a} ran {ratio:.1f}x faster than {name_b} {where}"
    if ratio < 1 / (1 + NOISE):
        return f"{name_a} ran {1 / ratio:.1f}x slower than {name_b} {where}"
    return f"{name_a} and {name_b} ran within {NOISE:.0%} of each other {where}"


@dataclass(frozen=True)
class GemmRates:
    """Measured n x n x n GEMM times per math (``"fp32"``, ``"bf16"``) on one device.

    ``where`` names the device and what was detected about it, e.g. "on this CPU (AMD EPYC;
    BF16 matrix instructions: none detected)".
    """

    n: int
    seconds: dict[str, float]
    where: str

    def gflops(self, math: str) -> float:
        return 2.0 * self.n**3 / self.seconds[math] / 1e9

    def compare(self, a: str, b: str) -> str:
        """ "BF16 ran 4.5x faster than FP32 on this CPU (...)", from the two measured times."""
        return compare_times(a.upper(), self.seconds[a], b.upper(), self.seconds[b], self.where)

    def table(self) -> str:
        lines = [f"{self.n}x{self.n}x{self.n} GEMM {self.where}:"]
        for math, t in self.seconds.items():
            lines.append(
                f"  {math.upper():5s} {t * 1e3:10.3f} ms  {self.gflops(math):10.1f} "
                f"GFLOP/s  ({str(_DTYPES[math]).removeprefix('torch.')} matmul)"
            )
        return "\n".join(lines)


def on_this_device(device: torch.device | str | None = None) -> str:
    """ "on this CPU (AMD EPYC; BF16 matrix instructions: none detected)", or "on this GPU (...)":
    the words a measured statement ends with, naming what was detected."""
    info = describe_device(device)
    if info.cpu is not None:
        bf16 = ", ".join(f for f in info.cpu.features if "BF16" in f) or "none detected"
        return f"on this CPU ({info.name}; BF16 matrix instructions: {bf16})"
    return f"on this GPU ({info.name})"


def measure_gemm_rates(
    n: int = 512,
    maths: Sequence[str] = ("fp32", "bf16"),
    device: torch.device | str | None = None,
    iters: int = 3,
) -> GemmRates:
    """Time an n x n x n GEMM in each of ``maths`` on ``device`` (median of ``iters`` after one
    warm-up; operands made before timing)."""
    if n < 1 or iters < 1:
        raise ValueError(f"need n >= 1 and iters >= 1, got n={n}, iters={iters}")
    device = default_device(device)
    seconds: dict[str, float] = {}
    gen = torch.Generator(device=device).manual_seed(0)
    for math in maths:
        if math not in _DTYPES:
            raise ValueError(f"unknown math {math!r}; choose from {sorted(_DTYPES)}")
        a, b = (torch.randn(n, n, generator=gen, device=device).to(_DTYPES[math]) for _ in range(2))
        gemm = functools.partial(torch.matmul, a, b)
        seconds[math] = benchmark(gemm, warmup=1, iters=iters, device=device).median
    return GemmRates(n=n, seconds=seconds, where=on_this_device(device))
