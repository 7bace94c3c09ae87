"""Time our GPT's plain FP32 eager training step against a minimal reference GPT of the same shape.

    python benchmarks/model_speed.py [--steps 10] [--repeats 7] [--batch 16] [--seq 128]
                                     [--layers 4] [--width 128] [--heads 4] [--threads N]
                                     [--models ours,ours-erf,ref-tanh,ref-erf]
                                     [--adamw default,foreach,fused] [--profile-steps N]
                                     [--out DIR] [--name NAME]

Every variant (a model x an AdamW implementation) runs the same plain loop on the same batches:
``_, loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``, with
``AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)`` and all models
starting from the same weights (the references are loaded from ours: ``reference_gpt.py``, whose
``check_equivalence`` runs first). Models:

- ``ours``: ``tutorial_lib.model.GPT`` with the default ``TorchLayers`` (tanh GELU);
- ``ours-erf``: the same with the exact GELU (``reference_gpt.with_exact_gelu``);
- ``ref-tanh``: ``ReferenceGPT(gelu="tanh")``, the same function: equal work;
- ``ref-erf``: ``ReferenceGPT(gelu="erf")``, the exact GELU many minimal GPTs use.

AdamW: ``default`` (no flag: on a CPU that is the per-parameter for-loop; ``foreach`` is the
default on CUDA only), ``foreach=True``, ``fused=True`` (what ``tutorial_lib.train.Trainer``
asks for).

The variants are interleaved in one process: each of ``--repeats`` rounds runs ``--steps`` timed
steps of every variant in turn (the order rotates from round to round), after ``--warmup`` untimed
steps each. A row's ``ms_per_step`` is the median over rounds of each round's median step time;
``spread_pct`` is (max - min) / median of those round medians, a measure of the noise. Ratios
(``vs_<variant>``) are paired: the median over rounds of this round's time over the other's.

``--profile-steps N`` then profiles N steps of each model, one step per ``torch.profiler``
session (record_shapes), the models interleaved, and writes ``<name>_ops``: per op, its calls and
self CPU ms per step for each model (the profiler's own start/stop lines go to stderr).

Results go through ``bench.write_and_print`` (``model_speed__<device>__<preset>__<date>.json``/
``.md``), stamped with the CPU model, torch version and date; ``meta.cpu_threads`` is torch's
thread count, ``meta.loadavg_1min`` the machine's load before and after the timing, and
``meta.round_ms`` every round's median. A CPU result is a CPU result; on a shared machine it also
measures the other load (``--threads 1`` suffers less from it than OpenMP over both cores).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tutorial_lib.bench import environment_stamp, write_and_print
from tutorial_lib.config import GPTConfig
from tutorial_lib.model import GPT
from tutorial_lib.perf import synchronize

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results"
MODELS = ("ours", "ours-erf", "ref-tanh", "ref-erf")
ADAMW = ("default", "foreach", "fused")
N_BATCHES = 4  # distinct batches, cycled


def _load_reference() -> Any:
    """``benchmarks/reference_gpt.py`` (a script, not a package), imported by path."""
    name = "bench_reference_gpt"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "reference_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    p.add_argument("--repeats", type=int, default=7, help="rounds (variants interleaved)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant, once")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128, help="sequence length T (= block_size)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=None, help="default: width // 32")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--models", type=_names, default=list(MODELS), help=",".join(MODELS))
    p.add_argument("--adamw", type=_names, default=["default"], help=",".join(ADAMW))
    p.add_argument("--profile-steps", type=int, default=0, help="profile N steps per model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results folder")
    p.add_argument(
        "--name",
        default="model_speed",
        help="the record's benchmark name (a rerun with the same name, device, preset and day "
        "replaces the file: use e.g. model_speed_1t for a second thread count)",
    )
    args = p.parse_args(argv)
    for name in ("steps", "repeats", "batch", "seq", "layers", "width", "vocab"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.profile_steps < 0:
        p.error("--warmup and --profile-steps must be >= 0")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    args.heads = args.heads or max(1, args.width // 32)
    if args.width % args.heads:
        p.error(f"--width {args.width} is not divisible by --heads {args.heads}")
    for value, allowed, flag in ((args.models, MODELS, "models"), (args.adamw, ADAMW, "adamw")):
        bad = [v for v in value if v not in allowed]
        if bad or not value:
            p.error(f"--{flag}: unknown {bad}; choose from {','.join(allowed)}")
    return args


def build_models(
    cfg: GPTConfig, names: Sequence[str], device: torch.device
) -> dict[str, nn.Module]:
    """Our GPT and the requested references, all holding our GPT's initial weights."""
    ref = _load_reference()
    torch.manual_seed(0)
    ours = GPT(cfg)
    models: dict[str, nn.Module] = {}
    for name in names:
        if name == "ours":
            models[name] = ours
        elif name == "ours-erf":
            models[name] = ref.with_exact_gelu(copy.deepcopy(ours))
        else:
            models[name] = ref.ReferenceGPT(cfg, gelu=name.removeprefix("ref-")).load_from(ours)
    return {name: m.to(device).float().train() for name, m in models.items()}


def make_optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    kwargs: dict[str, Any] = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1}
    if kind == "foreach":
        kwargs["foreach"] = True
    elif kind == "fused":
        kwargs["fused"] = True
    return torch.optim.AdamW(model.parameters(), **kwargs)


