"""Megatron's communication operators as autograd Functions: what tensor parallelism sends, when.

A tensor-parallel layer pair (column-parallel, then row-parallel) needs exactly two operators,
named ``f`` and ``g`` in the Megatron-LM paper (Shoeybi et al. 2019, section 3):

    ``f`` = ``CopyToTensorParallel``      identity in forward, all-reduce in backward
    ``g`` = ``ReduceFromTensorParallel``  all-reduce in forward, identity in backward

They are conjugates: each is the other's backward. ``f`` sits where a replicated activation
enters the sharded region: every rank uses the same input, so its gradient is the *sum* of the
ranks' partial gradients. ``g`` sits where the region ends: each rank holds a partial sum of the
output, and the sum is the same replicated tensor on every rank, so its gradient passes through.

Sequence parallelism (Korthikanti et al. 2022) splits the replicated activations between the
regions (LayerNorm, dropout, residual) along the sequence. It replaces ``f`` by an all-gather
and ``g`` by a reduce-scatter, which move the same bytes as one all-reduce (a ring all-reduce
*is* a reduce-scatter followed by an all-gather) while each rank stores 1/t of the activations:

    ``GatherFromSequenceParallel``  all-gather along the sequence in forward, reduce-scatter in
                                     backward
    ``ScatterToSequenceParallel``   reduce-scatter in forward, all-gather in backward (Megatron
                                     calls it "reduce-scatter to the sequence-parallel region")

Two more close the region at its ends: ``SplitToSequenceParallel`` (keep my slice; all-gather the
gradient) where the replicated embeddings enter it, and ``GatherReplicatedGrad`` (all-gather;
keep my slice of the replicated gradient) where it ends before a replicated LM head. The GPT
uses them all with ``TPSpec(sequence_parallel=True)`` (``parallel.tp_model``). Sequence splits must be
even (every rank the same length).

Every operator takes a process group; ``None`` (or a group of one rank) makes it the identity,
so the same model code runs at TP 1 without ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "column_input",
    "row_bias",
    "row_output",
    "on_rank0",
    "CopyToTensorParallel",
    "ReduceFromTensorParallel",
    "GatherFromSequenceParallel",
    "ScatterToSequenceParallel",
    "SplitToSequenceParallel",
    "GatherReplicatedGrad",
    "split_to_sp",
    "copy_to_tp",
    "reduce_from_tp",
    "gather_from_sp",
    "scatter_to_sp",
    "group_size",
    "group_rank",
]

Group = Any  # a torch.distributed ProcessGroup, or None for "no parallelism"


def group_size(group: Group) -> int:
    """Ranks in ``group`` (1 for None)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Group) -> int:
    """This process's rank inside ``group`` (0 for None)."""
    return 0 if group is None else dist.get_rank(group)


def _all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Sum of ``x`` over the group, in a new tensor (the input is left alone)."""
    if group_size(group) == 1:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


def _all_gather(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (equal shapes required)."""
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _check_even(x: torch.Tensor, n: int, dim: int) -> None:
    if x.shape[dim] % n:
        raise ValueError(
            f"Sequence parallelism here needs even splits: dim {dim} has size {x.shape[dim]}, "
            f"which {n} ranks cannot share equally. Use a sequence length divisible by the TP "
            "degree."
        )


