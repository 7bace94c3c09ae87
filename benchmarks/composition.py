"""Every cell of the composition table, trained against one process: the full sweep.

    python benchmarks/composition.py [--cells all|compiled|uncompiled] [--steps 1] [--out DIR]

``tutorial_lib.parallel.compose`` lists every combination of precision, fused kernels,
``torch.compile`` (Inductor, compiling for real), tensor parallelism and FSDP2. The test suite runs
the cells that fit its time budget (``tests/test_composition.py``); this script runs every cell
that trains, on gloo CPU processes (TP alone: tp 2 on 2 processes; FSDP2 alone: dp 2; both:
dp 2 x tp 2 on 4), and the same steps in one process, and records per cell the loss and gradient
norm of both, their relative differences and whether they are within ``cell_tolerance``. Refused
cells get a row with the reason. Compiling every cell takes tens of minutes on a 2-core CPU.

The result (``composition``) is stamped with the CPU; ``tests/test_composition.py`` checks that the
newest record covers every cell of today's table and that every trained cell passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.config import get_preset
from tutorial_lib.parallel.compose import composition_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from composition_cells import (  # noqa: E402 (the test harness the suite uses)
    CELL_MODEL,
    cell_layout,
    cell_name,
    cell_tolerance,
    one_process,
    train_cells,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
CHOICES = ("all", "compiled", "uncompiled")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", choices=CHOICES, default="all", help="which trained cells to run")
    p.add_argument("--steps", type=int, default=1, help="training steps per cell")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def sweep(cells: str = "all", steps: int = 1) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rows (one per cell of the table) and seconds per spawn."""
    table = composition_table()
    trained = [
        c
        for c in table
        if c.problem is None and (cells == "all" or c.compile == (cells == "compiled"))
    ]
    got: dict[str, list[tuple[float, float]]] = {}
    seconds = {}
    for world in sorted({len(cell_layout(c)[0]) for c in trained}):
        t0 = time.perf_counter()
        got.update(train_cells(trained, world, steps, timeout_s=7200))
        seconds[f"{world} processes"] = round(time.perf_counter() - t0, 1)
    refs: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    rows = []
    for c in table:
        row: dict[str, Any] = {
            "cell": cell_name(c), "precision": c.precision, "fused": c.fused,
            "compile": c.compile, "tp": c.tp, "fsdp": c.fsdp,
        }  # fmt: skip
        if c.problem is not None:
            rows.append({**row, "result": "refused", "reason": c.problem})
            continue
        if cell_name(c) not in got:
            continue  # not in this sweep's --cells
        key = (c.precision, c.fused)
        if key not in refs:
            refs[key] = one_process(*key, steps=steps)
        mine, ref = got[cell_name(c)][-1], refs[key][-1]  # the last step
        loss_tol, norm_tol = cell_tolerance(c.precision)
        loss_rel, norm_rel = _rel(mine[0], ref[0]), _rel(mine[1], ref[1])
        ok = loss_rel <= loss_tol and norm_rel <= norm_tol
        rows.append({
            **row, "result": "within tolerance" if ok else "OUT OF TOLERANCE",
            "loss": mine[0], "loss_one_process": ref[0], "loss_rel_diff": loss_rel,
            "loss_tolerance": loss_tol, "grad_norm": mine[1], "grad_norm_one_process": ref[1],
            "grad_norm_rel_diff": norm_rel, "grad_norm_tolerance": norm_tol,
        })  # fmt: skip
    return rows, seconds


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the sweep; returns the path of the JSON written."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    rows, seconds = sweep(args.cells, args.steps)
    env = {**environment_stamp(torch.device("cpu")), "preset": get_preset("ci").name}
    meta = {
        "cells": args.cells,
        "steps": args.steps,
        "model": str(CELL_MODEL),
        "backend": "gloo, CPU processes",
        "compile": "torch.compile (Inductor) where a cell says compile",
        "seconds_per_spawn": seconds,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return write_and_print("composition", "composition sweep", rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
