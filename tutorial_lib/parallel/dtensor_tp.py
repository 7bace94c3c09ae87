"""The same tensor parallelism the PyTorch way: DTensor's ``parallelize_module`` with
``ColwiseParallel`` and ``RowwiseParallel`` on a one-dimensional ``DeviceMesh``, as torchtitan
does it. Production code uses this; ``parallel.tp_model`` spells out what it does, and keeps what
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

2D, as torchtitan composes them (DTensor TP on the ``tp`` dimension of a (dp, tp)
``DeviceMesh``, FSDP2 on its ``dp`` dimension), is a test: ``tests/spawn_workers.py``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..model import GPT

__all__ = ["compare_with_megatron", "dtensor_parallelize", "regroup_qkv"]


def _qkv_order(n_embd: int, n_head: int, tp: int) -> torch.Tensor:
    """Row order that puts each rank's heads' Q, K and V rows together (contiguous heads)."""
    head_dim, per_rank = n_embd // n_head, n_head // tp
    rows = torch.arange(3 * n_embd).view(3, tp, per_rank * head_dim)  # (q/k/v, rank, rows)
    return rows.transpose(0, 1).reshape(-1)


def regroup_qkv(t: torch.Tensor, n_head: int, tp: int) -> torch.Tensor:
    """A full ``attn.qkv`` weight (3C, C) or bias (3C,) in the per-rank order."""
    return t.index_select(0, _qkv_order(t.shape[0] // 3, n_head, tp).to(t.device))


def dtensor_parallelize(
    model: GPT, mesh: torch.distributed.device_mesh.DeviceMesh, sequence_parallel: bool = False
) -> GPT:
    """``model`` (a full plain GPT, the same weights on every rank) made tensor-parallel in place
    over the one-dimensional ``mesh`` with DTensor; returns it. Needs an even split: ``n_head``
    divisible by the mesh size.

    ``sequence_parallel``: Megatron's sequence parallelism the DTensor way. The residual stream
    between the blocks is a DTensor sharded on the sequence (``Shard(1)``): the first block's
    input is cut (``PrepareModuleInput``), each block's LayerNorms run on their slice
    (``SequenceParallel``), the attention and the MLP gather their input (``PrepareModuleInput``
    to ``Replicate``) and the row-parallel layers reduce-scatter their output
    (``RowwiseParallel(output_layouts=Shard(1))``); the final LayerNorm gets the gathered
    sequence. The sequence length must divide by the mesh size."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    cfg, tp = model.config, mesh.size()
    if cfg.n_head % tp:
        raise ValueError(
            f"DTensor's Shard(0) splits evenly: {cfg.n_head} heads do not divide over {tp} "
            "ranks. Choose a TP degree that divides n_head, or use parallel.tp_model (uneven shards)."
        )
    if sequence_parallel and cfg.block_size % tp:
        raise ValueError(
            f"Sequence parallelism splits the {cfg.block_size} positions over {tp} ranks: "
            "choose a block size divisible by the TP degree, or sequence_parallel=False."
        )
    seq, rep = Shard(1), Replicate()
    plan: dict[str, ParallelStyle] = {}
    for i, block in enumerate(model.blocks):
        qkv = cast(nn.Linear, block.get_submodule("attn.qkv"))
        with torch.no_grad():
            qkv.weight.copy_(regroup_qkv(qkv.weight, cfg.n_head, tp))
            if qkv.bias is not None:
                qkv.bias.copy_(regroup_qkv(qkv.bias, cfg.n_head, tp))
        b = f"blocks.{i}"
        plan[f"{b}.attn.qkv"] = ColwiseParallel()
        plan[f"{b}.mlp.fc"] = ColwiseParallel()
        if not sequence_parallel:
            plan[f"{b}.attn.proj"] = RowwiseParallel()
            plan[f"{b}.mlp.proj"] = RowwiseParallel()
            continue
        for part in ("attn", "mlp"):  # gather the sequence in, reduce-scatter it out
            plan[f"{b}.{part}"] = PrepareModuleInput(
                input_layouts=(seq,), desired_input_layouts=(rep,)
            )
            plan[f"{b}.{part}.proj"] = RowwiseParallel(output_layouts=seq, use_local_output=False)
        plan[f"{b}.ln1"] = SequenceParallel()
        plan[f"{b}.ln2"] = SequenceParallel()
    if sequence_parallel:  # into the blocks: cut the sequence; out of them: gather it
        plan["blocks.0"] = PrepareModuleInput(
            input_layouts=(rep,), desired_input_layouts=(seq,), use_local_output=False
        )
        plan["ln_f"] = PrepareModuleInput(
            input_layouts=(seq,), desired_input_layouts=(rep,), use_local_output=True
        )
    parallelize_module(model, mesh, plan)
    return model


def compare_with_megatron(
    group: torch.distributed.ProcessGroup,
    cfg: object,
    steps: int = 3,
    sequence_parallel: bool = False,
) -> dict[str, list[float]]:
    """Our Megatron layers (``parallel.tp_model``) and DTensor's, from the same seeded GPT on the same
    batches, ``steps`` plain SGD steps (lr 0.1) each: per step both losses and the largest difference
    between any two local gradients (the shards hold the same rows in the same order); with
    ``sequence_parallel``, both sequence-parallel. For a spawned worker (``workers.run_jobs``)."""
    from torch.distributed.device_mesh import DeviceMesh

    from ..config import GPTConfig
    from .shard import ShardMap
    from .tp_model import parallelize

    assert isinstance(cfg, GPTConfig)
    tp = torch.distributed.get_world_size(group)
    torch.manual_seed(0)
    sp = sequence_parallel
    ours = parallelize(GPT(cfg), group, ShardMap.even(cfg, tp), sequence_parallel=sp)
    torch.manual_seed(0)
    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("tp",))
    theirs = dtensor_parallelize(GPT(cfg), mesh, sequence_parallel=sp)
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
                n: _local_grad(p.grad) for n, p in model.named_parameters() if p.grad is not None
            }
            grads.append(local)
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(0.1 * p.grad)
        out["grad_diff"].append(
            max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
        )
    return out


def _local_grad(grad: torch.Tensor) -> torch.Tensor:
    """This rank's gradient as a plain tensor: a DTensor's local shard, after summing a
    ``Partial`` one (a LayerNorm weight's under sequence parallelism: each rank holds its own
    positions' share until DTensor sums it, when the update combines it with the replicated
    weight)."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(grad, DTensor):
        return grad
    placements = [Replicate() if p.is_partial() else p for p in grad.placements]
    return grad.redistribute(placements=placements).to_local()
