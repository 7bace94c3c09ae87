"""Exercise 10.1: a column-parallel linear layer over t simulated ranks (uneven splits allowed),
checked against ``parallel.tp_linear.ColumnParallelLinear`` holding the shards of ``split_evenly``."""

from __future__ import annotations

import torch
from torch import nn

from ..parallel.shard import UnitSpec, split_evenly
from ..parallel.tp_linear import ColumnParallelLinear
from .base import Case, Exercise

STUB = '''\
import torch
from torch import nn


def column_parallel_forward(
    x: torch.Tensor, linear: nn.Linear, t: int
) -> list[torch.Tensor]:
    """A column-parallel linear on t ranks, simulated in one process.

    x: (..., in_features); linear: the full nn.Linear; t: ranks.
    Rank r holds a contiguous block of the output rows of
    linear.weight (and of linear.bias, if any); the first
    out_features % t ranks hold one row more than the others.
    Returns the t ranks' outputs, in rank order: rank r's is
    x @ W_r.T + b_r, shape (..., rows of rank r).
    """
    raise NotImplementedError
'''

TASK = (
    "In a column-parallel layer each rank holds some output rows of the weight and computes "
    "only its part of the output; concatenated along the last dimension the parts are "
    "`linear(x)`. Split the `out_features` rows into `t` contiguous blocks whose sizes differ by "
    "at most one (the first `out_features % t` ranks get the extra row), slice each rank's "
    "weight and bias, and return the list of the `t` partial outputs. No communication is "
    "needed in the forward pass: the input is already on every rank."
)


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(808)
    out = []
    # (x shape, out_features, t, bias)
    for shape, n_out, t, bias in [
        ((2, 3, 8), 10, 3, True),
        ((4, 5), 7, 7, True),
        ((6,), 12, 4, False),
        ((1, 2, 9), 13, 5, True),
        ((3, 4), 6, 1, True),
    ]:
        linear = nn.Linear(shape[-1], n_out, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=g))
            if linear.bias is not None:
                linear.bias.copy_(torch.randn(n_out, generator=g))
        x = torch.randn(shape, generator=g)
        sizes = [len(u) for u in split_evenly(n_out, t)]
        label = f"x {shape}, {n_out} outputs over t = {t} ranks (rows {sizes})"
        out.append(Case(label + ("" if bias else ", no bias"), {"x": x, "linear": linear, "t": t}))
    return out


def _reference(x: torch.Tensor, linear: nn.Linear, t: int) -> list[torch.Tensor]:
    spec = UnitSpec("ffn", dim=0, groups=1, width=1)  # one unit per output row
    n_out = linear.out_features
    outputs = []
    for units in split_evenly(n_out, t):
        rank = ColumnParallelLinear(
            linear.in_features, n_out, linear.bias is not None, None, spec, units, n_out
        )
        with torch.no_grad():
            rank.weight.copy_(linear.weight[rank.shard_index()])
            if rank.bias is not None and linear.bias is not None:
                rank.bias.copy_(linear.bias[rank.shard_index()])
            outputs.append(rank(x))
    return outputs


EXERCISES = [
    Exercise(
        id="10.1",
        title="a column-parallel linear layer, uneven shards",
        function="column_parallel_forward",
        signature=(
            "column_parallel_forward(x: Tensor (..., in), linear: nn.Linear, t: int) "
            "-> list[Tensor]"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="tutorial_lib.parallel.tp_linear.ColumnParallelLinear (shards of split_evenly)",
    )
]
