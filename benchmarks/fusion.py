"""Kernel fusion, measured: each memory-bound op in three versions, and the whole training step.

    python benchmarks/fusion.py [--preset ci|hopper] [--dtype fp32|bf16] [--iters N] [--out DIR]

Ops, at the preset model's shapes (M = batch x sequence rows, C = width, V = vocabulary):
bias + GELU (M, 4C), LayerNorm (M, C), residual add + LayerNorm (M, C), attention-row softmax
(B x heads x T, T) and cross-entropy (M, V). Each op runs as

- ``eager``: the PyTorch one would write (``F.gelu(x + b)``, ``x + r`` then ``F.layer_norm``...);
- ``compile``: the same function through ``torch.compile`` (Inductor: Triton on a GPU, C++ on
  a CPU);
- ``triton``: our kernel from ``tutorial_lib.kernels``, on a CUDA GPU only (on a CPU it runs in
  Triton's interpreter, whose time measures Python, not memory: the row says so).

Each row has the median time, the op's minimum HBM traffic (``kernels.traffic``), the achieved
bandwidth against that minimum and, on a GPU in the spec table, the fraction of the datasheet's
HBM bandwidth. The whole-step part trains the preset's model for a few steps eager, compiled and
(on a GPU) with our kernels, through the ladder's ``run_rung``. Everything is written through
``bench.write_results("fusion", ...)``: numbers are for the device this ran on, and say so.
The measuring code is ``tutorial_lib.bench.fusion_bench`` (chapter 7 calls it too).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from tutorial_lib import kernels
from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.bench.fusion_bench import op_cases, step_rows, time_ops
from tutorial_lib.config import get_preset
from tutorial_lib.hardware import default_device

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default=None,
        help="op dtype (default: bf16 on a GPU, fp32 on a CPU)",
    )
    p.add_argument("--iters", type=int, default=None, help="timed calls per op (default: preset)")
    p.add_argument("--steps", type=int, default=None, help="training steps per whole-step row")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    for name in ("iters", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the benchmark; returns the path of the JSON written."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    device = default_device()
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    timing = (preset.bench_warmup + 1, args.iters or preset.bench_iters)  # +1: compile call
    rows = time_ops(op_cases(preset, dtype, device), device, timing)
    steps = args.steps or max(3, preset.bench_warmup + preset.bench_iters)
    rows += [{"op": "training step", **r} for r in step_rows(preset, device, steps)]
    env = {**environment_stamp(device), "preset": preset.name}
    _, triton_why = kernels.triton_status()
    meta = {
        "preset": preset.name,
        "model": preset.model,
        "model_config": dataclasses.asdict(preset.model_config()),
        "batch": preset.bench_batch_size,
        "warmup": timing[0],
        "iters": timing[1],
        "steps": steps,
        "cpu_threads": torch.get_num_threads(),
        "triton": triton_why,
        "timing": "ops: median forward call, no autograd; steps: median Trainer step",
    }
    title = f"fusion benchmark, preset {preset.name}"
    return write_and_print("fusion", title, rows, args.out, meta, env)


if __name__ == "__main__":
    main(sys.argv[1:])
