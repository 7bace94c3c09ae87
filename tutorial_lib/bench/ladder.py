"""The ablation ladder (chapter 8): each rung differs from the one below it in one thing.

    1. fp32 eager        the baseline
    2. tf32              FP32 matmuls on TF32 tensor cores (CUDA only)
    3. bf16 autocast     BF16 matmuls and attention, FP32 master weights
    4. + fusion          torch.compile (default) or our Triton kernels (``fusion="triton"``)
    5. + fp8             our delayed-scaling FP8 Linear layers, still with rung 4's fusion
    6. fp8 unfused       rung 5 without rung 4's fusion: TE's modules (rung 7) do not run under
                         torch.compile, so rung 7 is compared with an unfused rung
    7. TE fused fp8      Transformer Engine's LayerNormLinear/LayerNormMLP (``te-fp8-fused``)

"One thing" is one of the fields ``build_model`` records in ``ModelRecipe`` (``RECIPE_FIELDS``):
``rung_changes`` lists them, and the tests hold every neighbouring pair to exactly one, except
that ``fusion="both"`` turns two switches (our kernels and torch.compile) on and off together.

Every rung trains the same model from the same seed on the same batches with the ``Trainer`` for
the same number of steps, so one run gives both numbers the chapter needs: throughput (median step
time after the warm-up steps, which also absorb compilation), MFU and peak memory, and the loss
curve to compare with the FP32 one. A compiled rung also records Dynamo's graph breaks, with
their reasons and the lines where they happened (``kernels.compile.count_graph_breaks``). A rung
the device cannot run is kept in the table with the reason (``skipped``), never silently dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..build import build_model
from ..config import RunPreset
from ..data import TokenData, preset_data
from ..hardware import default_device, describe_device
from ..kernels.compile import GraphBreaks, count_graph_breaks
from ..precision import get_policy
from ..train import TrainConfig, Trainer

__all__ = [
    "FUSIONS",
    "LADDER_MAX_LR",
    "RECIPE_FIELDS",
    "Rung",
    "ladder_rungs",
    "rung_changes",
    "format_graph_breaks",
    "LadderRun",
    "ladder_run",
    "run_rung",
    "run_ladder",
    "ladder_table",
    "ladder_meta",
    "final_loss",
]

FUSIONS = ("compile", "triton", "both")

# The ladder trains at min(preset.lr, LADDER_MAX_LR). Speed does not depend on the learning rate,
# but the loss comparison needs stable training: at the ci preset's 3e-3 (30 steps, batch 4) the
# final-loss gap between rungs reached 0.15 nats for one seed in four, from loss spikes; at 1e-3
# seeds 0-3 all stayed below 0.003 (chapter 3's parity run uses the same cap).
LADDER_MAX_LR = 1e-3


# The fields of a rung that build_model turns into a model (build.ModelRecipe's names).
RECIPE_FIELDS = ("precision", "fused", "compile")


@dataclass(frozen=True)
class Rung:
    """One rung: a precision policy plus the kernel options (``build_model``'s ``fused`` and
    ``compile``)."""

    name: str
    precision: str
    fused: bool = False
    compile: bool = False
    what: str = ""


def ladder_rungs(fusion: str = "compile") -> list[Rung]:
    """The seven rungs. ``fusion`` picks the fusion rung 4 adds and rung 6 takes away:
    ``compile`` (torch.compile), ``triton`` (our kernels; on a CPU they run in Triton's slow
    interpreter) or ``both``."""
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}.")
    opts = {"compile": fusion in ("compile", "both"), "fused": fusion in ("triton", "both")}
    label = {"compile": "torch.compile", "triton": "Triton kernels", "both": "Triton + compile"}
    return [
        Rung("1 fp32 eager", "fp32", what="FP32 everywhere, eager PyTorch"),
        Rung("2 tf32", "tf32", what="FP32 matmuls on TF32 tensor cores"),
        Rung("3 bf16 autocast", "bf16", what="BF16 matmuls, FP32 master weights"),
        Rung(f"4 + {label[fusion]}", "bf16", **opts, what="memory-bound ops fused"),
        Rung("5 + fp8", "fp8", **opts, what="FP8 delayed scaling (ours), plus rung 4"),
        Rung("6 fp8 unfused", "fp8", what=f"rung 5 without {label[fusion]}, as TE runs"),
        Rung("7 TE fused fp8", "te-fp8-fused", what="TE LayerNormLinear/LayerNormMLP in FP8"),
    ]


def rung_changes(lower: Rung, upper: Rung) -> dict[str, tuple[Any, Any]]:
    """``{field: (lower's value, upper's value)}`` for each of ``RECIPE_FIELDS`` that differs."""
    return {
        f: (getattr(lower, f), getattr(upper, f))
        for f in RECIPE_FIELDS
        if getattr(lower, f) != getattr(upper, f)
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


@dataclass(frozen=True)
class LadderRun:
    """What every rung shares: the preset, device and data (rewound to ``start`` before each
    rung, so every rung sees the same batches), and the comparison size: ``steps`` steps of
    ``batch`` sequences at learning rate ``lr``, the first ``warmup`` left out of the timing.
    ``count_breaks``: see ``run_rung``."""

    preset: RunPreset
    device: torch.device
    data: TokenData
    start: dict[str, torch.Tensor]
    steps: int
    batch: int
    warmup: int
    lr: float
    count_breaks: bool = True


def ladder_run(
    preset: RunPreset,
    device: torch.device | str | None = None,
    steps: int | None = None,
    batch: int | None = None,
    data: TokenData | None = None,
    lr: float | None = None,
    count_breaks: bool = True,
) -> LadderRun:
    """The ladder's settings at ``preset``: ``steps`` defaults to the preset's ``ladder_steps``,
    ``batch`` to ``parity_batch_size``, ``lr`` to ``min(preset.lr, LADDER_MAX_LR)``; the first
    ``bench_warmup`` steps (at least 1, which holds any compilation) are left out of the
    timing; ``data`` to the preset's (``preset_data``)."""
    dev = default_device(device)
    steps = steps or preset.ladder_steps
    warmup = min(max(1, preset.bench_warmup), steps - 1) if steps > 1 else 0
    cfg = preset.model_config()
    data = data or preset_data(preset, block_size=cfg.block_size)
    batch = batch or preset.parity_batch_size
    lr = min(preset.lr, LADDER_MAX_LR) if lr is None else lr
    start = data.state_dict()
    return LadderRun(preset, dev, data, start, steps, batch, warmup, lr, count_breaks)


