"""Time the failure simulator: seeded failure traces and random failures with replica availability.

    python benchmarks/failures.py [--gpus 32768,131072] [--days 15] [--avail-gpus 32768]
                                  [--fraction 0.001] [--domain-size 64] [--tp 8,16,32,64]
                                  [--hardware-days 5] [--repeats 5] [--seed 0] [--out DIR]

Two kinds of rows, each with the median wall time of ``--repeats`` calls (after one warm-up):

- ``simulate_trace``: a ``--days`` trace of ``FailureModel.llama3(hardware_days=...)`` for each
  cluster size in ``--gpus``, with what that trace says: failures, mean and peak failed share,
  and the share of time with more than ``--threshold`` of the GPUs down (the NTP paper reports
  81% for > 0.1% over 15 days);
- ``random_failures + availability``: ``--fraction`` of ``--avail-gpus`` GPUs failed uniformly at
  random, and the share of TP-``tp`` replicas (scale-up domains of ``--domain-size``) left
  without a failed GPU, next to the hypergeometric expectation.

The code is numpy on the CPU whatever the machine has, so the results are stamped with the CPU
(``environment_stamp("cpu")``) and written through ``perf.write_results("failures", ...)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.cluster.failures import (
    FailureModel,
    expected_replica_availability,
    fraction_of_time_above,
    random_failures,
    simulate_trace,
)
from tutorial_lib.cluster.replicas import replica_availability
from tutorial_lib.config import get_preset
from tutorial_lib.perf import benchmark

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument("--gpus", type=_int_list, default=[32768, 131072], help="trace cluster sizes")
    p.add_argument("--days", type=float, default=15.0, help="trace length in days")
    p.add_argument("--hardware-days", type=float, default=5.0, help="hardware recovery (days)")
    p.add_argument("--threshold", type=float, default=0.001, help="failed share for 'time above'")
    p.add_argument("--avail-gpus", type=int, default=32768, help="cluster size for availability")
    p.add_argument("--fraction", type=float, default=0.001, help="failed share for availability")
    p.add_argument("--domain-size", type=int, default=64, help="GPUs per scale-up domain")
    p.add_argument("--tp", type=_int_list, default=[8, 16, 32, 64], help="TP degrees")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    for name in ("days", "hardware_days", "repeats", "avail_gpus", "domain_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("threshold", "fraction"):
        if not 0 <= getattr(args, name) <= 1:
            p.error(f"--{name} must lie in [0, 1], got {getattr(args, name)}")
    return args


def trace_rows(args: argparse.Namespace, model: FailureModel) -> list[dict[str, Any]]:
    rows = []
    for n in args.gpus:
        timing = benchmark(
            lambda n=n: simulate_trace(model, n, args.days, seed=args.seed),
            warmup=1,
            iters=args.repeats,
            device="cpu",
        )
        trace = simulate_trace(model, n, args.days, seed=args.seed)
        share = trace.failed_fraction()
        rows.append(
            {
                "op": "simulate_trace",
                "gpus": n,
                "days": args.days,
                "median_ms": timing.median * 1e3,
                "failures": trace.n_failures,
                "mean_failed_pct": 100 * float(share.mean()),
                "peak_failed_pct": 100 * float(share.max()),
                "time_above_threshold": fraction_of_time_above(trace, args.threshold),
            }
        )
    return rows


def availability_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    n = args.avail_gpus
    for tp in args.tp:

        def run(tp: int = tp) -> float:
            failed = random_failures(n, args.fraction, seed=args.seed)
            return replica_availability(n, args.domain_size, tp, failed)

        timing = benchmark(run, warmup=1, iters=args.repeats, device="cpu")
        n_failed = len(random_failures(n, args.fraction, seed=args.seed))
        rows.append(
            {
                "op": "random_failures + availability",
                "gpus": n,
                "tp": tp,
                "domain_size": args.domain_size,
                "failed": n_failed,
                "median_ms": timing.median * 1e3,
                "availability": run(),
                "expected": expected_replica_availability(n, tp, n_failed),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the benchmark; returns the path of the JSON written."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    model = FailureModel.llama3(hardware_days=args.hardware_days)
    rows = trace_rows(args, model) + availability_rows(args)
    env = {**environment_stamp(torch.device("cpu")), "preset": preset.name}
    meta = {
        "model": {
            "rate_per_gpu_hour": model.rate_per_gpu_hour,
            "hardware_fraction": model.hardware_fraction,
            "hardware_recovery_hours": model.hardware.mean_hours,
            "software_recovery_hours": model.software.mean_hours,
            "dist": model.hardware.dist,
        },
        "days": args.days,
        "threshold": args.threshold,
        "fraction": args.fraction,
        "seed": args.seed,
        "repeats": args.repeats,
        "numpy": np.__version__,
        "timing": "median wall time of one call after one warm-up call, numpy on the CPU",
    }
    title = f"failures benchmark, preset {preset.name}"
    return write_and_print("failures", title, rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