def _reduce_scatter_by_all_reduce(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """Reduce-scatter the slow way: all-reduce, then keep this rank's slice. Same result; a ring
    moves about twice the bytes of a true reduce-scatter. Used on gloo builds without one."""
    n = group_size(group)
    return _all_reduce(x, group).chunk(n, dim=dim)[group_rank(group)].contiguous()


_GLOO_HAS_REDUCE_SCATTER: bool | None = None  # unknown until the first try


def _reduce_scatter(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """Sum ``x`` over the group and return this rank's 1/n slice along ``dim``."""
    global _GLOO_HAS_REDUCE_SCATTER
    n = group_size(group)
    if n == 1:
        return x
    _check_even(x, n, dim)
    gloo = dist.get_backend(group) == "gloo"
    if gloo and _GLOO_HAS_REDUCE_SCATTER is False:
        return _reduce_scatter_by_all_reduce(x, group, dim)
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    out = torch.empty_like(chunks[0])
    try:
        dist.reduce_scatter(out, chunks, group=group)
    except (RuntimeError, NotImplementedError) as exc:
        # Older gloo builds refuse before sending anything, on every rank alike.
        if not gloo or "does not support" not in str(exc):
            raise
        _GLOO_HAS_REDUCE_SCATTER = False
        return _reduce_scatter_by_all_reduce(x, group, dim)
    if gloo:
        _GLOO_HAS_REDUCE_SCATTER = True
    return out


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, all-reduce in backward.

    Put it on the input of a column-parallel layer. Forward: every rank already holds the same
    activation, nothing moves. Backward: each rank's gradient covers only its own columns' use of
    the input; the full gradient is their sum.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in forward, identity in backward.

    Put it on the output of a row-parallel layer. Forward: each rank's matmul gives a partial
    sum over its rows of the weight; the all-reduce adds them. Backward: the output is the same
    on every rank, so each rank's gradient already is the gradient of its partial sum.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """All-gather along the sequence in forward, reduce-scatter in backward.

    Sequence parallelism's ``f``: each rank holds 1/t of the sequence; a column-parallel layer
    needs all of it. In backward each rank has a partial gradient for the *whole* sequence; the
    reduce-scatter sums them and hands every rank the slice it owns.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter(grad, ctx.group, ctx.dim), None, None


def _my_slice(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """This rank's 1/n of ``x`` along ``dim`` (no communication)."""
    return x.chunk(group_size(group), dim)[group_rank(group)].contiguous()


class SplitToSequenceParallel(torch.autograd.Function):
    """Keep this rank's slice of the sequence in forward (no communication), all-gather in
    backward: where a replicated activation (the embeddings) enters the sequence-parallel region.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _my_slice(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.group, ctx.dim), None, None


class GatherReplicatedGrad(GatherFromSequenceParallel):
    """All-gather along the sequence in forward (as ``GatherFromSequenceParallel``); in backward
    keep this rank's slice of the gradient, which is the same on every rank (Megatron's
    ``tensor_parallel_output_grad=False``): where the sequence-parallel region ends before a
    replicated layer (a replicated LM head)."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _my_slice(grad, ctx.group, ctx.dim), None, None


class ScatterToSequenceParallel(torch.autograd.Function):
    """Reduce-scatter in forward, all-gather in backward.

    Sequence parallelism's ``g``: a row-parallel layer leaves partial sums of the whole
    sequence; the reduce-scatter sums them and keeps this rank's slice of the sequence. The
    gradient of that slice is gathered back to the whole sequence in backward.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.group, ctx.dim), None, None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``f``: identity forward, all-reduce backward (the identity when ``group`` is None)."""
    return x if group_size(group) == 1 else CopyToTensorParallel.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``g``: all-reduce forward, identity backward (the identity when ``group`` is None)."""
    return x if group_size(group) == 1 else ReduceFromTensorParallel.apply(x, group)


def gather_from_sp(
    x: torch.Tensor, group: Group, dim: int = 1, partial_grad: bool = True
) -> torch.Tensor:
    """All-gather along ``dim`` (the sequence: 1 for (B, T, C)) forward; backward: reduce-scatter
    when each rank's gradient is a partial sum (``partial_grad``: a parallel layer follows), else
    this rank's slice of the replicated gradient (a replicated layer follows)."""
    if group_size(group) == 1:
        return x
    op = GatherFromSequenceParallel if partial_grad else GatherReplicatedGrad
    return op.apply(x, group, dim)


def split_to_sp(x: torch.Tensor, group: Group, dim: int = 1) -> torch.Tensor:
    """This rank's 1/n of ``x`` along ``dim`` forward, all-gather backward (even splits)."""
    if group_size(group) == 1:
        return x
    _check_even(x, group_size(group), dim)
    return SplitToSequenceParallel.apply(x, group, dim)


def scatter_to_sp(x: torch.Tensor, group: Group, dim: int = 1) -> torch.Tensor:
    """Reduce-scatter along ``dim`` forward, all-gather backward; ``x.shape[dim]`` must divide
    evenly by the group size."""
    if group_size(group) == 1:
        return x
    _check_even(x, group_size(group), dim)
    return ScatterToSequenceParallel.apply(x, group, dim)


def on_rank0(group: Group, work: Callable[[], object], doing: str = "write the checkpoint") -> None:
    """Run ``work`` on rank 0 of ``group`` while the others wait; if it raises, rank 0 raises its
    error and every other rank a RuntimeError naming it (``doing``: what rank 0 failed to do),
    instead of waiting forever. Without a process group (``group`` None, one process) it just
    runs."""
    if group is None or not dist.is_initialized():
        work()
        return
    error: list[str | None] = [None]
    failure: Exception | None = None
    if group_rank(group) == 0:
        try:
            work()
        except Exception as err:  # shared below, then raised on every rank
            failure, error[0] = err, f"{type(err).__name__}: {err}"
    dist.broadcast_object_list(error, src=dist.get_global_rank(group, 0), group=group)
    if failure is not None:
        raise failure
    if error[0] is not None:
        raise RuntimeError(f"Rank 0 failed to {doing}: {error[0]}")


# ---- the wiring around a column- or row-parallel layer (plain or FP8: tp_linear, tp_fp8) ------
def column_input(x: torch.Tensor, group: Group, sequence_parallel: bool) -> torch.Tensor:
    """What a column-parallel layer multiplies: ``f(x)``, or under sequence parallelism the
    whole sequence gathered from every rank's slice (reduce-scatter in backward)."""
    return gather_from_sp(x, group, dim=1) if sequence_parallel else copy_to_tp(x, group)


def row_output(y: torch.Tensor, group: Group, sequence_parallel: bool) -> torch.Tensor:
    """A row-parallel layer's partial sums, summed: ``g(y)``, or under sequence parallelism
    summed and cut to this rank's slice of the sequence (reduce-scatter)."""
    return scatter_to_sp(y, group, dim=1) if sequence_parallel else reduce_from_tp(y, group)


def row_bias(
    y: torch.Tensor, bias: torch.Tensor | None, group: Group, sequence_parallel: bool
) -> torch.Tensor:
    """The replicated bias, added once after the sum. On a sequence slice each rank sees only
    its tokens, so the bias enters through ``f``: its gradient is summed over the ranks."""
    if bias is None:
        return y
    return y + (copy_to_tp(bias, group) if sequence_parallel else bias)
