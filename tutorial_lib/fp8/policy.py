"""The ``fp8`` precision policy: FP8Linear layers (delayed scaling) under BF16 autocast.

``get_policy("fp8")`` works without importing this package first: ``tutorial_lib.precision``
imports it lazily. The policy keeps BF16 autocast on every device, the CPU included (as slow or fast
there as the CPU's BF16 kernels, but the numerics are those of a GPU run); on the CPU the FP8
GEMMs are emulated (``linear.py``).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ..hardware import cuda_capability
from ..precision import POLICIES, PrecisionPolicy, register_policy
from .autocast import autocast
from .linear import FP8_MIN_CC, convert_to_fp8
from .scaling import DelayedScaling

__all__ = [
    "FP8_POLICY_NAME",
    "FP8_LOSS_TOLERANCE",
    "check_fp8_device",
    "make_fp8_policy",
    "register_fp8_policy",
]

FP8_POLICY_NAME = "fp8"
# How close (nats, per step) the fp8 policy's training loss stays to bf16's, same init and data.
# Measured on the CPU (emulated FP8 GEMMs; GPT 2 layers, 2 heads, width 32, block 32, batch 8,
# lr 3e-3, 2 warm-up steps, 20 steps, default DelayedScaling): max |fp8 - bf16| per step was
# 0.0003 for seed 0, 0.0137 at worst over seeds 0-19 (median 0.002); bf16 vs fp32 at worst
# 0.0089. 0.05 leaves a 3.6x margin over the worst seed and equals BF16_LOSS_TOLERANCE.
FP8_LOSS_TOLERANCE: float = 0.05


def _check(emulate: bool | None) -> functools.partial[None]:
    return functools.partial(check_fp8_device, emulate=emulate)


def check_fp8_device(device: torch.device | str, emulate: bool | None = None) -> None:
    """Raise ``RuntimeError`` if ``device`` is a CUDA GPU without FP8 tensor cores (sm_89+) and
    emulation was not asked for. The CPU is accepted: it always emulates."""
    gpu = cuda_capability(device)
    if gpu is None or emulate:
        return
    name, cc = gpu
    if cc < FP8_MIN_CC:
        raise RuntimeError(
            f"The {FP8_POLICY_NAME!r} precision policy needs FP8 tensor cores (sm_89+: Ada or "
            f"Hopper); {name} is sm_{cc[0]}{cc[1]}. Use 'bf16', or "
            "opt in to the FP32 emulation (no FP8 speed): make_fp8_policy(emulate=True) (or "
            "tutorial_lib.fp8.autocast(emulate=True) / FP8Linear(..., emulate=True))."
        )


def make_fp8_policy(
    recipe: DelayedScaling | None = None, emulate: bool | None = None
) -> PrecisionPolicy:
    """The ``fp8`` policy: ``convert_to_fp8`` once, then every forward pass under BF16 autocast
    and ``autocast(recipe=...)`` (default ``DelayedScaling()``, TE's defaults)."""
    recipe = DelayedScaling() if recipe is None else recipe
    prepare = convert_to_fp8
    if emulate is not None or recipe.amax_history_len != 1024:
        prepare = functools.partial(
            convert_to_fp8, emulate=emulate, amax_history_len=recipe.amax_history_len
        )

    def region() -> contextlib.AbstractContextManager[None]:
        return autocast(recipe=recipe, emulate=emulate)

    return PrecisionPolicy(
        name=FP8_POLICY_NAME,
        description="FP8Linear GEMMs (E4M3 fwd, E5M2 grads, delayed scaling), BF16 autocast rest",
        autocast_dtype=torch.bfloat16,
        peak_dtype="fp8",
        prepare_model=prepare,
        extra_context=region,
        check=_check(emulate),
    )


def register_fp8_policy() -> PrecisionPolicy:
    """Register ``fp8`` once (later calls return the registered policy)."""
    existing = POLICIES.get(FP8_POLICY_NAME)
    return existing if existing is not None else register_policy(make_fp8_policy())
