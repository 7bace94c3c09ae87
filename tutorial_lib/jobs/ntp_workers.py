"""An NTP training job in processes, and the single-process run it must reproduce.

``ntp_train_worker`` runs in every process of a DP x nonuniform-TP job (spawned by
``launch.spawn``; it lives in the package so that it pickles). Each replica builds its TP model
with ``parallelize`` from the same full initial model, trains on its slice of the global batch
with SGD + momentum (lr 0.5, momentum 0.9; elementwise, so it acts on shards exactly as on the
full tensors), and syncs gradients with ``ntp_allreduce_grads``. ``train_reference`` trains the
full model in one process on the whole global batch; the two must agree to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..config import GPTConfig
from ..data import synthetic_batch
from ..model import GPT
from ..parallel.ntp import local_batch, plan_ntp, token_weights
from ..parallel.ntp_grads import NTPRank, build_ntp_groups, ntp_allreduce_grads, sharded_parameters
from ..parallel.tp_model import gather_full, parallelize

__all__ = ["global_batch", "replica_slices", "train_reference", "ntp_train_worker"]


def global_batch(cfg: GPTConfig, n: int, step: int) -> tuple[torch.Tensor, ...]:
    """The global batch of ``step``: (n, T) inputs and targets, the same in every process."""
    return synthetic_batch(n, cfg.block_size, cfg.vocab_size, seed=step)


def replica_slices(batches: Sequence[int]) -> list[slice]:
    """Replica r's rows of the global batch (the global batch is the replicas' concatenation)."""
    starts = [sum(batches[:r]) for r in range(len(batches))]
    return [slice(s, s + b) for s, b in zip(starts, batches, strict=True)]


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def train_reference(
    cfg: GPTConfig, batches: Sequence[int], steps: int, *, weights: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """The full model trained in one process on the global batch; its final state dict.

    ``weights=None`` minimises the mean loss over all tokens. Otherwise the loss is
    ``sum_r weights[r] * (mean loss of replica r's rows)``: ``token_weights(batches)`` gives the
    same thing, ``[1 / n] * n`` the (wrong, for unequal batches) plain average.
    """
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = _optimizer(model.parameters())
    for step in range(steps):
        idx, tgt = global_batch(cfg, sum(batches), step)
        if weights is None:
            loss = model(idx, tgt)[1]
        else:
            rows = replica_slices(batches)
            loss = sum(w * model(idx[s], tgt[s])[1] for w, s in zip(weights, rows, strict=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_replica(
    cfg: GPTConfig, me: NTPRank, batches: Sequence[int], steps: int
) -> dict[str, Any]:
    """This rank's part of ``steps`` NTP steps; the gathered full state and last gradients."""
    torch.manual_seed(0)
    model = parallelize(GPT(cfg), me.tp_group, me.shard_map)
    opt = _optimizer(model.parameters())
    weight = token_weights(batches)[me.replica]
    rows = replica_slices(batches)[me.replica]
    for step in range(steps):
        idx, tgt = global_batch(cfg, sum(batches), step)
        loss = model(idx[rows], tgt[rows])[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ntp_allreduce_grads(model, me, weight)
        opt.step()
    sharded = {n for n, _, _ in sharded_parameters(model)}
    replicated = {  # every parameter has a gradient here: ntp_allreduce_grads checked
        n: p.grad.clone()
        for n, p in model.named_parameters()
        if n not in sharded and p.grad is not None
    }
    full = gather_full(model.state_dict(), cfg, me.tp_group, me.shard_map)
    return {"state": full if me.tp_rank == 0 else None, "replicated_grads": replicated}


def ntp_train_worker(
    rank: int,
    world_size: int,
    cfg: GPTConfig,
    base_tp: int,
    n_replicas: int,
    failed: Mapping[int, Sequence[int]],
    batch: int,
    steps: int,
    policies: Sequence[str] = ("keep", "scale"),
) -> dict[str, Any]:
    """One process of an NTP job, for ``launch.spawn(ntp_train_worker, plan.world_size, cfg,
    ...)``: one process per active GPU of ``plan_ntp(base_tp, n_replicas, failed)``. Trains ``steps`` steps per batch
    policy, from the same initial model each time, and returns per policy the local batches,
    this replica's gathered full state dict (on its TP rank 0, else None) and the replicated
    parameters' final gradients, plus this rank's (replica, TP rank)."""
    plan = plan_ntp(base_tp, n_replicas, failed)
    me = build_ntp_groups(plan, cfg)
    assert (rank, world_size) == (dist.get_rank(), dist.get_world_size())
    out: dict[str, Any] = {"replica": me.replica, "tp_rank": me.tp_rank}
    for policy in policies:
        batches = [local_batch(batch, rep.tp, base_tp, policy) for rep in plan.replicas]
        result = _train_replica(cfg, me, batches, steps)
        out[policy] = {"batches": batches, **result}
        dist.barrier()
    return out
