"""The tensor-parallel layers in FP8: the local GEMM of ``FP8Linear``, Megatron's collectives
around it unchanged.

    column   y_mine = FP8Linear(f(x))                  (f: ``copy_to_tp``)
    row      y = g(FP8Linear_no_bias(x_mine)) + b      (g: ``reduce_from_tp``; the bias once)

Both are ``FP8Linear`` subclasses with the local shapes (so every recipe, the scaling state,
checkpointed recompute and state dicts work as for one process) and the same Parameters and
parameter names as the ``ColumnParallelLinear``/``RowParallelLinear`` they replace
(``convert_to_fp8`` calls the layer's ``to_fp8``).

Scales and amaxes. Each rank quantizes its own tensors: the replicated input of a column layer,
its slice of a weight, its slice of a row layer's input and of a column layer's output gradient.
Under delayed scaling the amaxes are MAX-all-reduced over every process before each update (the
autocast's ``amax_reduction_group``, the world by default: TE's ``amax_reduction_group`` over the
data- and tensor-parallel ranks), so every rank holds the scales one process would hold, and a
TP run reproduces the single process up to float rounding. The recipes that scale from the tensor
at hand (current, rowwise, block, MXFP8, NVFP4) take the amax of the rank's own slice, as TE's
do without sequence parallelism: a slice's scale can be finer than the whole tensor's, so the
quantization differs a little from one process's (tested within the FP8 tolerance).

A known limit: NVFP4's stochastic rounding draws from a generator seeded by the layer's name, so
every TP rank draws the same stream for its own slice, and a checkpoint keeps rank 0's generator
state (the gathered format has one per layer). With uneven shards the ranks draw different
amounts, so a resumed NVFP4 run under uneven TP does not repeat the uninterrupted run's noise
exactly (its losses stay within the recipe's tolerance).
"""

from __future__ import annotations

from typing import Any

import torch

from ..fp8.linear import FP8Linear
from .comm import Group, column_input, row_bias, row_output
from .shard import UnitSpec

__all__ = [
    "FP8_VARIANTS",
    "FP8ColumnParallelLinear",
    "FP8RowParallelLinear",
    "fp8_parallel_linear",
]


class _FP8Sharded(FP8Linear):
    group: Group
    unit_spec: UnitSpec
    units: tuple[int, ...]
    total_units: int
    sequence_parallel: bool

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.unit_spec.axis}={self.units} (FP8, TP)"


class FP8ColumnParallelLinear(_FP8Sharded):
    """``ColumnParallelLinear`` with an FP8 GEMM: the output sharded over my units."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(column_input(x, self.group, self.sequence_parallel))


class FP8RowParallelLinear(_FP8Sharded):
    """``RowParallelLinear`` with an FP8 GEMM: partial sums all-reduced, then the full bias."""

    def _gemm_bias(self) -> torch.Tensor | None:
        return None  # added once, after the all-reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = row_output(super().forward(x), self.group, self.sequence_parallel)
        return row_bias(y, self.bias, self.group, self.sequence_parallel)


# The FP8 variant of each parallel layer (``tp_linear``'s classes, by name: ``to_fp8``).
FP8_VARIANTS: dict[str, type[_FP8Sharded]] = {
    "ColumnParallelLinear": FP8ColumnParallelLinear,
    "RowParallelLinear": FP8RowParallelLinear,
}


def fp8_parallel_linear(layer: Any, cls: type[_FP8Sharded], **fp8_kwargs: Any) -> _FP8Sharded:
    """``cls``, the FP8 variant of the column- or row-parallel ``layer``, holding its
    Parameters (no copy), its group and its units."""
    new = cls.from_linear(layer, **fp8_kwargs)  # the local shapes
    new.group, new.unit_spec = layer.group, layer.unit_spec
    new.units, new.total_units = layer.units, layer.total_units
    new.sequence_parallel = bool(getattr(layer, "sequence_parallel", False))
    return new
