"""What each rank of a data-parallel job runs (chapters and tests, as jobs of
``workers.run_jobs``): a few steps of a ``Trainer`` on a model built for its layout, optionally
resumed from or saved to a checkpoint, and the memory it holds.
Importable by name, as ``spawn`` needs; results are small (histories and byte counts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import GPTConfig
from ..data import TokenData
from ..parallel.comm import Group
from ..parallel.dp import memory_per_rank
from ..parallel.mesh import local_rows
from ..runs import parallel_trainer
from ..train import TrainConfig

__all__ = ["DPRun", "dp_train"]


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


def dp_train(groups: tuple[Group, Group, Group], run: DPRun) -> dict[str, Any]:
    """A job of ``workers.run_jobs``, which hands it the (data-parallel, tensor-parallel,
    whole-job) groups of a (len(ranks) / ``run.tp``) x ``run.tp`` mesh on its ranks
    (``mesh_tp``): build this rank's model and trainer (``runs.parallel_trainer``, with
    ``run.seed``: the same weights on every rank), train it and return the history (and the
    memory, with ``run.measure``)."""
    if run.compile:  # a fresh start: earlier runs' graphs would count towards the recompile limit
        torch._dynamo.reset()
    trainer = parallel_trainer(
        run.model, TokenData(*run.data), run.train, groups, run.mode, device="cpu",
        fused=run.fused, compile=run.compile, seed=run.seed,
        sequence_parallel=run.sequence_parallel, vocab_parallel=run.vocab_parallel,
        param_dtype=run.param_dtype,
    )  # fmt: skip
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
    dims = trainer.parallel
    rows = local_rows(run.train.batch_size, dims.dp, dims.dp_rank)  # this rank's share
    return {"history": history, "memory": memory, "rows": (rows.start, rows.stop)}


dp_train.mesh_tp = lambda run: run.tp  # type: ignore[attr-defined]
