"""Measure what FP8 buys: GEMM throughput by hidden size, and training tokens/s per policy.

    python benchmarks/fp8.py [--preset ci|hopper] [--sizes 256,512,...] [--tokens N]
                             [--iters N] [--out DIR]

(a) ``fp8_gemm``: for each hidden size h, an MLP up-projection GEMM (tokens x h) @ (h x 4h),
    timed with ``perf.benchmark`` three ways: BF16 ``torch.matmul``; the FP8 GEMM
    ``fp8.scaled_gemm`` (E4M3 operands, unit inverse scales, BF16 output): ``torch._scaled_mm``
    on FP8 tensor cores, the exact FP32 emulation on a CPU; and the cast of both BF16 operands to
    E4M3 (``fp8.formats.quantize``), which FP8 pays and BF16 does not. One row per (h, op). On a
    CUDA GPU below sm_89 the FP8 row is skipped with the reason. On a CPU every row runs and
    carries a ``note``: nothing there is a tensor core.
(b) ``fp8_train``: one full training step of the preset's model under ``bf16``, ``fp8`` and
    ``te-fp8`` (``perf.benchmark_policies``); a policy this machine cannot run (``te-fp8``
    without Transformer Engine) is a row with ``skipped`` and the reason.

(c) ``fp8_recipe_gemm``: for each hidden size h, the same GEMM quantized by the per-tensor
    (current), row-wise and block recipes (``fp8.recipes``; x (tokens, h) and w (4h, h) quantized
    outside the timing), run through ``linear_function.quantized_matmul`` the way ``FP8Linear``
    runs it on this device: natively where ``check_recipe_device`` says so (``torch._scaled_mm``;
    the block recipe through torch's blockwise kernel on sm_90, ``fp8.tiled_gemm``), else the
    emulation. A native row also runs the emulation on the same operands and records
    ``max_rel_diff_vs_emulation`` (max |native - emulated| / max |emulated|, BF16 output): the
    check that the native kernel reads the scales as the emulation applies them. A recipe this GPU
    cannot run is a ``skipped`` row with ``check_recipe_device``'s reason.

All go through ``bench.write_results`` (stamped with device and date) and are printed.
Numbers are for the device this ran on, and say so: a CPU run is a CPU result.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tutorial_lib.bench import (
    benchmark_policies,
    environment_stamp,
    markdown_table,
    results_label,
    write_results,
)
from tutorial_lib.config import RunPreset, get_preset
from tutorial_lib.fp8.formats import E4M3, quantize
from tutorial_lib.fp8.gemm import scaled_gemm
from tutorial_lib.fp8.linear_function import quantized_matmul
from tutorial_lib.fp8.native import check_recipe_device
from tutorial_lib.fp8.recipes import make_recipe
from tutorial_lib.hardware import default_device, describe_device, fp8_gemm_status
from tutorial_lib.perf import BenchResult, benchmark, l2_cache_bytes, make_rotating_inputs

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
# preset -> (hidden sizes, tokens) of the GEMM sweep. Small at ci: CPUs without BF16 matrix
# instructions run BF16 GEMMs at a few GFLOP/s.
GEMM_DEFAULTS: dict[str, tuple[tuple[int, ...], int]] = {
    "ci": ((128, 256, 512), 256),
    "hopper": ((1024, 2048, 4096, 8192), 16384),
}
TRAIN_POLICIES = ("bf16", "fp8", "te-fp8")
RECIPE_GEMMS = ("current", "rowwise", "block")
CPU_NOTES = {
    "bf16 matmul": "CPU: not a tensor-core result",
    "fp8 gemm": "CPU: emulation (widen to FP32, FP32 matmul); not an FP8 tensor-core result",
    "fp8 cast": "CPU: a CPU cast; not a GPU result",
}


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="ci or hopper (default: $TUTORIAL_PRESET/auto)")
    p.add_argument("--sizes", type=_int_list, default=None, help="hidden sizes, e.g. 256,512")
    p.add_argument("--tokens", type=int, default=None, help="GEMM rows (default: per preset)")
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed iterations (default: the preset's bench_iters)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    args = p.parse_args(argv)
    if args.iters is not None and args.iters < 1:
        p.error(f"--iters must be >= 1, got {args.iters}")
    if args.tokens is not None and args.tokens < 1:
        p.error(f"--tokens must be >= 1, got {args.tokens}")
    if args.sizes is not None and (not args.sizes or min(args.sizes) < 1):
        p.error(f"--sizes must be positive integers, got {args.sizes}")
    return args


def fp8_skip_reason(device: torch.device, tokens: int, h: int) -> str | None:
    """Why an FP8 GEMM of this shape cannot run on ``device``'s tensor cores, or None."""
    if device.type != "cuda":
        return None  # the CPU runs the FP32 emulation: the row runs, with a note
    ok, reason = fp8_gemm_status(device)
    if not ok:
        return reason
    if tokens % 16 or h % 16:
        return f"_scaled_mm needs every dimension divisible by 16; got tokens {tokens}, h {h}"
    return None


