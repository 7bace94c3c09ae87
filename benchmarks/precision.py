"""Time one full training step (forward, backward, AdamW) under each precision policy.

    python benchmarks/precision.py [--preset ci|hopper] [--policies fp32,bf16,...] [--steps N]
                                   [--model NAME] [--batch N] [--out DIR]

For every policy (default: all registered) the script checks that this device can run it; if
not, the row records ``skipped`` and the reason. Otherwise it builds the preset's model, times
steps on synthetic tokens with ``perf.benchmark`` and records step time, tokens/s, MFU against
the datasheet (``None`` off the spec table, e.g. on a CPU) and peak memory. Results go through
``bench.write_results("precision", ...)`` and are printed as a table.

Numbers are for the device this ran on, and say so: a CPU run is a CPU result.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from tutorial_lib.bench import benchmark_policies, environment_stamp, write_and_print
from tutorial_lib.config import get_preset
from tutorial_lib.hardware import default_device
from tutorial_lib.precision import available_policies

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument("--policies", default=None, help="comma-separated (default: all registered)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps (default: the preset's bench_iters); warm-up min(preset, N)",
    )
    p.add_argument("--model", default=None, help="a MODEL_SIZES name instead of the preset's")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: preset)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    return args


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the benchmark; returns the path of the JSON written."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    if args.model is not None:
        preset = dataclasses.replace(preset, model=args.model)
    cfg = preset.model_config()
    batch = args.batch or preset.bench_batch_size
    timing = (preset.bench_warmup, preset.bench_iters)
    if args.steps is not None:
        timing = (min(preset.bench_warmup, args.steps), args.steps)
    names = [n.strip() for n in args.policies.split(",")] if args.policies else None
    rows = benchmark_policies(
        preset, policies=names or available_policies(), batch=batch, timing=timing
    )
    env = {**environment_stamp(default_device()), "preset": preset.name}
    meta = {
        "preset": preset.name,
        "model": preset.model,
        "model_config": dataclasses.asdict(cfg),
        "batch": batch,
        "warmup": timing[0],
        "iters": timing[1],
        "cpu_threads": torch.get_num_threads(),
        "timing": "median of iters full training steps (AdamW), synthetic tokens",
    }
    title = f"precision benchmark, preset {preset.name}"
    return write_and_print("precision", title, rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
