"""Time one full training step (forward, backward, AdamW) under each precision policy.

Used by ``benchmarks/precision.py`` (which records the rows) and by chapter 3 (which shows them).
A row says which device it ran on through the results stamp; a CPU row is a CPU result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..build import build_model
from ..config import GPTConfig, RunPreset
from ..data import synthetic_batch
from ..hardware import default_device, describe_device
from ..model import GPT
from ..perf.memory import memory_report, reset_peak_memory
from ..perf.mfu import mfu
from ..perf.timing import benchmark
from ..precision import PrecisionPolicy, available_policies, get_policy

__all__ = ["make_step", "run_policy", "benchmark_policies"]


def _make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    try:  # fused AdamW, as the Trainer uses, where this torch build has it
        return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(model.parameters(), lr=1e-4)


def make_step(
    policy: PrecisionPolicy, cfg: GPTConfig, batch: int, device: torch.device
) -> tuple[Callable[[], None], GPT]:
    """A zero-argument training step (forward under the policy, backward, optimizer step)."""
    model = build_model(cfg, precision=policy, device=device, seed=0).train()
    optimizer = _make_optimizer(model)
    scaler = policy.make_grad_scaler(device)
    x, y = synthetic_batch(batch, cfg.block_size, cfg.vocab_size, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with policy.autocast(device):
            _, loss = model(x, y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    return step, model


def _cpu_note(policy: PrecisionPolicy, device: torch.device) -> str | None:
    """Say when a policy cannot show its effect on this device (so nobody reads too much)."""
    if device.type != "cpu":
        return None
    if policy.allow_tf32:
        return "TF32 is a CUDA tensor-core mode: on the CPU this is FP32 math"
    if policy.autocast_dtype is not None and not describe_device(device).bf16_supported:
        return "no BF16 matrix instructions on this CPU (AVX-512 BF16 or AMX)"
    return None


def run_policy(
    name: str,
    preset: RunPreset,
    cfg: GPTConfig,
    batch: int,
    timing: tuple[int, int],
    device: torch.device | None = None,
) -> dict[str, Any]:
    """One row: the policy's step time, throughput, MFU and peak memory, or why it was skipped."""
    device = default_device(device)
    row: dict[str, Any] = {
        "policy": name,
        "model": preset.model,
        "batch": batch,
        "seq": cfg.block_size,
    }
    try:
        policy = get_policy(name, device)
    except RuntimeError as exc:
        return {**row, "skipped": str(exc)}
    if device.type == "cuda":
        torch.cuda.empty_cache()  # so the previous policy's cached blocks do not count here
    reset_peak_memory(device)
    with policy.matmul_settings():
        try:  # only building the step may refuse (fp8: widths not multiples of 16)
            step, model = make_step(policy, cfg, batch, device)
        except ValueError as exc:
            return {**row, "skipped": str(exc)}
        result = benchmark(step, warmup=timing[0], iters=timing[1], device=device)
    tokens_per_s = batch * cfg.block_size / result.median
    flops_per_token = model.flops_per_token(training=True, seq_len=cfg.block_size)
    mem = memory_report(device)
    row.update(
        step_time_ms=1e3 * result.median,
        step_time_min_ms=1e3 * result.min,
        step_time_max_ms=1e3 * result.max,
        iters=result.iters,
        tokens_per_s=tokens_per_s,
        mfu=mfu(tokens_per_s, flops_per_token, describe_device(device).spec, policy.peak_dtype),
        peak_allocated_bytes=mem.peak_allocated,
        peak_reserved_bytes=mem.peak_reserved,
        peak_rss_bytes=mem.peak_rss,
    )
    note = _cpu_note(policy, device)
    if note:
        row["note"] = note
    return row


def benchmark_policies(
    preset: RunPreset,
    device: torch.device | str | None = None,
    policies: Sequence[str] | None = None,
    model: str | None = None,
    batch: int | None = None,
    timing: tuple[int, int] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One row per policy (default: all registered) at the preset's benchmark size.

    ``timing`` is (warm-up, timed iterations), default the preset's ``bench_warmup``/``bench_iters``;
    ``batch`` defaults to the preset's ``bench_batch_size``. ``progress`` shows a bar per policy.
    """
    if model is not None:
        preset = dataclasses.replace(preset, model=model)
    cfg = preset.model_config()
    batch = batch or preset.bench_batch_size
    timing = timing or (preset.bench_warmup, preset.bench_iters)
    dev = default_device(device)
    names = list(policies) if policies is not None else available_policies()
    bar = tqdm(names, desc="policies", unit="policy", disable=not progress, dynamic_ncols=True)
    rows = []
    for name in bar:
        bar.set_postfix_str(name)
        rows.append(run_policy(name, preset, cfg, batch, timing, dev))
    return rows
