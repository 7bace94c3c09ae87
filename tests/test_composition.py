"""Every cell of the composition table (``parallel.compose``): refused with its reason, or
trained under that layout and compared with one process.

Spawns run the cells that train, one step each (its loss checks the forward pass, its gradient
norm the backward): on 2 gloo ranks TP alone (tp 2, a data-parallel group of one rank each) and
FSDP2 alone (dp 2); on 4, both (dp 2 x tp 2). Every precision unfused; fused, the precisions
in ``FUSED`` under both, FP32 under each alone. ``torch.compile`` (Inductor, compiling for real: tens of seconds per model on a
CPU) runs once, in ``test_parallel_2d`` (FP8 under dp 2 x tp 2); the other compiled and fused
cells are not run one by one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.parallel.compose import (
    Cell,
    check_composition,
    composition_problem,
    composition_table,
)
from tutorial_lib.parallel.dp_workers import DPRun, dp_layouts_worker
from tutorial_lib.parallel.launch import spawn
from tutorial_lib.train import TrainConfig, Trainer

CFG = GPTConfig(vocab_size=256, block_size=8, n_layer=1, n_head=2, n_embd=32)
STEPS = 1  # its loss checks the forward pass, its gradient norm the backward
# one process against the layout, per precision family: float32 sums in another order; BF16
# and FP8 round activations; the stateless FP8 recipes scale each rank's slice by its own amax.
REL = {"fp32": 1e-5, "tf32": 1e-5, "bf16": 1e-4, "fp8": 1e-4}
FP8_REL = 1e-3
# gradient norms: FP8 quantizes each rank's slices (and rows) on their own
NORM_REL = {"fp32": 1e-4, "tf32": 1e-4, "bf16": 1e-3}
FP8_NORM_REL = 2e-2


def _rel(precision: str) -> float:
    return REL.get(precision, FP8_REL)


def _norm_rel(precision: str) -> float:
    return NORM_REL.get(precision, FP8_NORM_REL)


def _data() -> tuple[torch.Tensor, torch.Tensor, int, int]:
    tokens = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(1))
    return tokens[:2500].to(torch.uint8), tokens[2500:].to(torch.uint8), CFG.block_size, 0


def _cfg(precision: str) -> TrainConfig:
    return TrainConfig(
        steps=STEPS, batch_size=4, lr=3e-3, warmup_steps=1, eval_every=0,
        precision=precision, seed=0, progress=False,
    )  # fmt: skip


def _layout(cell: Cell) -> tuple[tuple[int, ...], str, int]:
    """(ranks, data-parallel mode, TP degree) of a cell."""
    if cell.tp and cell.fsdp:
        return (0, 1, 2, 3), "fsdp", 2
    if cell.tp:
        return (0, 1), "ddp", 2  # dp 1: DDP over a group of one rank is the identity
    return (0, 1), "fsdp", 1


TRAINED = [c for c in composition_table() if c.problem is None]
REFUSED = [c for c in composition_table() if c.problem is not None]


def _name(c: Cell) -> str:
    parts = [c.precision, "tp" if c.tp else "", "fsdp" if c.fsdp else ""]
    parts += ["fused" if c.fused else "", "compile" if c.compile else ""]
    return "-".join(p for p in parts if p)


COMPILED: set[tuple[str, bool, bool, bool]] = set()  # compiled: test_parallel_2d (FP8, TP x FSDP2)
# Fused cells (Triton's interpreter on a CPU: about a second a step): under TP x FSDP2 at the
# precisions whose path through the kernels differs (FP32 inputs, BF16 autocast, FP8 layers with
# delayed scaling, NVFP4's stochastic rounding; the other FP8 recipes take delayed scaling's
# path), and under TP alone and FSDP2 alone at FP32.
FUSED = {"fp32", "bf16", "fp8", "nvfp4"}


def _fused_run(c: Cell) -> bool:
    return c.precision in FUSED if (c.tp and c.fsdp) else c.precision == "fp32"


RUN = [
    c
    for c in TRAINED
    if (c.compile and (c.precision, c.tp, c.fsdp, c.fused) in COMPILED)
    or (not c.compile and (not c.fused or _fused_run(c)))
]


WORLDS = sorted({len(_layout(c)[0]) for c in RUN})  # one spawn per size


def _train(world: int) -> dict[str, list[tuple[float, float]]]:
    """Every cell on ``world`` processes, in one spawn (FP8's amaxes are reduced over every
    process, so each layout's size gets its own spawn)."""
    cells = [c for c in RUN if len(_layout(c)[0]) == world]
    jobs = []
    for c in cells:
        ranks, mode, tp = _layout(c)
        run = DPRun(CFG, _data(), _cfg(c.precision), mode, tp=tp, fused=c.fused, compile=c.compile)
        jobs.append((ranks, run))
    results = spawn(dp_layouts_worker, world, jobs, timeout_s=600)[0]
    return {_name(c): _rows(r["history"]) for c, r in zip(cells, results, strict=True)}


def _rows(history: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(loss, gradient norm) per step."""
    return [(float(row["loss"]), float(row["grad_norm"])) for row in history]


def _single(precision: str, fused: bool) -> list[tuple[float, float]]:
    model = build_model(CFG, precision=precision, fused=fused, device="cpu", seed=0)
    return _rows(Trainer(model, TokenData(*_data()), _cfg(precision), device="cpu").train())


def test_the_table_covers_every_parallel_cell_and_refuses_few() -> None:
    table = composition_table()
    assert len(table) == 12 * 3 * 2 * 2  # precisions x (TP, FSDP2, both) x fused x compile
    refused = {(c.precision, c.tp, c.fsdp) for c in REFUSED}
    assert refused == {
        ("fp16", True, False), ("fp16", False, True), ("fp16", True, True),
        ("te-fp8", True, False), ("te-fp8", False, True), ("te-fp8", True, True),
        ("te-fp8-fused", True, False), ("te-fp8-fused", False, True),
        ("te-fp8-fused", True, True),
    }  # fmt: skip


@pytest.mark.parametrize("cell", REFUSED, ids=_name)
def test_each_refusal_raises_its_reason(cell: Cell) -> None:
    reason = composition_problem(cell.precision, cell.tp, cell.fsdp)
    assert reason is not None and cell.precision in reason and "Use " in reason
    with pytest.raises(ValueError, match="Not supported: "):
        check_composition(cell.precision, cell.tp, cell.fsdp)


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_each_cell_trains_like_one_process(world: int) -> None:
    """Every cell on ``world`` processes: the loss and gradient norm of one process's first
    step, within the precision's tolerance."""
    trained = _train(world)
    assert trained, world
    refs: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for c in RUN:
        if _name(c) not in trained:
            continue
        key = (c.precision, c.fused)
        if key not in refs:
            refs[key] = _single(*key)
        got, want = trained[_name(c)], refs[key]
        assert len(got) == STEPS, _name(c)
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want], rel=_rel(c.precision))
        norms = pytest.approx([w[1] for w in want], rel=_norm_rel(c.precision))
        assert [g[1] for g in got] == norms, _name(c)
