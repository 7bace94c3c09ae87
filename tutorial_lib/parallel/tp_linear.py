"""Megatron's column- and row-parallel Linear layers, with uneven shards (the overview is
``parallel.tp_model``'s docstring).

``ColumnParallelLinear`` holds this rank's rows of the weight and multiplies ``f(x)``: its output
stays sharded. ``RowParallelLinear`` holds this rank's columns and sums the partial products with
``g``, then adds the replicated bias once. ``comm``'s ``column_input``, ``row_output`` and
``row_bias`` are that wiring (with its sequence-parallel form), shared with the FP8 variants of
``tp_fp8``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .comm import Group, column_input, row_bias, row_output
from .shard import UnitSpec, global_index

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]


class _ShardedLinear(nn.Module):
    """Shared parts: the units this rank owns along ``unit_spec.axis``, and their layout."""

    weight: nn.Parameter  # set by the subclasses: their shapes differ
    bias: nn.Parameter | None

    def __init__(self, unit_spec: UnitSpec, units: tuple[int, ...], total_units: int) -> None:
        super().__init__()
        self.unit_spec, self.units, self.total_units = unit_spec, tuple(units), total_units
        self.local_size = unit_spec.groups * len(self.units) * unit_spec.width

    def shard_index(self) -> torch.Tensor:
        """Indices (along ``unit_spec.dim``) of this shard's rows or columns in the full weight."""
        return global_index(self.unit_spec, self.units, self.total_units)

    def _check_full(self, full: int, what: str) -> None:
        spec = self.unit_spec
        if full != spec.groups * self.total_units * spec.width:
            raise ValueError(
                f"{type(self).__name__}: {what}={full} does not match the unit layout "
                f"({spec.groups} groups x {self.total_units} {spec.axis} x width {spec.width})."
            )

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.02)  # GPT-2's init, as GPT._init_weights
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def to_fp8(self, **fp8_kwargs: Any) -> nn.Module:
        """This layer's FP8 variant, holding the same Parameters (``fp8.convert_to_fp8`` calls
        it for every module that has it): its local GEMM in FP8, the collectives unchanged."""
        from . import tp_fp8

        variant = tp_fp8.FP8_VARIANTS[type(self).__name__]
        return tp_fp8.fp8_parallel_linear(self, variant, **fp8_kwargs)


class ColumnParallelLinear(_ShardedLinear):
    """y_mine = f(x) @ W[my rows]^T + b[my rows]: the output stays sharded over my units.

    Holds ``weight`` (local_out, in) and ``bias`` (local_out,). For ``attn.qkv`` the local output
    is [Q of my heads, K of my heads, V of my heads], so attention runs unchanged on my heads.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        group: Group,
        unit_spec: UnitSpec,
        units: tuple[int, ...],
        total_units: int,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__(unit_spec, units, total_units)
        if unit_spec.dim != 0:
            raise ValueError("A column-parallel layer splits its output (UnitSpec.dim == 0).")
        self._check_full(out_features, "out_features")
        self.group, self.in_features, self.out_features = group, in_features, out_features
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(self.local_size, in_features))
        self.bias = nn.Parameter(torch.empty(self.local_size)) if bias else None
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = column_input(x, self.group, self.sequence_parallel)
        return F.linear(x, self.weight, self.bias)  # (..., local_out)

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.local_size} of {self.out_features}, "
            f"{self.unit_spec.axis}={self.units}"
        )


class RowParallelLinear(_ShardedLinear):
    """y = g(x_mine @ W[:, my columns]^T) + b: partial sums all-reduced, then the full bias.

    Holds ``weight`` (out, local_in) and a replicated ``bias`` (out,), added once after the
    all-reduce (adding it before would count it t times).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        group: Group,
        unit_spec: UnitSpec,
        units: tuple[int, ...],
        total_units: int,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__(unit_spec, units, total_units)
        if unit_spec.dim != 1:
            raise ValueError("A row-parallel layer splits its input (UnitSpec.dim == 1).")
        self._check_full(in_features, "in_features")
        self.group, self.in_features, self.out_features = group, in_features, out_features
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, self.local_size))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = row_output(F.linear(x, self.weight), self.group, self.sequence_parallel)
        return row_bias(y, self.bias, self.group, self.sequence_parallel)

    def extra_repr(self) -> str:
        return (
            f"in={self.local_size} of {self.in_features}, out={self.out_features}, "
            f"{self.unit_spec.axis}={self.units}"
        )