def run_rung(rung: Rung, run: LadderRun) -> dict[str, Any]:
    """Train one rung for ``run.steps`` steps; its row (or the reason it was skipped).

    The sampler is rewound to ``run.start`` first. ``run.count_breaks=False`` keeps what Dynamo
    has compiled already (no reset, no graph break count): a rung then reuses an earlier
    compilation of the same model code."""
    preset, data, device, steps, batch = run.preset, run.data, run.device, run.steps, run.batch
    row: dict[str, Any] = {
        "rung": rung.name,
        "precision": rung.precision,
        "fused": rung.fused,
        "compile": rung.compile,
    }
    try:
        get_policy(rung.precision, device)
    except (RuntimeError, KeyError) as exc:
        return {**row, "skipped": str(exc).strip("'\"")}
    cfg = TrainConfig.from_preset(
        preset,
        steps=steps,
        batch_size=batch,
        lr=run.lr,
        eval_every=0,
        precision=rung.precision,
        progress=False,
    )
    data.load_state_dict(run.start)  # every rung sees the same batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        model = build_model(
            preset.model_config(),
            precision=rung.precision,
            fused=rung.fused,
            compile=rung.compile,
            device=device,
            seed=0,
        )
        trainer = Trainer(model, data, cfg, device=device)
    except ValueError as exc:  # e.g. FP8 shapes not multiples of 16
        return {**row, "skipped": str(exc)}
    history, breaks = _train(trainer, rung.compile and run.count_breaks)
    timed = [r for r in history if int(r["step"]) >= run.warmup] or history  # type: ignore[arg-type]
    step_s = _median([float(r["step_time_s"]) for r in timed])  # type: ignore[arg-type]
    mfus = [r["mfu"] for r in timed if r["mfu"] is not None]
    tokens = batch * data.block_size
    row.update(
        steps=steps,
        batch=batch,
        seq=data.block_size,
        lr=cfg.lr,
        step_time_ms=1e3 * step_s,
        tokens_per_s=tokens / step_s,
        mfu=_median(mfus) if mfus else None,
        peak_mem_bytes=max(float(r["peak_mem_bytes"]) for r in history),  # type: ignore[arg-type]
        first_step_s=float(history[0]["step_time_s"]),  # type: ignore[arg-type]
        compile_s=trainer.compile_time_s,
        losses=[float(r["loss"]) for r in history],  # type: ignore[arg-type]
    )
    row["final_loss"] = final_loss(row["losses"])
    if breaks is not None:  # the names of _BREAK_KEYS
        row.update(
            graphs=breaks.graphs,
            graph_breaks=breaks.breaks,
            graph_break_reasons=breaks.reasons,
            frames_run_eagerly=breaks.skipped_frames,
            eager_frame_reasons=breaks.skip_reasons,
            graph_break_sites=breaks.sites,
        )
    note = _device_note(rung, device)
    if note:
        row["note"] = note
    return row


def _train(
    trainer: Trainer, compiled: bool
) -> tuple[list[dict[str, float | None]], GraphBreaks | None]:
    """Train; for a compiled model, count Dynamo's graph breaks while it compiles. Dynamo is
    reset first, so every compiled rung compiles from scratch whatever ran before it (a cache
    hit would compile nothing and count no breaks)."""
    if not compiled:
        return trainer.train(), None
    torch._dynamo.reset()
    with count_graph_breaks() as breaks:
        history = trainer.train()
    return history, breaks