def _row(
    op: str, tokens: int, h: int, seconds: BenchResult, device: torch.device, sets: int
) -> dict[str, Any]:
    row = {
        "op": op,
        "h": h,
        "m": tokens,
        "n": 4 * h,
        "k": h,
        "time_ms": 1e3 * seconds.median,
        "time_min_ms": 1e3 * seconds.min,
        "iters": seconds.iters,
        "input_sets": sets,  # rotated, together over twice the last-level cache
    }
    if device.type == "cpu":
        row["note"] = CPU_NOTES[op]
    return row


def _fp8_rows(
    sets: list[tuple], t_bf16: BenchResult, timing: tuple[int, int]
) -> list[dict[str, Any]]:
    """The FP8 GEMM and the cast of its operands, for rotating BF16 sets of ``a`` (tokens, h)
    and ``b`` (h, 4h)."""
    a, b = sets[0]
    (tokens, h), device = a.shape, a.device
    one = torch.ones((), dtype=torch.float32, device=device)

    def to_fp8(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a8, b8 = quantize(a, E4M3, one), quantize(b, E4M3, one)
        if device.type == "cuda":  # cuBLASLt's FP8 GEMM wants the second operand column-major
            b8 = b8.t().contiguous().t()
        return a8, b8

    sets8 = [to_fp8(a, b) for a, b in sets]

    def fp8_gemm(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
        return scaled_gemm(a8, one, b8, one, None, torch.bfloat16)

    def cast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(a, E4M3, one), quantize(b, E4M3, one)

    t_fp8 = benchmark(fp8_gemm, *timing, device, inputs=sets8)
    t_cast = benchmark(cast, *timing, device, inputs=sets)
    fp8 = {
        **_row("fp8 gemm", tokens, h, t_fp8, device, len(sets8)),
        "tflops": 8.0 * tokens * h * h / t_fp8.median / 1e12,
    }
    if device.type == "cuda":  # on a CPU the ratio compares two emulations: left out
        fp8["speedup_vs_bf16"] = t_bf16.median / t_fp8.median
        fp8["speedup_with_cast"] = t_bf16.median / (t_fp8.median + t_cast.median)
    cast_bytes = 3 * (a.numel() + b.numel())  # read BF16 (2 B), write FP8 (1 B)
    cast_row = {
        **_row("fp8 cast", tokens, h, t_cast, device, len(sets)),
        "gb_per_s": cast_bytes / t_cast.median / 1e9,
    }
    return [fp8, cast_row]


def gemm_rows(
    tokens: int, h: int, device: torch.device, timing: tuple[int, int]
) -> list[dict[str, Any]]:
    """The BF16 GEMM, the FP8 GEMM (or why it was skipped) and the FP8 cast, for one h.

    Each is timed on rotating copies of its operands that together exceed twice the last-level
    cache (chapter 2's rule), so every call reads them from memory, as in a training step."""
    gen = torch.Generator(device=device).manual_seed(0)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randn(tokens, h, generator=gen, device=device).to(torch.bfloat16)
        return a, torch.randn(h, 4 * h, generator=gen, device=device).to(torch.bfloat16)

    cache = l2_cache_bytes(device) or 50 * 2**20  # unknown: an H100's 50 MB
    sets = make_rotating_inputs(make, 2 * cache)
    t_bf16 = benchmark(torch.matmul, *timing, device, inputs=sets)
    bf16 = {
        **_row("bf16 matmul", tokens, h, t_bf16, device, len(sets)),
        "tflops": 8.0 * tokens * h * h / t_bf16.median / 1e12,
    }
    reason = fp8_skip_reason(device, tokens, h)
    if reason is None:
        return [bf16, *_fp8_rows(sets, t_bf16, timing)]
    skipped = {"op": "fp8 gemm", "h": h, "m": tokens, "n": 4 * h, "k": h, "skipped": reason}
    return [bf16, skipped]


def recipe_gemm_rows(
    tokens: int, h: int, device: torch.device, timing: tuple[int, int]
) -> list[dict[str, Any]]:
    """(c) of the module docstring: one row per recipe of ``RECIPE_GEMMS`` for one h."""
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(tokens, h, generator=gen, device=device).to(torch.bfloat16)
    w = (0.02 * torch.randn(4 * h, h, generator=gen, device=device)).to(torch.bfloat16)
    rows = []
    for name in RECIPE_GEMMS:
        recipe = make_recipe(name)
        row: dict[str, Any] = {"op": f"{name} gemm", "h": h, "m": tokens, "n": 4 * h, "k": h}
        try:
            emulated = check_recipe_device(recipe, device, None, who="benchmarks/fp8.py")
        except RuntimeError as err:
            rows.append({**row, "skipped": str(err)})
            continue
        xq, wq = recipe.quantizer("input").quantize(x), recipe.quantizer("weight").quantize(w)

        def gemm(emulate: bool, xq: Any = xq, wq: Any = wq) -> torch.Tensor:
            return quantized_matmul(xq, wq, torch.bfloat16, emulate)

        t = benchmark(functools.partial(gemm, emulated), *timing, device)
        row.update(
            native=not emulated,
            time_ms=1e3 * t.median,
            time_min_ms=1e3 * t.min,
            iters=t.iters,
            tflops=8.0 * tokens * h * h / t.median / 1e12,
        )
        if emulated:
            row["note"] = ("CPU: " if device.type == "cpu" else "") + "emulation (FP32 sums)"
        else:
            ref = gemm(True).float()
            diff = (gemm(False).float() - ref).abs().max() / ref.abs().max()
            row["max_rel_diff_vs_emulation"] = float(diff)
        rows.append(row)
    return rows


def train_rows(preset: RunPreset, device: torch.device, timing: tuple[int, int]) -> list[dict]:
    """``benchmark_policies`` for bf16, fp8 and te-fp8; on a CPU the fp8 row says it emulates."""
    rows = benchmark_policies(preset, device=device, policies=list(TRAIN_POLICIES), timing=timing)
    for row in rows:
        if device.type == "cpu" and row["policy"] == "fp8" and "skipped" not in row:
            extra = "FP8 GEMMs emulated in FP32 on a CPU (FP32 sums)"
            row["note"] = f"{row['note']}; {extra}" if row.get("note") else extra
    return rows


def _print(title: str, env: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    print(f"{title}: {results_label({'environment': env})}")
    print(markdown_table(rows))
    print(f"wrote {path} and {path.with_suffix('.md').name}\n")


def main(argv: Sequence[str] | None = None) -> tuple[Path, Path, Path]:
    """Run the three benchmarks; returns the paths of their JSON files (fp8_gemm, fp8_train,
    fp8_recipe_gemm)."""
    args = parse_args(argv)
    preset = get_preset(args.preset)
    device = default_device()
    sizes, tokens = GEMM_DEFAULTS.get(preset.name, GEMM_DEFAULTS["ci"])
    sizes, tokens = args.sizes or list(sizes), args.tokens or tokens
    iters = args.iters or preset.bench_iters
    timing = (min(preset.bench_warmup, iters), iters)
    env = {**environment_stamp(device), "preset": preset.name}
    print(env["device_summary"])
    base = {
        "preset": preset.name,
        "warmup": timing[0],
        "iters": timing[1],
        "cpu_threads": torch.get_num_threads(),
    }
    gemm = [row for h in sizes for row in gemm_rows(tokens, h, device, timing)]
    gemm_meta = {
        **base,
        "tokens": tokens,
        "sizes": sizes,
        "fp8_gemm_status": fp8_gemm_status(device)[1],
        "timing": "median per call; GEMM (tokens x h) @ (h x 4h), BF16 output; "
        "fp8 cast = both operands BF16 -> E4M3",
    }
    gemm_path = write_results("fp8_gemm", gemm, args.out, gemm_meta, environment=env)
    _print(f"fp8 GEMM benchmark, preset {preset.name}", env, gemm, gemm_path)
    recipe = [row for h in sizes for row in recipe_gemm_rows(tokens, h, device, timing)]
    recipe_meta = {
        **gemm_meta,
        "recipes": list(RECIPE_GEMMS),
        "timing": "median per call of the quantized GEMM (tokens x h) @ (4h x h)^T, BF16 "
        "output, operands quantized once outside the timing (not rotated)",
    }
    recipe_path = write_results("fp8_recipe_gemm", recipe, args.out, recipe_meta, environment=env)
    _print(f"fp8 recipe GEMM benchmark, preset {preset.name}", env, recipe, recipe_path)
    train = train_rows(preset, device, timing)
    cfg = preset.model_config()
    train_meta = {
        **base,
        "model": preset.model,
        "model_config": dataclasses.asdict(cfg),
        "batch": preset.bench_batch_size,
        "bf16_supported": describe_device(device).bf16_supported,
        "timing": "median of iters full training steps (AdamW), synthetic tokens",
    }
    train_path = write_results("fp8_train", train, args.out, train_meta, environment=env)
    _print(f"fp8 training benchmark, preset {preset.name}", env, train, train_path)
    return gemm_path, train_path, recipe_path


if __name__ == "__main__":
    main(sys.argv[1:])
