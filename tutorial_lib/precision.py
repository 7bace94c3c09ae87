"""Precision policies, registered by name: what dtype the math runs in during training.

A policy bundles the decisions that together make "mixed precision":
    - the autocast dtype of the forward pass (None: no autocast);
    - whether FP32 matmuls may use TF32 tensor cores;
    - whether the loss is scaled (FP16 gradients underflow without it; BF16's do not);
    - which peak of the spec table MFU is measured against;
    - an optional model transform (later chapters: FP8 layers) and an extra context.

Master weights and the optimizer state stay in FP32 under every policy here.
The Trainer, the benchmarks and the CLI all take a policy by name: ``get_policy("bf16")``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .hardware import cuda_capability

__all__ = [
    "PrecisionPolicy",
    "register_policy",
    "get_policy",
    "available_policies",
    "POLICIES",
    "VARIANTS",
    "BF16_LOSS_TOLERANCE",
]

# How close (nats, per step) BF16 autocast's training loss stays to FP32's from the same seed and
# data (tests/test_precision_training.py). Measured on the CPU test model (2 layers, width 36,
# lr 3e-3, batch 8): at most 0.002 over 20 seeds x 20 steps and 0.0067 over 20 seeds x 25 steps;
# 0.05 leaves a 7x margin. It holds for stable training only: at lr 1e-2 this tiny model's loss
# spikes, and BF16 and FP32 runs drifted up to 1.4 nats apart (one seed in 20).
BF16_LOSS_TOLERANCE: float = 0.05


@dataclass(frozen=True)
class PrecisionPolicy:
    """How one training step handles precision.

    Math:
        autocast_dtype: dtype for ``torch.autocast`` in the forward pass; None disables it.
        allow_tf32: let FP32 matmuls and convolutions use TF32 tensor cores (CUDA only).
        peak_dtype: key into ``DeviceSpec.peak_flops`` used for MFU.
    Gradients:
        grad_scaler: scale the loss (dynamic loss scaling), needed for FP16.
    Extensions (FP8, Transformer Engine):
        prepare_model: called once on the model before training (e.g. swap Linear layers).
        extra_context: a context manager factory entered around each forward pass.
        check: raises a clear error if the device cannot run the policy.
    """

    name: str
    description: str
    autocast_dtype: torch.dtype | None = None
    allow_tf32: bool = False
    peak_dtype: str = "fp32"
    grad_scaler: bool = False
    prepare_model: Callable[[nn.Module], nn.Module] | None = None
    extra_context: Callable[[], contextlib.AbstractContextManager[object]] | None = None
    check: Callable[[torch.device], None] | None = None

    def validate(self, device: torch.device | str) -> None:
        """Raise ``RuntimeError`` naming the problem if ``device`` cannot run this policy."""
        device = torch.device(device)
        if self.check is not None:
            self.check(device)

    @contextlib.contextmanager
    def autocast(self, device: torch.device | str) -> Iterator[None]:
        """Enter the policy's autocast (and extra context) for a forward pass on ``device``."""
        device = torch.device(device)
        with contextlib.ExitStack() as stack:
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(device.type, dtype=self.autocast_dtype))
            if self.extra_context is not None:
                stack.enter_context(self.extra_context())
            yield

    @contextlib.contextmanager
    def matmul_settings(self) -> Iterator[None]:
        """Set TF32 for the duration (restores the previous global setting afterwards)."""
        before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.allow_tf32
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

    def make_grad_scaler(self, device: torch.device | str) -> torch.amp.GradScaler | None:
        if not self.grad_scaler:
            return None
        return torch.amp.GradScaler(torch.device(device).type)


POLICIES: dict[str, PrecisionPolicy] = {}
# Variants of listed policies, found by name but not listed by ``available_policies`` (so a table
# over every precision has each once): the FP8 policies with Hopper's accumulation.
VARIANTS: dict[str, PrecisionPolicy] = {}