# What a compiled rung's row holds about its compilation (run_rung), in the order shown.
_BREAK_KEYS = (
    "graphs",
    "graph_breaks",
    "graph_break_reasons",
    "frames_run_eagerly",
    "eager_frame_reasons",
    "graph_break_sites",
)


def format_graph_breaks(row: dict[str, Any]) -> str:
    """A compiled rung's graph breaks as the chapter prints them: how many, why, and where."""
    if "skipped" in row:
        return f"{row['rung']}: not run ({row['skipped'].split('. ')[0]})."
    if row.get("graph_breaks") is None:
        return f"{row['rung']}: not compiled, so no graphs and no graph breaks."
    lines = [
        f"{row['rung']}: {row['graph_breaks']} graph break(s) while compiling, "
        f"{row['graphs']} graph(s), {row['frames_run_eagerly']} frame(s) run eagerly"
    ]
    reasons = [("break", row["graph_break_reasons"]), ("eager", row["eager_frame_reasons"])]
    for kind, counts in reasons:
        lines += [f"  {n} x {kind}: {why}" for why, n in counts.items()]
    lines += [f"  {n} x at {site}" for site, n in row["graph_break_sites"].items()]
    return "\n".join(lines)


def _device_note(rung: Rung, device: torch.device) -> str | None:
    """Say when a rung cannot show its effect on this device, so nobody reads too much into it."""
    if device.type != "cpu":
        return None
    notes = []
    if rung.precision == "tf32":
        notes.append("TF32 is a CUDA tensor-core mode: FP32 math on a CPU")
    if rung.precision == "fp8":
        notes.append("FP8 GEMMs emulated in FP32 on a CPU (FP32 sums)")
    if rung.precision == "bf16" and not describe_device(device).bf16_supported:
        notes.append("no BF16 matrix instructions on this CPU (AVX-512 BF16 or AMX)")
    if rung.fused:
        notes.append("Triton kernels run in the interpreter on a CPU: slow")
    return "; ".join(notes) or None


def final_loss(losses: Sequence[float]) -> float:
    """Mean loss over the last fifth of the steps (at least one): single small-batch steps are
    noisy, and runs that differ only in rounding wander apart step by step, then back."""
    k = max(1, len(losses) // 5)
    return sum(losses[-k:]) / k


def run_ladder(
    preset: RunPreset,
    device: torch.device | str | None = None,
    rungs: Sequence[Rung] | None = None,
    steps: int | None = None,
    batch: int | None = None,
    data: TokenData | None = None,
    progress: bool = True,
    lr: float | None = None,
    count_breaks: bool = True,
) -> list[dict[str, Any]]:
    """Run every rung (default ``ladder_rungs()``) at the preset's comparison size
    (``ladder_run``'s settings); rows in rung order, skipped rungs carrying ``skipped`` with the
    reason."""
    run = ladder_run(preset, device, steps, batch, data, lr, count_breaks)
    rungs = list(rungs) if rungs is not None else ladder_rungs()
    bar = tqdm(rungs, desc="ladder", unit="rung", disable=not progress, dynamic_ncols=True)
    rows = []
    for rung in bar:
        bar.set_postfix_str(rung.name)
        rows.append(run_rung(rung, run))
    bar.close()
    return rows


def ladder_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows reduced to what a reader compares: speed-up over the first rung that ran, and
    ``final_loss`` (mean of the last fifth of the steps) next to that rung's."""
    base = next((r for r in rows if "skipped" not in r), None)
    table = []
    for r in rows:
        if "skipped" in r:
            table.append({"rung": r["rung"], "skipped": r["skipped"]})
            continue
        mem = r.get("peak_mem_bytes")
        table.append(
            {
                "rung": r["rung"],
                "tokens/s": round(r["tokens_per_s"]),
                "speed-up": r["tokens_per_s"] / base["tokens_per_s"] if base else None,
                "MFU": r.get("mfu"),
                "step ms": r["step_time_ms"],
                "peak mem MiB": None if mem is None else mem / 2**20,
                "compile s": r.get("compile_s"),
                "graph breaks": r.get("graph_breaks"),
                "final loss": r["final_loss"],
                "vs rung 1": r["final_loss"] - base["final_loss"] if base else None,
                "note": r.get("note", ""),
            }
        )
    return table


def ladder_meta(preset: RunPreset, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a results file needs to say about how the ladder was run."""
    first = next((r for r in rows if "skipped" not in r), {})
    return {
        "preset": preset.name,
        "model": preset.model,
        "model_config": dataclasses.asdict(preset.model_config()),
        "steps": first.get("steps"),
        "batch": first.get("batch"),
        "lr": first.get("lr"),
        "cpu_threads": torch.get_num_threads(),
        "timing": "median Trainer step (AdamW, clipping) after the warm-up steps, real data",
        "graph_breaks": {
            r["rung"]: {k: r[k] for k in _BREAK_KEYS}
            for r in rows
            if r.get("graph_breaks") is not None
        },
    }
