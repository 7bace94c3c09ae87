"""Every cell of the composition table (``parallel.compose``): refused with its reason, or
trained under that layout and compared with one process.

Spawns run the cells that train, one step each (its loss checks the forward pass, its gradient
norm the backward): on 2 gloo ranks TP alone (tp 2, a data-parallel group of one rank each) and
FSDP2 alone (dp 2); on 4, both (dp 2 x tp 2). Every precision unfused; fused, the precisions
in ``FUSED`` under both, FP32 under each alone. ``torch.compile`` (Inductor, compiling for real:
tens of seconds per model on a CPU) runs once here, in ``test_parallel_2d`` (FP8 under dp 2 x
tp 2). Every cell, compiled and fused ones included, runs in ``benchmarks/composition.py``,
whose newest record must cover today's table with every trained cell within its tolerance.
"""

from __future__ import annotations

import pytest
from composition_cells import cell_layout, cell_name, cell_tolerance, one_process, train_cells

from tutorial_lib.bench import load_results
from tutorial_lib.parallel.compose import Cell, composition_problem, composition_table

STEPS = 1  # its loss checks the forward pass, its gradient norm the backward
TRAINED = [c for c in composition_table() if c.problem is None]
REFUSED = [c for c in composition_table() if c.problem is not None]
_name = cell_name

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


WORLDS = sorted({len(cell_layout(c)[0]) for c in RUN})  # one spawn per size


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
def test_each_refusal_gives_its_reason_and_the_fix(cell: Cell) -> None:
    """(``build_model`` raises it: tests/test_fused_model.py, tests/test_data_parallel.py.)"""
    reason = composition_problem(cell.precision, cell.tp, cell.fsdp)
    assert reason is not None and cell.precision in reason and "Use " in reason


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_each_cell_trains_like_one_process(world: int) -> None:
    """Every cell on ``world`` processes: the loss and gradient norm of one process's first
    step, within the precision's tolerance."""
    trained = train_cells(RUN, world, STEPS)
    assert trained, world
    refs: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for c in RUN:
        if _name(c) not in trained:
            continue
        key = (c.precision, c.fused)
        if key not in refs:
            refs[key] = one_process(*key, steps=STEPS)
        got, want = trained[_name(c)], refs[key]
        loss_rel, norm_rel = cell_tolerance(c.precision)
        assert len(got) == STEPS, _name(c)
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want], rel=loss_rel)
        assert [g[1] for g in got] == pytest.approx([w[1] for w in want], rel=norm_rel), _name(c)


def test_the_recorded_sweep_trained_every_cell() -> None:
    """The newest ``benchmarks/composition.py`` record holds every cell of today's table: each
    refused one refused, each other one trained within its tolerance of one process. A new
    precision, or a cell that stopped agreeing, needs a new sweep."""
    records = load_results("composition")
    assert records, "No composition record: run benchmarks/composition.py."
    record = records[0]
    assert record["meta"]["cells"] == "all"
    rows = {row["cell"]: row for row in record["rows"]}
    table = composition_table()
    assert set(rows) == {_name(c) for c in table}
    for c in table:
        row = rows[_name(c)]
        if c.problem is not None:
            assert row["result"] == "refused" and row["reason"] == c.problem, _name(c)
            continue
        loss_rel, norm_rel = cell_tolerance(c.precision)
        assert row["result"] == "within tolerance", _name(c)
        assert row["loss_rel_diff"] <= loss_rel and row["grad_norm_rel_diff"] <= norm_rel, _name(c)
