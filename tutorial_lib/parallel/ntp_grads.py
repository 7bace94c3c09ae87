"""Nonuniform tensor parallelism, execution: the process groups of a DP x nonuniform-TP job
(``build_ntp_groups``, ``NTPRank``) and its gradient sync (``ntp_allreduce_grads``).

The plan and the shard maps come from ``parallel.ntp`` (``plan_ntp``, ``degraded_shard_map``,
``reshard_routes``; its docstring describes the whole scheme). Before the data-parallel
all-reduce, a healthy replica's extra ranks send their gradient units to their core ranks
(``reshard_to_core``), so core rank i holds exactly degraded rank i's units in the same order and
the all-reduce pairs rank i of every replica one to one; the sums go back to the extra ranks
afterwards (``reshard_from_core``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..config import GPTConfig
from .ntp import NTPPlan, degraded_shard_map, reshard_routes
from .shard import ShardMap, UnitSpec, join_units, param_spec, rank_units, split_by_unit, unit_specs

__all__ = [
    "NTPRank",
    "build_ntp_groups",
    "sharded_parameters",
    "reshard_to_core",
    "reshard_from_core",
    "ntp_allreduce_grads",
]


@dataclass
class NTPRank:
    """One process of an NTP job: its place in the plan, its groups, both shard maps."""

    plan: NTPPlan
    replica: int
    tp_rank: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup | None  # None on a healthy replica's extra ranks
    healthy_map: ShardMap
    degraded_map: ShardMap

    @property
    def tp_ranks(self) -> list[int]:
        """Process ranks of this replica's TP group, in TP-rank order."""
        return self.plan.tp_group(self.replica)

    @property
    def shard_map(self) -> ShardMap:
        """The map this replica's model is sharded with."""
        degraded = self.plan.replicas[self.replica].degraded
        return self.degraded_map if degraded else self.healthy_map

    @property
    def reshards(self) -> bool:
        """True in a healthy replica that has extra ranks to fold into its core ranks."""
        return self.shard_map.tp > self.plan.reduced_tp

    @property
    def is_extra(self) -> bool:
        return self.tp_rank >= self.plan.reduced_tp


def build_ntp_groups(plan: NTPPlan, cfg: GPTConfig) -> NTPRank:
    """Create the process groups of a DP x nonuniform-TP job and return this process's view.

    ``dist.new_group`` is collective: every process must create every group, members or not, in
    the same order (here: the TP group of each replica, then the DP group of each core index
    0..t'-1), or the job hangs. The default group must span ``plan.world_size`` processes.
    """
    if dist.get_world_size() != plan.world_size:
        raise ValueError(
            f"The plan runs {plan.world_size} processes but the job has {dist.get_world_size()}."
        )
    me = dist.get_rank()
    tp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    for r in range(len(plan.replicas)):
        g = dist.new_group(plan.tp_group(r))
        tp_group = g if me in plan.tp_group(r) else tp_group
    for i in range(plan.reduced_tp):
        g = dist.new_group(plan.dp_group(i))
        dp_group = g if me in plan.dp_group(i) else dp_group
    replica, tp_rank = plan.locate(me)
    if tp_group is None:  # every rank is in one replica's TP group
        raise RuntimeError(f"Rank {me} is in no TP group of the plan.")
    healthy = ShardMap.even(cfg, plan.base_tp)
    degraded = degraded_shard_map(healthy, plan.reduced_tp)
    return NTPRank(plan, replica, tp_rank, tp_group, dp_group, healthy, degraded)


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise ValueError("A parameter has no gradient: call this after backward.")
    return p.grad


def sharded_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter, UnitSpec]]:
    """The TP-sharded parameters of a GPT (full-model names), with their unit layouts."""
    cfg = model.config
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"Expected a GPT (with a GPTConfig .config), got {type(model).__name__}.")
    specs = unit_specs(cfg)
    return [(n, p, s) for n, p in model.named_parameters() if (s := param_spec(n, specs))]


Pieces = dict[str, dict[int, torch.Tensor]]  # parameter name -> unit -> gradient piece
Units = dict[str, tuple[int, ...]]  # axis -> units


def _peers(me: NTPRank) -> dict[int, Units]:
    """The TP ranks this rank exchanges units with (its core ranks if it is an extra rank, its
    extra ranks if it is a core rank), and the units of each axis that travel between them."""
    out: dict[int, Units] = {}
    for src, dst, axis, units in reshard_routes(me.healthy_map, me.degraded_map):
        if me.tp_rank in (src, dst):
            out.setdefault(dst if me.is_extra else src, {})[axis] = units
    return out


def _exchange(me: NTPRank, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor]) -> None:
    """Point-to-point messages inside the TP group, keyed by peer TP rank (gloo and NCCL)."""
    r, g = me.tp_ranks, me.tp_group
    ops = [dist.P2POp(dist.isend, t, r[peer], g) for peer, t in sorted(sends.items())]
    ops += [dist.P2POp(dist.irecv, t, r[peer], g) for peer, t in sorted(recvs.items())]
    if ops:  # (NCCL: the TP group's forward all-reduces already ran, so a rank may skip this)
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _send(me: NTPRank, sharded: list, peers: dict[int, Units], pieces: Pieces) -> None:
    """One flat message per peer: every sharded parameter's pieces for that peer's units."""
    flat = {
        q: torch.cat(
            [pieces[n][u].reshape(-1) for n, _, s in sharded for u in units.get(s.axis, ())]
        )
        for q, units in peers.items()
    }
    _exchange(me, flat, {})


