"""Throughput and model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s / the device's peak FLOP/s for the dtype the math runs in.
"Model FLOPs" count only the useful matmuls of forward and backward (``GPT.flops_per_token``,
from the formulas of ``tutorial_lib.flops``), not recomputation; with recomputation counted it would be *hardware* FLOPs utilisation (HFU).
MFU is ``None`` when the device is not in the spec table: we never invent a peak.
"""

from __future__ import annotations

from ..hardware import DeviceSpec

__all__ = ["mfu", "format_mfu"]


def mfu(
    tokens_per_s: float, flops_per_token: float, spec: DeviceSpec | None, dtype: str
) -> float | None:
    """Fraction of peak (0..1) achieved, or None if the device or dtype has no datasheet peak."""
    if spec is None:
        return None
    peak = spec.peak(dtype)
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / peak


def format_mfu(value: float | None) -> str:
    return "n/a (no datasheet peak for this device)" if value is None else f"{100 * value:.1f}%"
