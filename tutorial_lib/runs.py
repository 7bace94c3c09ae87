"""A run in one call: build the model and its data, then train it.

``run_training`` is the run every chapter compares with another (two runs that differ in one
setting start from the same weights and see the same batches); ``parallel_trainer`` is what
``python -m tutorial_lib train --dp D --tp T`` sets up on each process under torchrun.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .build import build_model
from .config import GPTConfig, get_preset
from .data import TokenData, make_data, preset_data
from .parallel.launch import join_torchrun
from .parallel.mesh import ParallelDims, check_layout, local_rows, mesh_groups
from .parallel.shard import ShardMap
from .parallel.tp_model import TPSpec
from .train import StepCallback, TrainConfig, Trainer

__all__ = ["parallel_trainer", "run_training"]


def run_training(
    cfg: GPTConfig,
    train_cfg: TrainConfig,
    *,
    fused: bool = False,
    compile: bool = False,
    device: torch.device | str | None = None,
    seed: int = 0,
    data_seed: int = 0,
    on_step: StepCallback | None = None,
    data: TokenData | None = None,
) -> Trainer:
    """Build a model and train it: the run every chapter compares with another.

    The model is ``build_model(cfg, precision=train_cfg.precision, fused=..., compile=...,
    seed=seed)``; the data is ``data``, else bytes (``make_data(cfg.block_size,
    seed=data_seed)``) for a 256-row vocabulary, or the active preset's BPE (``preset_data``)
    for its vocabulary; any other size raises ValueError. Two runs that differ in one setting start from the same
    weights and see the same batches. Returns the ``Trainer`` after ``train_cfg.steps`` steps:
    ``.history`` holds the metrics, ``.model`` the trained model."""
    if data is None:
        preset = get_preset()
        if cfg.vocab_size == 256:
            data = make_data(cfg.block_size, seed=data_seed)
        elif preset.tokenizer == "bpe" and preset.vocab_size == cfg.vocab_size:
            data = preset_data(preset, seed=data_seed, block_size=cfg.block_size)
        else:
            raise ValueError(
                f"run_training: no tokenizer for a {cfg.vocab_size}-row vocabulary: bytes need "
                f"256 rows and the {preset.name!r} preset's tokenizer has {preset.vocab_size}. "
                "Pass data= tokenized for this model, or a config with one of those sizes."
            )
    model = build_model(
        cfg, precision=train_cfg.precision, fused=fused, compile=compile, device=device, seed=seed
    )
    trainer = Trainer(model, data, train_cfg, device=device)
    trainer.train(on_step=on_step)
    return trainer


def parallel_trainer(
    model_cfg: GPTConfig,
    data: TokenData,
    cfg: TrainConfig,
    dp: int,
    tp: int,
    mode: str = "fsdp",
    fused: bool = False,
    compile: bool = False,
    device: str | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    sequence_parallel: bool = False,
    vocab_parallel: bool = False,
) -> Trainer:
    """Under torchrun with ``dp * tp`` processes: join them, make the mesh, build this rank's
    model (the same seeded full weights everywhere, cut for its TP rank) and return its
    trainer: what ``python -m tutorial_lib train --dp D --tp T`` runs on each process. Build
    ``data`` with the same seed on every rank. ``sequence_parallel`` and ``vocab_parallel`` need
    ``tp`` > 1 (``parallel.tp_model.TPGPT``)."""
    if (sequence_parallel or vocab_parallel) and tp == 1:
        raise ValueError(
            "--sequence-parallel and --vocab-parallel split over the tensor-parallel ranks: "
            "use them with --tp 2 or more."
        )
    check_layout(dp, tp, int(os.environ.get("WORLD_SIZE", "1")), model_cfg)
    local_rows(cfg.batch_size, dp, 0)  # a batch that does not split: the error, before starting
    env = join_torchrun("--tp" if dp == 1 else "--dp", dp * tp, device)
    dev = torch.device(device or env.device)
    dp_group, tp_group = mesh_groups(dp, tp, dev.type)
    shard_map = ShardMap.even(model_cfg, tp, vocab_parallel=vocab_parallel)
    spec = TPSpec(tp_group, shard_map, sequence_parallel=sequence_parallel) if tp > 1 else None
    dims = ParallelDims(dp_group if dp > 1 else None, mode, spec)
    model = build_model(
        model_cfg, precision=cfg.precision, fused=fused, compile=compile, parallel=dims,
        device=dev, seed=seed,
    )  # fmt: skip
    return Trainer(model, data, cfg, device=dev, out_dir=out_dir)
