"""What each rank of a data-parallel ``launch.spawn`` group runs (chapter and tests): a few
steps of a ``Trainer`` on a model built for its layout, optionally resumed from or saved to a
checkpoint, and the memory it holds.
Importable by name, as ``spawn`` needs; results are small (histories and byte counts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..build import build_model
from ..config import GPTConfig
from ..data import TokenData
from ..parallel.comm import Group
from ..parallel.dp import memory_per_rank
from ..parallel.mesh import ParallelDims, groups_2d, local_rows
from ..parallel.shard import ShardMap
from ..parallel.tp_model import TPSpec
from ..train import TrainConfig, Trainer

__all__ = [
    "DPRun",
    "dp_train",
    "dp_layouts_worker",
    "mesh_job",
]


@dataclass(frozen=True)
class DPRun:
    """One data-parallel run: model, data (train tokens, val tokens, block size, seed), settings.

    steps: train until this many steps in total; resume: a checkpoint to start from; save: where
    to write one at the end; measure: after training, one more forward and backward pass (no
    step), then ``memory_per_rank`` with the gradients in place. A checkpoint is a file or a
    DCP directory, as the layout makes it (``checkpoint.run``).
    """

    model: GPTConfig
    data: tuple[torch.Tensor, torch.Tensor, int, int]
    train: TrainConfig
    mode: str = "fsdp"
    steps: int | None = None
    resume: str | None = None
    save: str | None = None
    measure: bool = False
    param_dtype: torch.dtype | None = None
    seed: int = 0
    tp: int = 1  # tensor-parallel degree: a (len(ranks) / tp) x tp mesh (parallel.mesh)
    fused: bool = False
    compile: bool = False
    sequence_parallel: bool = False  # with tp > 1 (parallel.tp_model.TPGPT)
    vocab_parallel: bool = False  # with tp > 1: a vocabulary-parallel embedding, head and loss


def dp_layouts_worker(
    rank: int, world_size: int, jobs: Sequence[tuple[Sequence[int], DPRun]]
) -> list[dict[str, Any] | None]:
    """Each job ``(ranks, run)`` in turn on its ranks (None on the others): several data-parallel
    degrees from one spawn; with ``run.tp`` > 1 a (dp, tp) mesh on those ranks. Every rank makes
    every group first, in the same order, as ``dist.new_group`` requires; a rank outside a job's
    group skips it; all ranks wait for each job to end before the next starts (it may resume
    what the last one saved)."""
    groups = [groups_2d(len(ranks) // run.tp, run.tp, ranks) for ranks, run in jobs]
    out = []
    for (_, run), pair in zip(jobs, groups, strict=True):
        out.append(dp_train(run, *pair) if pair is not None else None)
        dist.barrier()  # a later job may read what this one wrote
    return out


def dp_train(
    run: DPRun,
    group: Group | None = None,
    tp_group: Group | None = None,
    job_group: Group | None = None,
) -> dict[str, Any]:
    """Build the model for this rank's layout (``build_model`` with ``run.seed``: the same
    weights on every rank; data parallelism over ``group``, default all ranks; this rank's TP
    shards over ``tp_group`` when ``run.tp`` > 1; ``job_group``: all the job's ranks), train it
    and return the history (and the memory, with ``run.measure``)."""
    spec = None
    if run.tp > 1:
        shard_map = ShardMap.even(run.model, run.tp, vocab_parallel=run.vocab_parallel)
        spec = TPSpec(tp_group, shard_map, sequence_parallel=run.sequence_parallel)
    if run.compile:  # a fresh start: earlier runs' graphs would count towards the recompile limit
        torch._dynamo.reset()
    dp_group = group if group is not None else dist.group.WORLD
    dims = ParallelDims(dp_group, run.mode, spec, job_group, run.param_dtype)
    model = build_model(
        run.model,
        precision=run.train.precision,
        fused=run.fused,
        compile=run.compile,
        parallel=dims,
        device="cpu",
        seed=run.seed,
    )
    trainer = Trainer(model, TokenData(*run.data), run.train, device="cpu")
    if run.resume is not None:
        trainer.resume(run.resume)
    history = trainer.train(run.steps)
    if run.save is not None:
        trainer.save(Path(run.save))
    memory = None
    if run.measure:
        x, y = trainer.batch("train")
        with trainer.policy.autocast(trainer.device):
            _, loss = trainer.model(x, y)
        loss.backward()
        memory = memory_per_rank(trainer.model, trainer.optimizer)
    rows = local_rows(run.train.batch_size, dims.dp, dims.dp_rank)  # this rank's share
    return {"history": history, "memory": memory, "rows": (rows.start, rows.stop)}


def mesh_job(groups: tuple[Group, Group, Group], run: DPRun) -> dict[str, Any]:
    """``dp_train`` as a job of ``workers.run_jobs``, which hands it the (data-parallel,
    tensor-parallel, whole-job) groups of a mesh on the job's ranks (``mesh_tp``: the TP
    degree)."""
    return dp_train(run, *groups)


mesh_job.mesh_tp = lambda run: run.tp  # type: ignore[attr-defined]
