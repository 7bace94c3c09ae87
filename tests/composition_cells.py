"""The composition table's cells (``tutorial_lib.parallel.compose``), trained: each on gloo
processes (TP alone: tp 2 on 2 processes; FSDP2 alone: dp 2; both: dp 2 x tp 2 on 4), one step
by default, and ``one_process``, the same steps in one process, which every cell must reproduce
within ``cell_tolerance`` (its loss checks the forward pass, its gradient norm the backward).
``tests/test_composition.py`` runs the cells that fit the test suite's time;
``benchmarks/composition.py`` runs every cell and records the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.jobs.dp_workers import DPRun, dp_train
from tutorial_lib.jobs.workers import run_jobs
from tutorial_lib.parallel.compose import Cell
from tutorial_lib.parallel.launch import spawn
from tutorial_lib.train import Trainer
from tutorial_lib.train_config import TrainConfig

CELL_MODEL = GPTConfig(vocab_size=256, block_size=8, n_layer=1, n_head=2, n_embd=32)
# one process against the layout, per precision family: float32 sums in another order; BF16 and
# FP8 round activations; the stateless FP8 recipes scale each rank's slice by its own amax, and
# FP8 quantizes each rank's slices (and rows) on their own, which moves the gradient norm most.
_LOSS_REL = {"fp32": 1e-5, "tf32": 1e-5, "bf16": 1e-4, "fp8": 1e-4}
_NORM_REL = {"fp32": 1e-4, "tf32": 1e-4, "bf16": 1e-3}


def cell_tolerance(precision: str) -> tuple[float, float]:
    """(relative tolerance of the loss, of the gradient norm) of a cell in ``precision``."""
    return _LOSS_REL.get(precision, 1e-3), _NORM_REL.get(precision, 2e-2)


def cell_name(c: Cell) -> str:
    parts = [c.precision, "tp" if c.tp else "", "fsdp" if c.fsdp else ""]
    parts += ["fused" if c.fused else "", "compile" if c.compile else ""]
    return "-".join(p for p in parts if p)


def cell_layout(cell: Cell) -> tuple[tuple[int, ...], str, int]:
    """(ranks, data-parallel mode, TP degree) of a cell."""
    if cell.tp and cell.fsdp:
        return (0, 1, 2, 3), "fsdp", 2
    if cell.tp:
        return (0, 1), "ddp", 2  # dp 1: DDP over a group of one rank is the identity
    return (0, 1), "fsdp", 1


def _cell_data() -> tuple[torch.Tensor, torch.Tensor, int, int]:
    tokens = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(1))
    return tokens[:2500].to(torch.uint8), tokens[2500:].to(torch.uint8), CELL_MODEL.block_size, 0


def _cell_config(precision: str, steps: int) -> TrainConfig:
    return TrainConfig(
        steps=steps, batch_size=4, lr=3e-3, warmup_steps=1, eval_every=0,
        precision=precision, seed=0, progress=False,
    )  # fmt: skip


def _rows(history: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(loss, gradient norm) per step."""
    return [(float(row["loss"]), float(row["grad_norm"])) for row in history]


def train_cells(
    cells: Sequence[Cell], world: int, steps: int = 1, timeout_s: float = 600
) -> dict[str, list[tuple[float, float]]]:
    """(loss, gradient norm) per step of each cell that runs on ``world`` processes, all in one
    spawn (FP8's amaxes are reduced over every process, so each size gets its own spawn)."""
    mine = [c for c in cells if len(cell_layout(c)[0]) == world]
    jobs = []
    for c in mine:
        ranks, mode, tp = cell_layout(c)
        train = _cell_config(c.precision, steps)
        run = DPRun(CELL_MODEL, _cell_data(), train, mode, tp=tp, fused=c.fused, compile=c.compile)
        jobs.append((ranks, dp_train, (run,)))
    results = spawn(run_jobs, world, jobs, timeout_s=timeout_s)[0]
    return {cell_name(c): _rows(r["history"]) for c, r in zip(mine, results, strict=True)}


def one_process(precision: str, fused: bool, steps: int = 1) -> list[tuple[float, float]]:
    """The same steps in one process: what every cell of ``precision`` (and ``fused``) must
    reproduce."""
    model = build_model(CELL_MODEL, precision=precision, fused=fused, device="cpu", seed=0)
    cfg = _cell_config(precision, steps)
    return _rows(Trainer(model, TokenData(*_cell_data()), cfg, device="cpu").train())
