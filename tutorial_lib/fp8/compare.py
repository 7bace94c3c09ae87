"""Comparing the recipes on the same tensors and the same run: quantization error, storage, and
training loss (the chapter "FP8 recipes compared").

    quant_error(x, q)            error, SNR, underflow and clipping of one quantized tensor
    compare_recipes(tensors)     every recipe x every captured tensor, as rows
    quantized_bytes(q)           bytes of a quantized tensor's payload and scales

The training runs the chapter compares come from ``bench.recipe_runs``.
Delayed scaling needs a scale chosen before the tensor is seen: ``compare_recipes`` takes it
from ``previous`` (the same tensors one or more steps earlier, TE's amax history with the
``"max"`` rule), or, without it, from the tensor itself (then it equals current scaling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .quantizers import QuantizedTensor, get_quantizer
from .quantizers.base import as_matrix, tensor_amax
from .recipes import make_recipe
from .scaling import Format
from .stats import scale_for

__all__ = [
    "COMPARED_RECIPES",
    "VARIANTS",
    "quant_error",
    "quantized_bytes",
    "compare_recipes",
]

COMPARED_RECIPES = ("delayed", "current", "rowwise", "block", "mxfp8", "nvfp4")
# Controls that change one setting of a recipe: current scaling with E4M3 gradients separates
# the effect of the gradient format (HYBRID's E5M2) from that of the scale granularity.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "current-e4m3": ("current", {"fp8_format": Format.E4M3}),
}
_FORMAT_MAX = {"E4M3": 448.0, "E5M2": 57344.0, "E2M1": 6.0}
_FORMAT_BITS = {"E4M3": 8, "E5M2": 8, "E2M1": 4}


def _tile_limit(q: QuantizedTensor) -> torch.Tensor:
    """Per element, the largest magnitude its tile can hold: format max times the tile's
    dequantization scale (times NVFP4's tensor scale)."""
    limit = q.tile_scales().expand(as_matrix(q.data).shape)
    if q.tensor_scale_inv is not None:
        limit = limit * q.tensor_scale_inv
    return limit * _FORMAT_MAX[q.fmt]


def quant_error(x: torch.Tensor, q: QuantizedTensor) -> dict[str, float]:
    """How well ``q`` represents ``x`` (finite elements only), in float64:
    rel_rmse: ``||x - deq|| / ||x||``; snr_db: ``10 log10(sum x^2 / sum (x - deq)^2)``, which
    the largest values dominate; row_snr_db: the median over rows of each row's SNR, the typical
    token's (rows without error count as 200 dB);
    underflow: fraction of nonzero elements that came back as zero;
    clipped: fraction of elements larger than their tile can hold (saturated to the max)."""
    if q.rht:
        raise ValueError("quant_error: pass a row-wise copy (no Hadamard transform).")
    xm = as_matrix(x).to(torch.float64)
    deq = as_matrix(q.dequantize(torch.float64))
    finite = torch.isfinite(xm)
    xf, df = xm[finite], deq[finite]
    err = (xf - df).square().sum()
    signal = xf.square().sum()
    nonzero = xf != 0
    limit = _tile_limit(q).to(torch.float64)[finite]
    diff = torch.where(finite, xm - deq, 0.0)
    row_signal = torch.where(finite, xm, 0.0).square().sum(1)
    row_err = diff.square().sum(1)
    live = row_signal > 0
    row_snr = 10 * torch.log10(row_signal[live] / row_err[live].clamp(min=row_signal[live] * 1e-20))
    return {
        "row_snr_db": float(row_snr.median()) if row_snr.numel() else math.inf,
        "rel_rmse": float(err.sqrt() / signal.sqrt()) if signal > 0 else 0.0,
        "snr_db": float(10 * torch.log10(signal / err)) if err > 0 else math.inf,
        "underflow": float((nonzero & (df == 0)).sum() / max(int(nonzero.sum()), 1)),
        "clipped": float((xf.abs() > limit * (1 + 1e-6)).sum() / max(xf.numel(), 1)),
    }


def quantized_bytes(q: QuantizedTensor) -> dict[str, int]:
    """Storage of ``q`` as the GPU keeps it: the payload (FP4 packed two per byte) and the
    scales (float32 per-tensor/row/tile scales: 4 bytes; E8M0 and E4M3 scales: 1 byte; NVFP4's
    tensor scale: 4 bytes)."""
    payload = math.ceil(q.data.numel() * _FORMAT_BITS[q.fmt] / 8)
    scales = q.scale_inv.numel() * q.scale_inv.element_size()
    if q.tensor_scale_inv is not None:
        scales += 4
    return {"payload": payload, "scales": scales, "total": payload + scales}


def _quantizer(
    recipe: str, role: str, delayed_amax: torch.Tensor, generator: torch.Generator
) -> Any:
    """The row-wise quantizer ``role`` gets in training under ``recipe`` (a name, or a label of
    ``VARIANTS``); delayed scaling with the scale from ``delayed_amax``."""
    if recipe == "delayed":
        fmt = Format.HYBRID.bwd if role == "grad_output" else Format.HYBRID.fwd
        return get_quantizer("delayed", role, scale=scale_for(float(delayed_amax), fmt))
    name, options = VARIANTS.get(recipe, (recipe, {}))
    return make_recipe(name, **options).quantizer(role, False, generator)


def compare_recipes(
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    recipes: Sequence[str] = COMPARED_RECIPES,
    previous: Sequence[Mapping[str, Mapping[str, torch.Tensor]]] = (),
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (layer, role, recipe) of ``tensors`` (``fp8.capture_gemm_tensors``' result):
    layer, role, recipe, the ``quant_error`` fields and the bytes per element stored.
    Each tensor is quantized as training quantizes it for the forward GEMM (or, for gradients,
    the dgrad GEMM): the recipe's row-wise quantizer, with its defaults (HYBRID: E5M2 gradients
    for delayed and current scaling; E4M3 for the others; NVFP4's gradients rounded
    stochastically, from a generator seeded with ``seed``). ``recipes`` may name ``VARIANTS``.
    ``previous``: earlier captures of the same layers; delayed scaling uses the largest amax
    among them (TE's ``"max"`` over its history), else this tensor's own."""
    rows: list[dict[str, Any]] = []
    for layer, slots in tensors.items():
        for role, x in slots.items():
            history = [tensor_amax(p[layer][role]) for p in previous if layer in p]
            delayed_amax = torch.stack(history).max() if history else tensor_amax(x)
            for recipe in recipes:
                gen = torch.Generator().manual_seed(seed)  # NVFP4's stochastic rounding
                q = _quantizer(recipe, role, delayed_amax, gen).quantize(x)
                size = quantized_bytes(q)
                rows.append(
                    {
                        "layer": layer,
                        "role": role,
                        "recipe": recipe,
                        **quant_error(x, q),
                        "bytes_per_element": size["total"] / max(x.numel(), 1),
                    }
                )
    return rows
