"""Checkpoints of a tensor-parallel model: ``gather_full`` and ``gather_full_optimizer`` turn
the shards of the model and of AdamW's moments into the single-process format (on every rank);
``shard_optimizer_state`` and ``shard_checkpoint`` cut them again (with ``shard_state_dict``) for
any other map, so a run resumes at any TP degree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..config import GPTConfig
from ..model import GPT
from .comm import Group
from .shard import ShardMap, global_index, param_spec, rank_units, unit_specs
from .tp_model import check_tp_setup, shard_state_dict

__all__ = [
    "gather_full",
    "gather_full_state_dict",
    "gather_full_optimizer",
    "shard_optimizer_state",
    "gather_checkpoint",
    "shard_checkpoint",
]


def gather_full(
    tensors: Mapping[str, torch.Tensor], cfg: GPTConfig, group: Group, shard_map: ShardMap
) -> dict[str, torch.Tensor]:
    """The inverse of ``shard_state_dict``, on every rank: full tensors from each rank's shards.

    Works for parameters and for their gradients. Shards may differ in size, so instead of one
    padded all-gather, each rank in turn packs all its shards into one flat buffer and
    broadcasts it (t broadcasts in all); everyone knows every buffer's layout from the map.
    """
    rank = check_tp_setup(cfg, group, shard_map, None)
    specs = unit_specs(cfg)
    sharded = {
        n: (t, s) for n, t in tensors.items() if (s := param_spec(n, specs, shard_map)) is not None
    }
    out = {n: t for n, t in tensors.items() if n not in sharded}  # replicated
    if not sharded:
        return out
    full: dict[str, torch.Tensor] = {}
    for name, (t, spec) in sharded.items():
        shape = list(t.shape)
        shape[spec.dim] = spec.groups * rank_units(shard_map, spec, 0)[1] * spec.width
        full[name] = t.new_empty(shape)
    for src in range(shard_map.tp):
        pieces = []  # (name, spec, index into the full tensor, shape of src's shard)
        for name, (t, spec) in sharded.items():
            index = global_index(spec, *rank_units(shard_map, spec, src)).to(t.device)
            shape = list(t.shape)
            shape[spec.dim] = len(index)
            pieces.append((name, spec, index, shape))
        if src == rank:
            flat = torch.cat([sharded[n][0].detach().reshape(-1) for n, *_ in pieces])
        else:
            sizes = sum(math.prod(shape) for *_, shape in pieces)
            flat = next(iter(sharded.values()))[0].new_empty(sizes)
        if group is not None and shard_map.tp > 1:
            dist.broadcast(flat, src=dist.get_global_rank(group, src), group=group)
        offset = 0
        for name, spec, index, shape in pieces:
            size = math.prod(shape)
            piece = flat[offset : offset + size].view(shape)
            full[name].index_copy_(spec.dim, index, piece)
            offset += size
    out.update(full)
    return {n: out[n] for n in tensors}  # keep the input's order


def gather_full_state_dict(tp_model: GPT, group: Group, shard_map: ShardMap) -> dict[str, Any]:
    """The full (single-process) state dict of a tensor-parallel model, on every rank."""
    return gather_full(tp_model.state_dict(), tp_model.config, group, shard_map)


_OPTIM_TENSORS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")  # AdamW's per-element state


def gather_full_optimizer(
    optimizer: Mapping[str, Any],
    names: list[str],
    cfg: GPTConfig,
    group: Group,
    shard_map: ShardMap,
) -> dict[str, Any]:
    """The single-process form of a tensor-parallel AdamW's ``state_dict()``, on every rank: each
    moment tensor of a sharded parameter gathered like the parameter (``gather_full``).

    ``names``: the parameter name of each optimizer index (they are the same on every rank and
    in one process: the same GPT, the same parameter order)."""
    state = optimizer["state"]
    full = {i: dict(s) for i, s in state.items()}
    for key in _OPTIM_TENSORS:
        tensors = {names[int(i)]: s[key] for i, s in state.items() if key in s}
        if tensors:
            gathered = gather_full(tensors, cfg, group, shard_map)
            for i, s in full.items():
                if key in s:
                    s[key] = gathered[names[int(i)]]
    return {"state": full, "param_groups": optimizer["param_groups"]}


def shard_optimizer_state(
    optimizer: Mapping[str, Any], names: list[str], cfg: GPTConfig, shard_map: ShardMap, rank: int
) -> dict[str, Any]:
    """The inverse of ``gather_full_optimizer``: ``rank``'s slice of each moment tensor."""
    out = {}
    for i, s in optimizer["state"].items():
        name = names[int(i)]
        cut = {k: v for k, v in s.items() if k in _OPTIM_TENSORS and torch.is_tensor(v)}
        sliced = {
            k: shard_state_dict({name: v}, cfg, shard_map, rank)[name] for k, v in cut.items()
        }
        out[i] = {**s, **sliced}
    return {"state": out, "param_groups": optimizer["param_groups"]}


def gather_checkpoint(
    model: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Any],
    names: list[str],
    cfg: GPTConfig,
    group: Group,
    shard_map: ShardMap,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A TP rank's model and optimizer state dicts -> the single-process ones (on every rank)."""
    return (
        gather_full(model, cfg, group, shard_map),
        gather_full_optimizer(optimizer, names, cfg, group, shard_map),
    )


def shard_checkpoint(
    model: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Any] | None,
    names: list[str],
    cfg: GPTConfig,
    shard_map: ShardMap,
    rank: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Single-process model and optimizer state dicts -> TP ``rank``'s (any map: resharding)."""
    if optimizer is None:
        raise ValueError(
            "This checkpoint holds no optimizer state (a tensor-parallel checkpoint written "
            "before TP checkpoints gathered AdamW's moments): load state['model'] into a GPT "
            "and start a new run from those weights (build_model(..., weights=...))."
        )
    return (
        shard_state_dict(model, cfg, shard_map, rank),
        shard_optimizer_state(optimizer, names, cfg, shard_map, rank),
    )
