"""Functions that run on every rank of a ``launch.spawn`` group: the chapter's and the tests'.

They live in the package because ``spawn`` starts fresh interpreters that import a worker by
name. Workers called by ``spawn`` take ``(rank, world_size, *args)``; the ``*_check`` and
``tp_*`` functions take a process group first, so ``run_jobs`` can run several of them, on
different groups of ranks, in one spawn (starting processes costs seconds; a check, millis).
Results come back to the parent, so keep them small: tensors, numbers, strings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..build import build_model
from ..config import GPTConfig
from ..data import TokenData
from ..model import GPT
from ..parallel import comm
from ..parallel.comm import Group, group_rank, group_size
from ..parallel.mesh import ParallelDims
from ..parallel.shard import ShardMap
from ..parallel.tp_model import TPSpec, gather_full, parallelize
from ..train import TrainConfig, Trainer

__all__ = [
    "run_jobs",
    "tp_forward_backward",
    "operators_check",
    "tp_trace_step",
]

# One job for run_jobs: (ranks, fn, args).
WorkerJob = tuple[Sequence[int], Callable[..., Any], tuple[Any, ...]]


def run_jobs(rank: int, world_size: int, jobs: Sequence[WorkerJob]) -> list[Any]:
    """Run ``fn(group, *args)`` for each job ``(ranks, fn, args)`` whose ranks include this one
    (None for the others), in turn: every rank waits for each job to end before the next starts,
    so a job may resume what an earlier one saved. All groups are made first, by every rank in
    the same order, as ``dist.new_group`` requires. A job whose ``fn`` has a ``mesh_tp``
    attribute (``dp_workers.dp_train``) gets the (data-parallel, tensor-parallel, whole-job)
    groups of a ``len(ranks) / tp`` x ``tp`` mesh on its ranks instead (``mesh.groups_2d``;
    ``tp = fn.mesh_tp(*args)``)."""
    from ..parallel.mesh import groups_2d

    groups: list[Any] = []
    for ranks, fn, args in jobs:
        mesh_tp = getattr(fn, "mesh_tp", None)
        if mesh_tp is None:
            groups.append(dist.new_group(list(ranks)))
        else:
            tp = mesh_tp(*args)
            groups.append(groups_2d(len(ranks) // tp, tp, ranks))
    out = []
    for (ranks, fn, args), group in zip(jobs, groups, strict=True):
        out.append(fn(group, *args) if rank in ranks else None)
        dist.barrier()  # a later job may read what this one wrote
    return out


def tp_forward_backward(
    group: Group,
    cfg: GPTConfig,
    shard_map: ShardMap,
    batch: tuple[torch.Tensor, torch.Tensor],
    state_dict: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """One forward and backward of ``GPT(cfg)`` with ``state_dict``, tensor-parallel over
    ``group``: logits, loss, the gathered full gradients and state dict, and local shapes."""
    model = GPT(cfg)
    model.load_state_dict(state_dict)
    tp_model = parallelize(model, group, shard_map)
    x, y = batch
    logits, loss = tp_model(x, y)
    loss.backward()
    grads: dict[str, torch.Tensor] = {}
    for n, p in tp_model.named_parameters():
        if p.grad is None:
            raise RuntimeError(f"tp_forward_backward: parameter {n!r} got no gradient.")
        grads[n] = p.grad
    return {
        "rank": group_rank(group),
        "logits": logits.detach(),
        "loss": loss.detach(),
        "grads": gather_full(grads, cfg, group, shard_map),
        "state_dict": gather_full(tp_model.state_dict(), cfg, group, shard_map),
        "local_shapes": {n: tuple(p.shape) for n, p in tp_model.named_parameters()},
    }


def operators_check(group: Group, shape: tuple[int, ...], dim: int = 1) -> dict[str, Any]:
    """Each of Megatron's operators on a rank-dependent input with a rank-dependent output
    gradient: per operator, the input, the output, the output gradient and the input gradient.
    Also the error for a sequence that does not split evenly."""
    r = group_rank(group)
    numel = torch.Size(shape).numel()
    out: dict[str, Any] = {}
    ops = {
        "copy": comm.copy_to_tp,
        "reduce": comm.reduce_from_tp,
        "gather": lambda t, g: comm.gather_from_sp(t, g, dim),
        "scatter": lambda t, g: comm.scatter_to_sp(t, g, dim),
    }
    for name, op in ops.items():
        x = (torch.arange(numel, dtype=torch.float64).reshape(shape) + 100.0 * r).requires_grad_()
        y = op(x, group)
        dy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
        y.backward(dy)
        out[name] = {"x": x.detach(), "y": y.detach(), "dy": dy, "dx": x.grad}
    x = torch.arange(numel, dtype=torch.float64).reshape(shape) * (r + 1)
    try:  # a sequence the ranks cannot share equally
        comm.scatter_to_sp(torch.cat([x, x.narrow(dim, 0, 1)], dim), group, dim)
    except ValueError as exc:
        out["uneven_error"] = str(exc)
    return out


def tp_trace_step(
    group: Group,
    cfg: GPTConfig,
    data: tuple[torch.Tensor, torch.Tensor, int, int],
    train_cfg: TrainConfig,
    path: str,
) -> dict[str, Any] | None:
    """One tensor-parallel ``Trainer`` step (after one warm-up step) traced on TP rank 0 (``perf.record_trace``
    to ``path``); the other ranks run the same steps untraced. Rank 0 returns the
    ``trace_summary`` of its trace, the others None."""
    from ..perf import load_trace, record_trace, trace_summary

    dims = ParallelDims(tp=TPSpec(group, ShardMap.even(cfg, group_size(group))))
    model = build_model(cfg, parallel=dims, device="cpu", seed=0)
    trainer = Trainer(model, TokenData(*data), train_cfg, device="cpu")
    if group_rank(group) != 0:
        trainer.train_step()
        trainer.train_step()
        return None
    record_trace(trainer.train_step, path, warmup=1, steps=1, device="cpu")
    return trace_summary(load_trace(path))
