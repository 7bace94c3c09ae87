"""Quantizers for the FP8 (and FP4) recipes, one call away: ``get_quantizer(recipe, role)``.

    q = get_quantizer("block", "weight").quantize(w)     # 128x128 tiles, E4M3
    q.data, q.scale_inv, q.dequantize()

Recipes (our short name, or TE's recipe class name):

    "delayed"  DelayedScaling        per tensor, a given scale (the module's history makes it)
    "current"  Float8CurrentScaling  per tensor, from this tensor's amax
    "block"    Float8BlockScaling    1x128 tiles (input, grad_output), 128x128 (weight)
    "mxfp8"    MXFP8BlockScaling     1x32 blocks, E8M0 power-of-two scales
    "nvfp4"    NVFP4BlockScaling     E2M1, 1x16 blocks (16x16 weights) with E4M3 scales + FP32
    "rowwise"  (torchao)             one scale per row, for torch._scaled_mm rowwise

Roles: "input", "weight", "grad_output". Each quantizer is a frozen dataclass whose fields
carry TE's defaults (forward format, backward format, tiles, power-of-two scales); keyword
options of ``get_quantizer`` override them. Modules: ``base`` (``QuantizedTensor``, tiles, TE's
scale-from-amax rule), ``per_tensor``, ``block``, ``nvfp4`` and ``fp4`` (E2M1 codes,
the Hadamard matrix). ``FP8Linear`` trains with them through the recipes of ``fp8.recipes``
(``linear_function``); under delayed scaling the cast is ``DelayedQuantizer``'s with the
layer's own scale (``delayed_state``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import QuantizedTensor, Quantizer
from .block import BlockQuantizer, MXFP8Quantizer
from .nvfp4 import NVFP4Quantizer
from .per_tensor import CurrentQuantizer, DelayedQuantizer, RowwiseQuantizer

__all__ = [
    "QUANTIZERS",
    "get_quantizer",
    "QuantizedTensor",
    "Quantizer",
    "DelayedQuantizer",
    "CurrentQuantizer",
    "BlockQuantizer",
    "MXFP8Quantizer",
    "NVFP4Quantizer",
    "RowwiseQuantizer",
]

QUANTIZERS: dict[str, type[Quantizer]] = {
    cls.recipe: cls
    for cls in (
        DelayedQuantizer,
        CurrentQuantizer,
        BlockQuantizer,
        MXFP8Quantizer,
        NVFP4Quantizer,
        RowwiseQuantizer,
    )
}
_TE_NAMES = {cls.te_name: name for name, cls in QUANTIZERS.items() if cls.te_name}


def get_quantizer(recipe: str, role: str, **options: Any) -> Quantizer:
    """The quantizer of ``recipe`` for the GEMM operand ``role``.

    recipe: "delayed", "current", "block", "mxfp8", "nvfp4", "rowwise", or TE's class name
        ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
        "NVFP4BlockScaling").
    role: "input", "weight" or "grad_output".
    options: fields of the quantizer (``scale=`` for delayed, ``power_2_scale=``,
        ``amax_epsilon=``, ``fp8_format=``, ``block_scaling_dim=``, ``block_2d=``, ``rht=``,
        ``stochastic_rounding=``, ``generator=``), each documented on its class.
    Unknown recipes, roles or options raise an error that lists the valid ones.
    """
    name = _TE_NAMES.get(recipe, recipe) if isinstance(recipe, str) else recipe
    cls = QUANTIZERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(
            f"Unknown FP8 recipe {recipe!r}. Choose one of {', '.join(map(repr, QUANTIZERS))} "
            f"(or TE's names {', '.join(map(repr, _TE_NAMES))})."
        )
    allowed = [f.name for f in dataclasses.fields(cls) if f.name != "role"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"{cls.__name__} has no option {', '.join(map(repr, unknown))}; its options are "
            f"{', '.join(map(repr, allowed)) or 'none'}."
        )
    return cls(role=role, **options)
