"""What Hopper's accumulation costs the CPU emulation: a training step, exact sums against Hopper's.

    python benchmarks/fp8_accumulation.py [--preset ci|hopper] [--precisions fp8,fp8-block,...]
                                          [--rounds N] [--batch N] [--out DIR]

For each FP8 precision (default: every one, ``fp8.policy.FP8_RECIPE_POLICIES``) the script builds
the preset's model twice from the same seed, under ``<precision>`` (the emulation's float32 sums,
``accumulation="exact"``) and ``<precision>+hopper-acc`` (the sums of an H100's FP8 tensor cores,
``fp8.mma``), and times one full training step (forward, backward, AdamW) of each, alternating
between the two for ``--rounds`` rounds after a warm-up step each, so that a machine whose load
changes during the run slows both alike. A row has the median step of each, their ratio, and
whether the ratio is within ``BUDGET`` (the most the issue allows at the ``ci`` preset). MXFP8
and NVFP4 have no Hopper accumulation to model: their two rows time the same float32 sums.

On a GPU both variants run natively (the tensor cores sum as they do: ``accumulation`` only
changes the CPU emulation), so the ratio shows nothing there; a precision the GPU cannot run is a
row with ``skipped`` and the reason. Results go through ``bench.write_results(
"fp8_accumulation", ...)``, stamped with device and date; ``meta`` also records the CPU threads
and the load average before and after, since a shared machine's load moves these timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.bench.policy_bench import make_step
from tutorial_lib.config import get_preset
from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES, fp8_policy_name
from tutorial_lib.hardware import default_device
from tutorial_lib.perf import benchmark
from tutorial_lib.precision import get_policy

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
BUDGET = 20.0  # a Hopper-accumulation step may cost at most this many exact steps (ci preset)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument("--precisions", default=None, help="comma-separated (default: every FP8 one)")
    p.add_argument("--rounds", type=int, default=7, help="timed steps of each variant (7)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: preset)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def time_pair(
    steps: dict[str, Callable[[], None]], rounds: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per step of each of ``steps``, one warm-up step each, then ``rounds`` rounds of
    one timed step each, in turn."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(rounds):
        for name, step in steps.items():
            times[name] += benchmark(step, warmup=0, iters=1, device=device).times
    return times


def precision_row(
    precision: str, preset: Any, batch: int, rounds: int, device: torch.device
) -> dict[str, Any]:
    """One row: exact and Hopper-accumulation steps of ``precision``, or why it was skipped."""
    cfg = preset.model_config()
    row: dict[str, Any] = {"precision": precision, "model": preset.model, "batch": batch}
    names = {acc: fp8_policy_name(precision, acc) for acc in ("exact", "hopper")}
    try:
        policies = {acc: get_policy(name, device) for acc, name in names.items()}
    except RuntimeError as exc:
        return {**row, "skipped": str(exc)}
    steps = {acc: make_step(policy, cfg, batch, device)[0] for acc, policy in policies.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # MXFP8, NVFP4: "keeps float32 sums"
        times = time_pair(steps, rounds, device)
    exact, hopper = (1e3 * statistics.median(times[acc]) for acc in ("exact", "hopper"))
    row.update(
        exact_ms=exact,
        hopper_ms=hopper,
        ratio=hopper / exact,
        within_budget=hopper / exact <= BUDGET,
        exact_min_ms=1e3 * min(times["exact"]),
        hopper_min_ms=1e3 * min(times["hopper"]),
        rounds=rounds,
    )
    if precision in ("mxfp8", "nvfp4"):
        row["note"] = "no Hopper tensor cores for this recipe: both sum in float32"
    elif device.type == "cuda":
        row["note"] = "GPU: both run natively (the setting changes the CPU emulation only)"
    return row


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the benchmark; returns the path of the JSON written."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    device = default_device()
    batch = args.batch or preset.bench_batch_size
    precisions = args.precisions.split(",") if args.precisions else list(FP8_RECIPE_POLICIES)
    load_before = os.getloadavg()
    rows = [precision_row(p.strip(), preset, batch, args.rounds, device) for p in precisions]
    env = {**environment_stamp(device), "preset": preset.name}
    meta = {
        "preset": preset.name,
        "model": preset.model,
        "model_config": dataclasses.asdict(preset.model_config()),
        "batch": batch,
        "rounds": args.rounds,
        "budget_ratio": BUDGET,
        "cpu_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "timing": "median of rounds full training steps (AdamW) on synthetic tokens, the exact "
        "and Hopper-accumulation steps alternating, one warm-up step each",
    }
    title = f"FP8 accumulation benchmark, preset {preset.name}"
    return write_and_print("fp8_accumulation", title, rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