def make_step(
    model: nn.Module, opt: torch.optim.Optimizer, batches: Sequence[tuple[torch.Tensor, ...]]
) -> Callable[[int], float]:
    """The plain training loop's body; ``step(i)`` runs it on batch i and returns the loss."""

    def step(i: int) -> float:
        x, y = batches[i % len(batches)]
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def time_interleaved(
    steps: dict[str, Callable[[int], float]],
    n_steps: int,
    repeats: int,
    warmup: int,
    device: torch.device,
) -> dict[str, list[float]]:
    """Per variant, the median step time (s) of each round; variants alternate within a round."""
    names = list(steps)
    for name in names:
        for i in range(warmup):
            steps[name](i)
    counters = dict.fromkeys(names, warmup)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times = []
            for _ in range(n_steps):
                synchronize(device)
                t0 = time.perf_counter()
                steps[name](counters[name])  # float(loss) waits for the step's work
                synchronize(device)
                times.append(time.perf_counter() - t0)
                counters[name] += 1
            medians[name].append(statistics.median(times))
    return medians


def rows_from(
    medians: dict[str, list[float]], tokens: int, variants: dict[str, tuple[str, str]]
) -> list[dict[str, Any]]:
    rows = []
    names = list(medians)
    for name in names:
        ms = [1e3 * t for t in medians[name]]
        med = statistics.median(ms)
        model, adamw = variants[name]
        row: dict[str, Any] = {
            "model": model,
            "gelu": "erf" if model.endswith("-erf") else "tanh",
            "adamw": adamw,
            "ms_per_step": med,
            "ms_min": min(ms),
            "ms_max": max(ms),
            "spread_pct": 100 * (max(ms) - min(ms)) / med,
            "tokens_per_s": tokens / (med / 1e3),
        }
        for other in names:  # paired: this round's time over the other's, median over rounds
            ratios = [a / b for a, b in zip(medians[name], medians[other], strict=True)]
            row[f"vs_{other}"] = statistics.median(ratios)
        rows.append(row)
    return rows


def profile_ops(steps: dict[str, Callable[[int], float]], n_steps: int) -> list[dict[str, Any]]:
    """Per op name: calls and self CPU ms per step for each variant, profiled one step at a time
    with the variants interleaved (sorted by the largest self time of any variant)."""
    from torch.profiler import ProfilerActivity, profile

    totals: dict[str, dict[str, list[float]]] = {name: {} for name in steps}
    for i in range(n_steps):
        for name, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                step(i)
            for e in prof.key_averages():
                acc = totals[name].setdefault(e.key, [0.0, 0.0])
                acc[0] += e.count
                acc[1] += e.self_cpu_time_total / 1e3
    names = list(totals)
    keys = set(itertools.chain.from_iterable(totals.values()))
    rows = []
    for key in keys:
        row: dict[str, Any] = {"op": key}
        for n in names:
            calls, ms = totals[n].get(key, [0.0, 0.0])
            row[f"{n}_calls"] = calls / n_steps
            row[f"{n}_self_ms"] = ms / n_steps
        differ = len({row[f"{n}_calls"] for n in names}) > 1
        if differ or max(row[f"{n}_self_ms"] for n in names) >= 0.01:
            rows.append(row)
    return sorted(rows, key=lambda r: -max(r[f"{n}_self_ms"] for n in names))


def _loadavg() -> float | None:
    """The 1-minute load average (how busy the machine was), or None where there is none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ref = _load_reference()
    cfg = GPTConfig(
        vocab_size=args.vocab,
        block_size=args.seq,
        n_layer=args.layers,
        n_head=args.heads,
        n_embd=args.width,
        dropout=0.0,
        bias=True,
    )
    ref.check_equivalence(cfg, batch=2)  # equal work, or stop here
    gen = torch.Generator().manual_seed(1)
    batches = [
        tuple(
            torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(device)
            for _ in range(2)
        )
        for _ in range(N_BATCHES)
    ]
    steps: dict[str, Callable[[int], float]] = {}
    variants: dict[str, tuple[str, str]] = {}
    for kind in args.adamw:
        for name, model in build_models(cfg, args.models, device).items():
            key = name if len(args.adamw) == 1 else f"{name}/{kind}"
            steps[key] = make_step(model, make_optimizer(model, kind), batches)
            variants[key] = (name, kind)
    load_before = _loadavg()
    medians = time_interleaved(steps, args.steps, args.repeats, args.warmup, device)
    rows = rows_from(medians, args.batch * args.seq, variants)
    env = {**environment_stamp(device)}
    meta = {
        "model_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "cpu_threads": torch.get_num_threads(),
        "optimizer": "AdamW(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1), one group",
        "timing": "per variant: median over rounds of the round's median step time; variants "
        "interleaved, order rotated each round; vs_X = median of paired per-round ratios",
        "round_ms": {k: [round(1e3 * t, 3) for t in v] for k, v in medians.items()},
        "loadavg_1min": {"before": load_before, "after": _loadavg()},
    }
    title = (
        f"FP32 eager training step, {args.layers} x {args.width}, B={args.batch}, T={args.seq}, "
        f"{torch.get_num_threads()} threads"
    )
    path = write_and_print(args.name, title, rows, args.out, meta, env)
    result: dict[str, Any] = {"path": path, "rows": rows}
    if args.profile_steps:
        first: dict[str, str] = {}
        for key, (model_name, _) in variants.items():  # each model's first AdamW variant
            first.setdefault(model_name, key)
        ops = profile_ops({m: steps[k] for m, k in first.items()}, args.profile_steps)
        ops_meta = {**meta, "profile_steps": args.profile_steps, "adamw": args.adamw[0]}
        ops_meta.pop("round_ms")
        result["ops_path"] = write_and_print(
            f"{args.name}_ops", "ATen ops per step (self CPU ms)", ops, args.out, ops_meta, env
        )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
