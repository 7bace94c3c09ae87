"""2D parallelism: data parallelism (DDP or FSDP2) over one dimension of a device mesh, tensor
parallelism over the other, as torchtitan and Megatron lay them out.

    rank = d * tp + t        d: the data-parallel index (which replica), t: the TP index

TP is the inner dimension: the t ranks of one replica are neighbours (on a GPU node, the GPUs an
NVLink switch joins), because TP talks at every layer and DP once per step. ``mesh_groups``
builds the mesh with ``init_device_mesh`` (under torchrun, every process in it) and returns this
rank's two process groups; ``groups_2d`` does the same with ``dist.new_group`` for a job on some
of the processes (the tests run several layouts in one spawn), plus a group of the whole job.

``parallel_trainer`` is what ``python -m tutorial_lib train --dp D --tp T`` runs on each of the
D x T processes: ``DPTrainer`` over its data-parallel group, on a model that holds its TP
shards. With ``--tp`` alone it is ``TPTrainer``, with ``--dp`` alone ``DPTrainer``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from ..build import build_model
from ..config import GPTConfig
from ..data import TokenData
from ..train import TrainConfig, Trainer
from .comm import Group
from .dp import DPTrainer, local_rows
from .launch import TPTrainer, join_torchrun
from .shard import ShardMap
from .tp_model import TPSpec

__all__ = ["check_layout", "groups_2d", "mesh_groups", "parallel_trainer"]


def check_layout(dp: int, tp: int, world: int, cfg: GPTConfig | None = None) -> None:
    """A ValueError naming the fix unless ``dp`` x ``tp`` processes fill ``world`` and ``tp``
    gives every TP rank at least one head."""
    if dp < 1 or tp < 1:
        raise ValueError(f"--dp and --tp must be at least 1, got --dp {dp} --tp {tp}.")
    if dp * tp != world:
        layout = " ".join(f"--{k} {v}" for k, v in (("dp", dp), ("tp", tp)) if v > 1) or "--dp 1"
        raise ValueError(
            f"{layout} needs {dp * tp} processes, but WORLD_SIZE is {world}: run python -m "
            f"torch.distributed.run --nproc-per-node {dp * tp} -m tutorial_lib train {layout} "
            f"..., or choose --dp and --tp whose product is {world}."
        )
    if cfg is not None and tp > cfg.n_head:
        raise ValueError(
            f"--tp {tp} needs at least one attention head per rank, but the model has "
            f"{cfg.n_head}: choose --tp <= {cfg.n_head}."
        )


def mesh_groups(dp: int, tp: int, device_type: str) -> tuple[Group, Group]:
    """This rank's (data-parallel, tensor-parallel) groups of a ("dp", "tp") mesh over every
    process (``init_device_mesh``)."""
    from torch.distributed.device_mesh import init_device_mesh

    check_layout(dp, tp, dist.get_world_size())
    mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return mesh.get_group("dp"), mesh.get_group("tp")


def groups_2d(dp: int, tp: int, ranks: Sequence[int]) -> tuple[Group, Group, Group] | None:
    """This rank's (data-parallel, tensor-parallel, whole-job) groups of a dp x tp job on
    ``ranks`` (None when this rank is not in it). Every process must call it, with the same
    arguments, in the same order (``dist.new_group``'s rule)."""
    check_layout(dp, tp, len(ranks))
    ranks = list(ranks)
    tp_groups = [dist.new_group(ranks[d * tp : (d + 1) * tp]) for d in range(dp)]
    dp_groups = [dist.new_group(ranks[t::tp]) for t in range(tp)]
    job = dist.new_group(ranks)
    me = dist.get_rank()
    if me not in ranks:
        return None
    d, t = divmod(ranks.index(me), tp)
    return dp_groups[t], tp_groups[d], job


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
    trainer. Build ``data`` with the same seed on every rank. ``sequence_parallel`` and
    ``vocab_parallel`` need ``tp`` > 1 (``parallel.tp.TPGPT``)."""
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
    model = build_model(
        model_cfg, precision=cfg.precision, fused=fused, compile=compile, tp=spec, device=dev,
        seed=seed,
    )  # fmt: skip
    if dp == 1 and spec is not None:
        return TPTrainer(model, data, cfg, tp_group, spec.shard_map, device=dev, out_dir=out_dir)
    return DPTrainer(model, data, cfg, mode, group=dp_group, device=dev, out_dir=out_dir, tp=spec)