def _receive(me: NTPRank, sharded: list, peers: dict[int, Units], pieces: Pieces) -> None:
    """Receive ``_send``'s messages and file their pieces in ``pieces`` by parameter and unit."""
    layout: dict[int, list[tuple[str, int, list[int]]]] = {}
    for q, units in peers.items():
        layout[q] = []
        for name, p, spec in sharded:
            shape = list(p.shape)
            shape[spec.dim] = spec.groups * spec.width  # one unit's piece
            layout[q] += [(name, u, shape) for u in units.get(spec.axis, ())]
    grad = _grad(sharded[0][1])
    bufs = {q: grad.new_empty(sum(math.prod(s) for *_, s in lay)) for q, lay in layout.items()}
    _exchange(me, {}, bufs)
    for q, lay in layout.items():
        parts = bufs[q].split([math.prod(s) for *_, s in lay])
        for (name, u, shape), part in zip(lay, parts, strict=True):
            pieces[name][u] = part.view(shape)


def reshard_to_core(model: nn.Module, me: NTPRank) -> dict[str, torch.Tensor]:
    """Healthy replica: fold the extra ranks' sharded gradients into the core ranks.

    Extra ranks send their gradient units (one message per core rank) and return ``{}``; a core
    rank returns, per sharded parameter, a gradient laid out like degraded rank ``tp_rank``'s.
    """
    sharded, peers = sharded_parameters(model), _peers(me)
    mine = {
        n: split_by_unit(_grad(p), s, rank_units(me.healthy_map, s, me.tp_rank)[0])
        for n, p, s in sharded
    }
    if me.is_extra:
        _send(me, sharded, peers, mine)
        return {}
    _receive(me, sharded, peers, mine)
    return {
        n: join_units(mine[n], s, rank_units(me.degraded_map, s, me.tp_rank)[0])
        for n, _, s in sharded
    }


def reshard_from_core(model: nn.Module, reduced: Mapping[str, torch.Tensor], me: NTPRank) -> None:
    """The inverse of ``reshard_to_core``: core ranks keep their own units of the reduced
    gradients and send the rest back; every rank's ``.grad`` is then in its healthy layout."""
    sharded, peers = sharded_parameters(model), _peers(me)
    if me.is_extra:
        pieces: Pieces = {n: {} for n, _, _ in sharded}
        _receive(me, sharded, peers, pieces)
    else:
        pieces = {
            n: split_by_unit(reduced[n], s, rank_units(me.degraded_map, s, me.tp_rank)[0])
            for n, _, s in sharded
        }
        _send(me, sharded, peers, pieces)
    for name, p, spec in sharded:
        _grad(p).copy_(
            join_units(pieces[name], spec, rank_units(me.healthy_map, spec, me.tp_rank)[0])
        )


def _flat_collective(tensors: list[torch.Tensor], op: Callable[[torch.Tensor], object]) -> None:
    """Run ``op`` on one flat buffer holding ``tensors`` and copy the result back."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    op(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(part.view_as(t))


def ntp_allreduce_grads(model: nn.Module, me: NTPRank, weight: float) -> None:
    """Data-parallel gradient sync of a DP x nonuniform-TP job; call after ``backward``.

    1. Scale every gradient by this replica's token weight (``token_weights``).
    2. Healthy replicas with extra ranks: ``reshard_to_core``.
    3. SUM all-reduce in each DP group: the sharded gradients (degraded layout) and, in DP group
       0 only, the replicated ones (identical on a replica's TP ranks, thanks to Megatron's f/g).
    4. ``reshard_from_core``, and TP rank 0 broadcasts the replicated gradients to its TP group,
       so they are bitwise the same on every rank of every replica (extra ranks included).
    Afterwards each rank holds its shard of the gradient of the mean loss over all tokens.
    """
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    if missing:
        raise ValueError(f"No gradient for {missing[:4]}: call ntp_allreduce_grads after backward.")
    sharded = sharded_parameters(model)
    names = {n for n, _, _ in sharded}
    replicated = [_grad(p) for n, p in model.named_parameters() if n not in names]
    for p in model.parameters():
        _grad(p).mul_(weight)
    if me.reshards:
        reduced = reshard_to_core(model, me)
    else:
        reduced = {n: _grad(p) for n, p, _ in sharded}
    if me.dp_group is not None:
        tensors = list(reduced.values()) + (replicated if me.tp_rank == 0 else [])
        _flat_collective(tensors, lambda t: dist.all_reduce(t, group=me.dp_group))
    if me.reshards:
        reshard_from_core(model, reduced, me)
    if len(me.tp_ranks) > 1:
        src = me.tp_ranks[0]
        _flat_collective(replicated, lambda t: dist.broadcast(t, src, group=me.tp_group))
