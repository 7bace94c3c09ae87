"""The same tensor parallelism the PyTorch way: DTensor's ``parallelize_module`` with
``ColwiseParallel`` and ``RowwiseParallel`` on a one-dimensional ``DeviceMesh``, as torchtitan
does it. Production code uses this; ``parallel.tp`` spells out what it does, and keeps what
DTensor's even ``Shard(0)`` cannot express: uneven and non-contiguous shards for NTP.

    attn.qkv, mlp.fc      ColwiseParallel: weight rows (and bias) ``Shard(0)``; the input
                          replicated, the output sharded on its last dimension (Megatron's f)
    attn.proj, mlp.proj   RowwiseParallel: weight columns ``Shard(1)``, bias replicated; the
                          partial sums all-reduced (Megatron's g)

One thing our model needs first: ``attn.qkv`` is one fused Linear whose output rows are all of
Q, then all of K, then all of V. ``Shard(0)`` cuts rows into contiguous blocks, which would give
rank 0 all of Q and half of K. ``regroup_qkv`` reorders the rows to [Q_0 K_0 V_0 | Q_1 K_1 V_1 |
...] (rank r's heads together), the layout Megatron stores, so each rank's block is its heads'
Q, K and V and the attention code runs unchanged on the local tensor (``use_local_output``).
``ungroup_qkv`` is the inverse, for comparing with or saving as the plain model.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..model import GPT

__all__ = ["compare_with_megatron", "dtensor_parallelize", "regroup_qkv", "ungroup_qkv"]


def _qkv_order(n_embd: int, n_head: int, tp: int) -> torch.Tensor:
    """Row order that puts each rank's heads' Q, K and V rows together (contiguous heads)."""
    head_dim, per_rank = n_embd // n_head, n_head // tp
    rows = torch.arange(3 * n_embd).view(3, tp, per_rank * head_dim)  # (q/k/v, rank, rows)
    return rows.transpose(0, 1).reshape(-1)


def regroup_qkv(t: torch.Tensor, n_head: int, tp: int) -> torch.Tensor:
    """A full ``attn.qkv`` weight (3C, C) or bias (3C,) in the per-rank order."""
    return t.index_select(0, _qkv_order(t.shape[0] // 3, n_head, tp).to(t.device))


def ungroup_qkv(t: torch.Tensor, n_head: int, tp: int) -> torch.Tensor:
    """The inverse of ``regroup_qkv``: back to [all Q, all K, all V]."""
    order = _qkv_order(t.shape[0] // 3, n_head, tp).to(t.device)
    out = torch.empty_like(t)
    out[order] = t
    return out


def dtensor_parallelize(model: GPT, mesh: torch.distributed.device_mesh.DeviceMesh) -> GPT:
    """``model`` (a full plain GPT, the same weights on every rank) made tensor-parallel in place
    over the one-dimensional ``mesh`` with DTensor; returns it. Needs an even split: ``n_head``
    divisible by the mesh size."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    cfg, tp = model.config, mesh.size()
    if cfg.n_head % tp:
        raise ValueError(
            f"DTensor's Shard(0) splits evenly: {cfg.n_head} heads do not divide over {tp} "
            "ranks. Choose a TP degree that divides n_head, or use parallel.tp (uneven shards)."
        )
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {}
    for i, block in enumerate(model.blocks):
        qkv = cast(nn.Linear, block.get_submodule("attn.qkv"))
        with torch.no_grad():
            qkv.weight.copy_(regroup_qkv(qkv.weight, cfg.n_head, tp))
            if qkv.bias is not None:
                qkv.bias.copy_(regroup_qkv(qkv.bias, cfg.n_head, tp))
        plan[f"blocks.{i}.attn.qkv"] = ColwiseParallel()
        plan[f"blocks.{i}.attn.proj"] = RowwiseParallel()
        plan[f"blocks.{i}.mlp.fc"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.proj"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)  # type: ignore[arg-type]
    return model


def compare_with_megatron(
    group: torch.distributed.ProcessGroup, cfg: object, steps: int = 3, lr: float = 0.1
) -> dict[str, list[float]]:
    """Our Megatron layers (``parallel.tp``) and DTensor's, from the same seeded GPT on the same
    batches, ``steps`` plain SGD steps each: per step both losses and the largest difference
    between any two local gradients (the shards hold the same rows in the same order). For
    a spawned worker (``workers.run_jobs``)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from ..config import GPTConfig
    from .shard import ShardMap
    from .tp import parallelize

    assert isinstance(cfg, GPTConfig)
    tp = torch.distributed.get_world_size(group)
    torch.manual_seed(0)
    ours = parallelize(GPT(cfg), group, ShardMap.even(cfg, tp))
    torch.manual_seed(0)
    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("tp",))
    theirs = dtensor_parallelize(GPT(cfg), mesh)
    gen = torch.Generator().manual_seed(1)
    out: dict[str, list[float]] = {"ours": [], "dtensor": [], "grad_diff": []}
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=gen)
        y = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=gen)
        grads = []
        for name, model in (("ours", ours), ("dtensor", theirs)):
            model.zero_grad()
            _, loss = model(x, y)
            assert loss is not None
            loss.backward()
            out[name].append(float(loss.detach()))
            local = {
                n: p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                for n, p in model.named_parameters()
                if p.grad is not None
            }
            grads.append(local)
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(lr * p.grad)
        out["grad_diff"].append(
            max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
        )
    return out
