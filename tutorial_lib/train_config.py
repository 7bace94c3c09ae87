"""A run's hyper-parameters (``TrainConfig``, ``TrainConfig.from_preset``) and its learning-rate
schedule (``lr_at``: linear warm-up, then cosine decay). ``train.Trainer`` runs them; both names
are importable from ``tutorial_lib.train`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .config import RunPreset

__all__ = ["TrainConfig", "lr_at"]


@dataclass
class TrainConfig:
    """Hyper-parameters of one run.

    Steps and batch:
        steps: optimizer steps; batch_size sequences per micro-batch; grad_accum micro-batches.
    Optimizer (AdamW, decoupled weight decay on matrices only):
        lr: peak learning rate; min_lr_ratio: final lr as a fraction of peak.
        warmup_steps: linear warm-up; cosine decay to min lr over the remaining steps.
        weight_decay, beta1, beta2: AdamW; grad_clip: max global grad norm (0 disables).
    Bookkeeping:
        eval_every/eval_iters: validation cadence and batches; checkpoint_every (0: only at end).
        precision: policy name (see ``precision.available_policies()``); seed: RNG seed.
        progress: show a tqdm progress bar.
    The model's construction (precision backend, fused kernels, compile, tensor parallelism)
    is ``build_model``'s business, not the Trainer's; ``precision`` here must match it.
    """

    steps: int = 100
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_iters: int = 4
    checkpoint_every: int = 0
    precision: str = "fp32"
    seed: int = 0
    progress: bool = True

    @classmethod
    def from_preset(
        cls,
        preset: RunPreset,
        *,
        steps: int | None = None,
        batch_size: int | None = None,
        lr: float | None = None,
        **overrides: Any,
    ) -> TrainConfig:
        """The preset's run: its steps, batch, lr, warm-up (never longer than the run) and
        evaluation cadence. ``steps``, ``batch_size`` and ``lr`` of None mean the preset's;
        any other ``TrainConfig`` field can be given in ``overrides``."""
        steps = steps or preset.steps
        fields: dict[str, Any] = {
            "steps": steps,
            "batch_size": batch_size or preset.batch_size,
            "lr": preset.lr if lr is None else lr,  # 0 is an error, not the preset's
            "warmup_steps": min(preset.warmup_steps, steps),
            "eval_every": preset.eval_every,
            "eval_iters": preset.eval_iters,
        }
        return cls(**{**fields, **overrides})

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "eval_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("warmup_steps", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}.")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(
                f"Need lr > 0 and 0 <= min_lr_ratio <= 1 (got {self.lr}, {self.min_lr_ratio})."
            )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then cosine decay."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))
