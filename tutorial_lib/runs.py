"""A run in one call: build the model and its data, then train it.

``run_training`` is the run every chapter compares with another (two runs that differ in one
setting start from the same weights and see the same batches); ``parallel_trainer`` is one
rank's trainer in a dp x tp layout: what ``python -m tutorial_lib train`` sets up (in one
process, or on each process of ``--dp D --tp T`` under torchrun), and what the spawned jobs of
``jobs.dp_workers`` train.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .build import build_model
from .config import GPTConfig, get_preset
from .data import TokenData, make_data, preset_data
from .parallel.comm import Group, group_size
from .parallel.mesh import ParallelDims
from .parallel.shard import ShardMap
from .parallel.tp_model import TPSpec
from .train import StepCallback, TrainConfig, Trainer

__all__ = ["parallel_trainer", "run_training"]


def run_training(
    cfg: GPTConfig,
    train_cfg: TrainConfig,
    *,
    fused: bool = False,
    device: torch.device | str | None = None,
    seed: int = 0,
    data_seed: int = 0,
    on_step: StepCallback | None = None,
) -> Trainer:
    """Build a model and train it: the run every chapter compares with another.

    The model is ``build_model(cfg, precision=train_cfg.precision, fused=..., seed=seed)``; the
    data is bytes (``make_data(cfg.block_size, seed=data_seed)``) for a 256-row vocabulary, or
    the active preset's BPE (``preset_data``) for its vocabulary; any other size raises
    ValueError. Two runs that differ in one setting start from the same weights and see the
    same batches. Returns the ``Trainer`` after ``train_cfg.steps`` steps: ``.history`` holds
    the metrics, ``.model`` the trained model."""
    preset = get_preset()
    if cfg.vocab_size == 256:
        data = make_data(cfg.block_size, seed=data_seed)
    elif preset.tokenizer == "bpe" and preset.vocab_size == cfg.vocab_size:
        data = preset_data(preset, seed=data_seed, block_size=cfg.block_size)
    else:
        raise ValueError(
            f"run_training: no tokenizer for a {cfg.vocab_size}-row vocabulary: bytes need "
            f"256 rows and the {preset.name!r} preset's tokenizer has {preset.vocab_size}. "
            "Use a config with one of those sizes."
        )
    model = build_model(cfg, precision=train_cfg.precision, fused=fused, device=device, seed=seed)
    trainer = Trainer(model, data, train_cfg, device=device)
    trainer.train(on_step=on_step)
    return trainer


def parallel_trainer(
    model_cfg: GPTConfig,
    data: TokenData,
    cfg: TrainConfig,
    groups: tuple[Group, Group, Group],
    mode: str = "fsdp",
    *,
    device: torch.device | str,
    fused: bool = False,
    compile: bool = False,
    out_dir: str | Path | None = None,
    seed: int = 0,
    sequence_parallel: bool = False,
    vocab_parallel: bool = False,
    param_dtype: torch.dtype | None = None,
) -> Trainer:
    """This rank's trainer in a dp x tp layout, from its (data-parallel, tensor-parallel,
    whole-job) ``groups`` (``parallel.mesh.groups_2d``; ``(None, None, None)``: one process): the
    model built with ``seed`` (the same full weights on every rank, cut for its TP rank when the
    TP group has 2 ranks or more), data parallelism in ``mode`` (``param_dtype``: FSDP2's). Build
    ``data`` with the same seed on every rank. ``sequence_parallel`` and ``vocab_parallel`` split
    over the TP group (``parallel.tp_model.TPGPT``)."""
    dp_group, tp_group, job_group = groups
    spec = None
    if group_size(tp_group) > 1:
        shard_map = ShardMap.even(model_cfg, group_size(tp_group), vocab_parallel=vocab_parallel)
        spec = TPSpec(tp_group, shard_map, sequence_parallel=sequence_parallel)
    dims = ParallelDims(dp_group, mode, spec, job_group, param_dtype)
    model = build_model(
        model_cfg, precision=cfg.precision, fused=fused, compile=compile, parallel=dims,
        device=device, seed=seed,
    )  # fmt: skip
    return Trainer(model, data, cfg, device=device, out_dir=out_dir)
