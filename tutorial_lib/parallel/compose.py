"""What composes with what under parallelism: one function says which combinations are refused,
and why; the trainers and ``build_model`` raise its reason, the book prints its table, and the
tests run every other cell against one process (``tests/test_composition.py``).

Axes: the precision policy, ``fused`` (our Triton kernels), ``compile`` (``torch.compile``),
tensor parallelism (our Megatron layers) and FSDP2 (over the data-parallel ranks; DDP, which
replicates, refuses nothing FSDP2 accepts). Three refusals, each for a reason that is not ours
to remove here:

- FP16 with sharded gradients (TP or FSDP2): its loss scaler checks each rank's own shards for
  inf and NaN, so the ranks could disagree on whether to skip a step. BF16 needs no scaler.
- Transformer Engine (``te-*``) under our TP: TE splits its own modules (``parallel_mode``,
  ``tp_group``), which this package does not wire up (and cannot test without CUDA).
- Transformer Engine under FSDP2: the full-state checkpoint would hold TE's pickled FP8 state,
  which this package refuses to load.

Fused kernels and ``torch.compile`` are refused nowhere: the Triton LayerNorm, GELU and loss
kernels sit around the parallel layers unchanged, and Dynamo compiles the model with the
collectives inside our autograd Functions (``FP8Linear.forward`` runs eagerly, as in one process).

Checking a cell: ``train_cells`` runs cells on gloo processes (TP alone: tp 2 on 2 processes;
FSDP2 alone: dp 2; both: dp 2 x tp 2 on 4), one step each, and ``one_process`` the same step in
one process; ``cell_tolerance`` is the agreement each precision must reach (its loss checks the
forward pass, its gradient norm the backward). ``tests/test_composition.py`` runs the cells that
fit the test suite's time; ``benchmarks/composition.py`` runs every cell, compiled ones included,
and records the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import GPTConfig
from ..precision import available_policies
from ..train import TrainConfig

__all__ = [
    "CELL_MODEL",
    "Cell",
    "cell_layout",
    "cell_name",
    "cell_tolerance",
    "check_composition",
    "composition_problem",
    "composition_table",
    "one_process",
    "train_cells",
]


def composition_problem(precision: str, tp: bool, fsdp: bool) -> str | None:
    """Why ``precision`` cannot train under tensor parallelism (``tp``) and/or FSDP2 (``fsdp``),
    with what to do instead; None when it can."""
    where = " and ".join(n for n, on in (("tensor parallelism", tp), ("FSDP2", fsdp)) if on)
    if precision == "fp16" and (tp or fsdp):
        return (
            f"'fp16' under {where}: its loss scaler checks each rank's own gradient shards for "
            "inf and NaN, so ranks could disagree on skipping a step. Use bf16 (no loss "
            "scaling needed)."
        )
    if precision.startswith("te-") and tp:
        return (
            f"{precision!r} under our tensor parallelism: Transformer Engine splits its own "
            "modules (parallel_mode='column'/'row', tp_group), which this package does not "
            "wire up. Use our FP8 precisions (fp8, fp8-current, ...) with --tp."
        )
    if precision.startswith("te-") and fsdp:
        return (
            f"{precision!r} with FSDP2: the full-state checkpoint would hold Transformer "
            "Engine's pickled FP8 state, which this package refuses to load. Use --dp-mode ddp, "
            "or our own FP8 precisions (fp8, fp8-current, ...)."
        )
    return None


def check_composition(precision: str, tp: bool, fsdp: bool) -> None:
    """Raise ``composition_problem``'s reason as a ValueError, if there is one."""
    problem = composition_problem(precision, tp, fsdp)
    if problem is not None:
        raise ValueError(f"Not supported: {problem}")


@dataclass(frozen=True)
class Cell:
    """One combination; ``problem`` None means it trains (and is tested against one process)."""

    precision: str
    fused: bool
    compile: bool
    tp: bool
    fsdp: bool
    problem: str | None


def composition_table() -> list[Cell]:
    """Every parallel combination (TP, FSDP2 or both) of every registered precision, fused or
    not, compiled or not."""
    return [
        Cell(p, fused, comp, tp, fsdp, composition_problem(p, tp, fsdp))
        for p in available_policies()
        for tp, fsdp in ((True, False), (False, True), (True, True))
        for fused in (False, True)
        for comp in (False, True)
    ]


# ---- checking cells against one process ------------------------------------------------------
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
    from .dp_workers import DPRun, dp_layouts_worker
    from .launch import spawn

    mine = [c for c in cells if len(cell_layout(c)[0]) == world]
    jobs = []
    for c in mine:
        ranks, mode, tp = cell_layout(c)
        train = _cell_config(c.precision, steps)
        run = DPRun(CELL_MODEL, _cell_data(), train, mode, tp=tp, fused=c.fused, compile=c.compile)
        jobs.append((ranks, run))
    results = spawn(dp_layouts_worker, world, jobs, timeout_s=timeout_s)[0]
    return {cell_name(c): _rows(r["history"]) for c, r in zip(mine, results, strict=True)}


def one_process(precision: str, fused: bool, steps: int = 1) -> list[tuple[float, float]]:
    """The same steps in one process: what every cell of ``precision`` (and ``fused``) must
    reproduce."""
    from ..build import build_model
    from ..data import TokenData
    from ..train import Trainer

    model = build_model(CELL_MODEL, precision=precision, fused=fused, device="cpu", seed=0)
    cfg = _cell_config(precision, steps)
    return _rows(Trainer(model, TokenData(*_cell_data()), cfg, device="cpu").train())