def register_policy(policy: PrecisionPolicy, *, variant: bool = False) -> PrecisionPolicy:
    """Add a policy to the registry (later chapters register ``fp8`` and ``te-fp8``), or to
    ``VARIANTS`` with ``variant=True``."""
    if policy.name in POLICIES or policy.name in VARIANTS:
        raise ValueError(f"A precision policy named {policy.name!r} is already registered.")
    (VARIANTS if variant else POLICIES)[policy.name] = policy
    return policy


# Policies registered by packages that precision.py must not import at module import time (they
# import it): (module, registering function), called on first use of a name not registered yet.
_LAZY_POLICIES = (
    ("tutorial_lib.fp8.policy", "register_fp8_policies"),
    ("tutorial_lib.fp8.te_policy", "register_te_policy"),
)
# (module, function) that registers a variant (``VARIANTS``) by its name on first use: the FP8
# policies with Hopper's accumulation (``fp8+hopper-acc``).
_LAZY_VARIANTS = ("tutorial_lib.fp8.policy", "register_fp8_variant")


def _load_lazy_policies(name: str | None = None) -> None:
    """Register the lazily imported policies (the FP8 and TE ones), unless ``name`` is
    registered already, then ``name`` if it is a variant of one. Each registering function
    registers its policies once."""
    if name is None or (name not in POLICIES and name not in VARIANTS):
        for module, function in _LAZY_POLICIES:
            getattr(importlib.import_module(module), function)()
    if name is not None and name not in POLICIES and name not in VARIANTS:
        module, function = _LAZY_VARIANTS
        getattr(importlib.import_module(module), function)(name)


def available_policies() -> list[str]:
    _load_lazy_policies()
    return list(POLICIES)


def get_policy(
    name: str | PrecisionPolicy, device: torch.device | str | None = None
) -> PrecisionPolicy:
    """The policy called ``name``; with ``device``, also check that the device can run it."""
    if isinstance(name, str):
        _load_lazy_policies(name)
    policy = name if isinstance(name, PrecisionPolicy) else POLICIES.get(name, VARIANTS.get(name))
    if policy is None:
        raise ValueError(
            f"Unknown precision policy {name!r}. Available: {', '.join(available_policies())}."
        )
    if device is not None:
        policy.validate(device)
    return policy


def _needs_cuda_cc(
    min_cc: tuple[int, int], what: str, instead: str = "'fp32' or 'tf32'"
) -> Callable[[torch.device], None]:
    def check(device: torch.device) -> None:
        gpu = cuda_capability(device)
        if gpu is not None and gpu[1] < min_cc:
            (name, cc) = gpu
            raise RuntimeError(
                f"{what} needs a GPU with compute capability >= {min_cc[0]}.{min_cc[1]}; "
                f"{name} is {cc[0]}.{cc[1]}. Use {instead} instead."
            )

    return check


def _fp16_check(device: torch.device) -> None:
    if device.type == "cpu":
        raise RuntimeError(
            "The fp16 policy (autocast to float16 with a gradient scaler) is for CUDA GPUs; "
            "CPU autocast has no fast float16 path. Use 'fp32' or 'bf16' on the CPU."
        )
    _needs_cuda_cc((7, 0), "fp16 tensor-core math")(device)


for _policy in (
    PrecisionPolicy("fp32", "full FP32 math (TF32 off)", peak_dtype="fp32"),
    PrecisionPolicy(
        "tf32",
        "FP32 tensors, matmuls on TF32 tensor cores (10-bit mantissa)",
        allow_tf32=True,
        peak_dtype="tf32",
    ),
    PrecisionPolicy(
        "bf16",
        "autocast to bfloat16, FP32 master weights, no loss scaling",
        autocast_dtype=torch.bfloat16,
        peak_dtype="bf16",
        check=_needs_cuda_cc(
            (8, 0), "bf16 autocast", instead="'fp16' (with loss scaling) or 'fp32'"
        ),
    ),
    PrecisionPolicy(
        "fp16",
        "autocast to float16, FP32 master weights, dynamic loss scaling",
        autocast_dtype=torch.float16,
        peak_dtype="fp16",
        grad_scaler=True,
        check=_fp16_check,
    ),
):
    register_policy(_policy)
