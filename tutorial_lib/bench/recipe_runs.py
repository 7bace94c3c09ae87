"""The chapter "FP8 recipes compared" trains one model per recipe: ``recipe_runs`` runs them from
the same weights and batches, and ``loss_curves`` reads their losses."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..config import GPTConfig
from ..fp8.compare import COMPARED_RECIPES
from ..fp8.policy import runnable_fp8_precision
from ..fp8.recipes import RECIPE_PRECISIONS
from ..runs import run_training
from ..train import TrainConfig

__all__ = ["recipe_runs", "loss_curves"]


def recipe_runs(
    cfg: GPTConfig,
    steps: int,
    recipes: Sequence[str] = COMPARED_RECIPES,
    progress: Callable[[str], None] | None = None,
    device: torch.device | str = "cpu",
    **train_options: Any,
) -> dict[str, Any]:
    """BF16 and each recipe's precision (``RECIPE_PRECISIONS``) trained for ``steps`` from the
    same initial weights (seed 0) on the same batches (``runs.run_training``); the
    ``Trainer`` of each, by precision name. ``train_options`` go to ``TrainConfig``;
    ``progress`` is called with each run's name before it starts. On a GPU, a recipe it cannot
    run natively runs emulated (``policy.runnable_fp8_precision``): the same quantization, sums
    in FP32 rather than the tensor cores' accumulation, and not the recipe's speed."""
    runs: dict[str, Any] = {}
    for name in ("bf16", *(RECIPE_PRECISIONS[r] for r in recipes)):
        if progress is not None:
            progress(name)
        run_as = name if name == "bf16" else runnable_fp8_precision(name, device)
        options = {"eval_every": 0, "progress": False, **train_options}
        train_cfg = TrainConfig(steps=steps, precision=run_as, **options)
        runs[name] = run_training(cfg, train_cfg, device=device)
    return runs


def loss_curves(runs: Mapping[str, Any]) -> dict[str, list[float]]:
    """The training loss per step of each run of ``recipe_runs``."""
    return {
        name: [float(row["loss"] or math.nan) for row in trainer.history]
        for name, trainer in runs.items()
    }
