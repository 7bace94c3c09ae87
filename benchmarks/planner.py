"""Time the failure planner: planning one failure pattern on the NTP paper's 32,768 GPUs per
policy, and whole ``ntp-reproduce`` runs.

    python benchmarks/planner.py [--fraction 0.002] [--runs quick,default] [--samples 32]
                                 [--repeats 5] [--seed 0] [--out DIR]

Rows, each with the median wall time of ``--repeats`` calls (after one warm-up call; a
``ntp-reproduce`` run is timed once per repeat without a warm-up, it takes seconds):

- ``plan <policy>``: ``plan_cluster(TrainingJob.paper(), failed, policy)`` for ``--fraction`` of
  the GPUs failed uniformly at random, with what the plan says (replicas, degraded replicas,
  relative throughput, the most power a replica draws);
- ``ntp-reproduce --quick`` / ``ntp-reproduce``: ``cluster.ntp_reproduce`` at ``--samples``.

The planner is numpy on the CPU whatever the machine has, so the results are stamped with the CPU
(``environment_stamp("cpu")``) and written through ``perf.write_and_print("planner", ...)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.cluster.failures import random_failures
from tutorial_lib.cluster.plan_options import PLAN_POLICIES
from tutorial_lib.cluster.plans import plan_cluster
from tutorial_lib.cluster.replica_cost import TrainingJob
from tutorial_lib.cluster.reproduce import ntp_reproduce
from tutorial_lib.config import get_preset
from tutorial_lib.perf import benchmark

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
RUNS = ("quick", "default")


def _runs(text: str) -> list[str]:
    runs = [r.strip() for r in text.split(",") if r.strip()]
    if not runs or not set(runs) <= set(RUNS):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {RUNS}, got {text!r}"
        )
    return runs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument("--fraction", type=float, default=0.002, help="failed share for the plans")
    p.add_argument("--runs", type=_runs, default=list(RUNS), help="ntp-reproduce modes to time")
    p.add_argument("--samples", type=int, default=32, help="ntp-reproduce --samples")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.samples < 1:
        p.error("--repeats and --samples must be positive")
    if not 0 <= args.fraction <= 1:
        p.error(f"--fraction must lie in [0, 1], got {args.fraction}")
    return args


def plan_rows(args: argparse.Namespace, job: TrainingJob) -> list[dict[str, Any]]:
    failed = random_failures(job.cluster.n_gpus, args.fraction, seed=args.seed)
    rows = []
    for policy in PLAN_POLICIES:
        timing = benchmark(
            lambda p=policy: plan_cluster(job, failed, p),
            warmup=1,
            iters=args.repeats,
            device="cpu",
        )
        result = plan_cluster(job, failed, policy)
        rows.append(
            {
                "op": f"plan {policy}",
                "gpus": job.cluster.n_gpus,
                "failed": len(failed),
                "median_ms": timing.median * 1e3,
                "replicas": len(result.replicas),
                "degraded": sum(r.failed > 0 for r in result.replicas),
                "throughput": result.throughput,
                "max_power": max((r.power for r in result.replicas), default=1.0),
            }
        )
    return rows


def reproduce_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for run in args.runs:
        quick = run == "quick"
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            report = ntp_reproduce(seed=args.seed, samples=args.samples, quick=quick)
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "op": "ntp-reproduce --quick" if quick else "ntp-reproduce",
                "gpus": report["availability"]["gpus"],
                "failed": None,
                "median_ms": float(np.median(times)) * 1e3,
                "replicas": None,
                "degraded": None,
                "throughput": None,
                "max_power": None,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the benchmark; returns the path of the JSON written."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    job = TrainingJob.paper()
    rows = plan_rows(args, job) + reproduce_rows(args)
    env = {**environment_stamp(torch.device("cpu")), "preset": preset.name}
    meta = {
        "job": "cluster.TrainingJob.paper()",
        "fraction": args.fraction,
        "samples": args.samples,
        "seed": args.seed,
        "repeats": args.repeats,
        "numpy": np.__version__,
        "timing": "median wall time; plans after one warm-up call, ntp-reproduce runs without",
    }
    title = f"planner benchmark, preset {preset.name}"
    return write_and_print("planner", title, rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
