"""Nonuniform tensor parallelism (NTP): a replica that lost GPUs keeps training at a lower TP degree.

Data parallelism runs ``n_replicas`` copies of a model, each over ``base_tp`` GPUs. When a GPU
fails, restarting the whole job without its replica wastes ``base_tp - 1`` healthy GPUs. NTP
(arXiv 2504.06095; Megatron-LM ``megatron/core/distributed/nonuniform_tp.py``) instead lets the
replica run at a reduced degree t' on its survivors:

1. **Plan** (``plan_ntp``). One reduced degree t' = base_tp - (most failures in one replica)
   serves every degraded replica; a replica with fewer failures deactivates its highest-numbered
   healthy ranks to match.
2. **Shards** (``degraded_shard_map``). Core ranks 0..t'-1 keep their own heads and FFN columns
   and absorb the *extra* ranks' (t'..t-1) units round-robin, so a degraded rank's shard is
   generally non-contiguous.
3. **Gradients** (``ntp_allreduce_grads``). Before the data-parallel all-reduce, a healthy
   replica's extra ranks send their gradient units to their core ranks (``reshard_to_core``);
   core rank i then holds exactly degraded rank i's units in the same order, so the all-reduce
   pairs rank i of every replica one to one. The sums go back to the extra ranks afterwards
   (``reshard_from_core``).
4. **Batches** (``local_batch``, ``token_weights``). A degraded replica either keeps its batch
   (``"keep"``: the paper's power boost gives the survivors the failed GPUs' power budget) or
   shrinks it with its GPUs (``"scale"``). Each replica's gradient is weighted by its share of
   the global tokens, so the sum over replicas is the gradient of the mean loss over all tokens.

Process ranks: the restarted job runs only the active GPUs (deactivated ones idle as spares); a
process's rank is its position in ``NTPPlan.job_ranks`` (physical rank = replica * base_tp + TP
rank). Replicated parameters (embeddings, LayerNorms, row-parallel biases) are all-reduced once,
in DP group 0, then broadcast inside each replica's TP group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ..config import GPTConfig
from .shard import ShardMap, UnitSpec, join_units, split_by_unit, unit_specs

__all__ = [
    "ReplicaPlan",
    "NTPPlan",
    "plan_ntp",
    "degraded_shard_map",
    "Route",
    "reshard_routes",
    "BATCH_POLICIES",
    "local_batch",
    "token_weights",
    "NTPRank",
    "build_ntp_groups",
    "sharded_parameters",
    "reshard_to_core",
    "reshard_from_core",
    "ntp_allreduce_grads",
]

AXES = ("heads", "ffn")
BATCH_POLICIES = ("keep", "scale")


# ---- planning ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaPlan:
    """One data-parallel replica after failures; ranks are physical (replica * base_tp + r).

    tp: its TP degree now (base_tp when healthy, the reduced degree when degraded).
    active: the ranks that run it, in TP-rank order (the i-th is its TP rank i).
    deactivated: healthy ranks switched off to match the reduced degree.
    failed: its failed GPUs.
    """

    index: int
    tp: int
    active: tuple[int, ...]
    deactivated: tuple[int, ...]
    failed: tuple[int, ...]

    @property
    def degraded(self) -> bool:
        return bool(self.failed)


@dataclass(frozen=True)
class NTPPlan:
    """The TP degree and ranks of every replica; process ranks index ``job_ranks``."""

    base_tp: int
    reduced_tp: int  # t': the degree of every degraded replica (base_tp when none failed)
    replicas: tuple[ReplicaPlan, ...]

    @property
    def job_ranks(self) -> tuple[int, ...]:
        """Physical ranks of the restarted job's processes, replica by replica."""
        return tuple(r for rep in self.replicas for r in rep.active)

    @property
    def world_size(self) -> int:
        return len(self.job_ranks)

    def tp_group(self, replica: int) -> list[int]:
        """Process ranks of one replica's TP group, in TP-rank order."""
        return [self.job_ranks.index(r) for r in self.replicas[replica].active]

    def dp_group(self, core: int) -> list[int]:
        """Process ranks of the DP group of core index ``core`` < t': TP rank ``core`` of every
        replica. A healthy replica's extra ranks (TP rank >= t') are in no DP group."""
        return [self.job_ranks.index(rep.active[core]) for rep in self.replicas]

    def locate(self, process_rank: int) -> tuple[int, int]:
        """(replica, TP rank) of a process."""
        physical = self.job_ranks[process_rank]
        rep = self.replicas[physical // self.base_tp]
        return rep.index, rep.active.index(physical)

    def describe(self) -> str:
        lines = [f"base TP {self.base_tp}, reduced TP {self.reduced_tp}, {self.world_size} GPUs"]
        for rep in self.replicas:
            extra = f", failed {list(rep.failed)}" if rep.failed else ""
            extra += f", deactivated {list(rep.deactivated)}" if rep.deactivated else ""
            lines.append(f"  replica {rep.index}: TP {rep.tp} on {list(rep.active)}{extra}")
        return "\n".join(lines)


def plan_ntp(base_tp: int, n_replicas: int, failed: Mapping[int, Sequence[int]]) -> NTPPlan:
    """Plan a DP x TP job after failures; ``failed`` maps a replica to its failed TP ranks.

    Every degraded replica runs at t' = base_tp - max failures; one with fewer failures
    deactivates its highest-numbered healthy TP ranks, as Megatron-LM's NTP does.
    """
    if base_tp < 1 or n_replicas < 1:
        raise ValueError(f"Need base_tp >= 1 and n_replicas >= 1, got {base_tp}, {n_replicas}.")
    for rep, ranks in failed.items():
        if not 0 <= rep < n_replicas:
            raise ValueError(
                f"Replica {rep} is out of range: the job has {n_replicas} replicas "
                f"(0..{n_replicas - 1})."
            )
        bad = sorted({r for r in ranks if not 0 <= r < base_tp})
        if bad:
            raise ValueError(
                f"Replica {rep}: failed TP rank(s) {bad} outside [0, {base_tp}); give TP ranks "
                "within the replica (global rank g is replica g // base_tp, TP rank "
                "g % base_tp)."
            )
        twice = sorted({r for r in ranks if list(ranks).count(r) > 1})
        if twice:
            raise ValueError(f"Replica {rep} lists failed TP rank(s) {twice} more than once.")
        if len(ranks) == base_tp:
            raise ValueError(
                f"Replica {rep} lost all {base_tp} GPUs: nothing left to run it; drop it from "
                "data parallelism."
            )
    reduced = base_tp - max((len(r) for r in failed.values()), default=0)
    replicas = []
    for i in range(n_replicas):
        gone = sorted(failed.get(i, ()))
        alive = [r for r in range(base_tp) if r not in gone]
        keep = alive[:reduced] if gone else alive
        off = alive[reduced:] if gone else []
        keep, off, gone = (tuple(i * base_tp + r for r in rs) for rs in (keep, off, gone))
        replicas.append(ReplicaPlan(i, len(keep), keep, off, gone))
    return NTPPlan(base_tp, reduced, tuple(replicas))


def degraded_shard_map(healthy: ShardMap, t_reduced: int) -> ShardMap:
    """The shard map of a replica at TP ``t_reduced``, derived from the healthy map.

    Core rank i < t' keeps its own units (first, in their order) and then receives the extra
    ranks' units round-robin: all units of rank t', then of t'+1, ..., each in its shard order,
    the j-th of them going to core rank j % t'. The same map serves every degraded replica.
    """
    if not 1 <= t_reduced <= healthy.tp:
        raise ValueError(f"Reduced TP degree {t_reduced} must be in [1, {healthy.tp}].")

    def absorb(units: tuple[tuple[int, ...], ...]) -> list[list[int]]:
        core = [list(u) for u in units[:t_reduced]]
        extra = [u for rank_units in units[t_reduced:] for u in rank_units]
        for j, u in enumerate(extra):
            core[j % t_reduced].append(u)
        return core

    return ShardMap(absorb(healthy.heads), absorb(healthy.ffn), healthy.n_head, healthy.ffn_size)


class Route(NamedTuple):
    """Extra rank ``src`` sends core rank ``dst`` these units of ``axis`` (and gets them back)."""

    src: int
    dst: int
    axis: str
    units: tuple[int, ...]


def reshard_routes(healthy: ShardMap, degraded: ShardMap) -> list[Route]:
    """Which units each extra rank of a healthy replica sends to which core rank, ordered by
    (src, dst, axis); units in the order the core rank's degraded shard holds them."""
    t = degraded.tp
    if (degraded.n_head, degraded.ffn_size) != (healthy.n_head, healthy.ffn_size) or t > healthy.tp:
        raise ValueError("The degraded map must split the same model over at most as many ranks.")
    for axis in AXES:
        for i in range(t):
            if not set(getattr(healthy, axis)[i]) <= set(getattr(degraded, axis)[i]):
                raise ValueError(
                    f"Degraded rank {i} does not keep all its healthy {axis} units; build the "
                    "map with degraded_shard_map(healthy, t_reduced)."
                )
    routes = []
    for src in range(t, healthy.tp):
        for dst in range(t):
            for axis in AXES:
                mine = set(getattr(healthy, axis)[src])
                units = tuple(u for u in getattr(degraded, axis)[dst] if u in mine)
                if units:
                    routes.append(Route(src, dst, axis, units))
    return routes


def local_batch(batch: int, tp_active: int, base_tp: int, policy: str = "keep") -> int:
    """A replica's local batch: ``"keep"`` the healthy batch (power boost), or ``"scale"`` it
    with the live GPUs, ``max(1, batch * tp_active // base_tp)``."""
    if policy not in BATCH_POLICIES:
        raise ValueError(f"Unknown batch policy {policy!r}; use one of {BATCH_POLICIES}.")
    if batch < 1 or not 1 <= tp_active <= base_tp:
        raise ValueError(
            f"Need batch >= 1 and 1 <= tp_active <= {base_tp}, got {batch}, {tp_active}."
        )
    return batch if policy == "keep" else max(1, batch * tp_active // base_tp)


def token_weights(batches: Sequence[int]) -> list[float]:
    """Each replica's share of the global batch (sequences of one length, or token counts).

    A replica's loss is the mean over its own tokens, so weighting replica r's gradient by
    ``batches[r] / sum(batches)`` and summing over replicas gives the gradient of the mean loss
    over all tokens. Plain averaging (1 / n_replicas) is right only for equal batches.
    """
    if not batches or any(b <= 0 for b in batches):
        raise ValueError(f"Need at least one replica and positive batches, got {list(batches)}.")
    total = sum(batches)
    return [b / total for b in batches]


# ---- execution: process groups and the gradient all-reduce -------------------------------------
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
    tp_group = dp_group = None
    for r in range(len(plan.replicas)):
        g = dist.new_group(plan.tp_group(r))
        tp_group = g if me in plan.tp_group(r) else tp_group
    for i in range(plan.reduced_tp):
        g = dist.new_group(plan.dp_group(i))
        dp_group = g if me in plan.dp_group(i) else dp_group
    replica, tp_rank = plan.locate(me)
    healthy = ShardMap.even(cfg, plan.base_tp)
    degraded = degraded_shard_map(healthy, plan.reduced_tp)
    return NTPRank(plan, replica, tp_rank, tp_group, dp_group, healthy, degraded)


def sharded_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter, UnitSpec]]:
    """The TP-sharded parameters of a GPT (full-model names), with their unit layouts."""
    specs = unit_specs(model.config)
    out = []
    for name, p in model.named_parameters():
        parts = name.split(".", 2)  # blocks, i, attn.qkv.weight
        if parts[0] == "blocks" and len(parts) == 3 and parts[2] in specs:
            out.append((name, p, specs[parts[2]]))
    return out


Pieces = dict[str, dict[int, torch.Tensor]]  # parameter name -> unit -> gradient piece
Units = dict[str, tuple[int, ...]]  # axis -> units


def _units(shard_map: ShardMap, spec: UnitSpec, rank: int) -> tuple[int, ...]:
    return getattr(shard_map, spec.axis)[rank]


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
    layout = {}
    for q, units in peers.items():
        layout[q] = []
        for name, p, spec in sharded:
            shape = list(p.shape)
            shape[spec.dim] = spec.groups * spec.width  # one unit's piece
            layout[q] += [(name, u, shape) for u in units.get(spec.axis, ())]
    grad = sharded[0][1].grad
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
        n: split_by_unit(p.grad, s, _units(me.healthy_map, s, me.tp_rank)) for n, p, s in sharded
    }
    if me.is_extra:
        _send(me, sharded, peers, mine)
        return {}
    _receive(me, sharded, peers, mine)
    return {
        n: join_units(mine[n], s, _units(me.degraded_map, s, me.tp_rank)) for n, _, s in sharded
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
            n: split_by_unit(reduced[n], s, _units(me.degraded_map, s, me.tp_rank))
            for n, _, s in sharded
        }
        _send(me, sharded, peers, pieces)
    for name, p, spec in sharded:
        p.grad.copy_(join_units(pieces[name], spec, _units(me.healthy_map, spec, me.tp_rank)))


def _flat_collective(tensors: list[torch.Tensor], op) -> None:
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
    replicated = [p.grad for n, p in model.named_parameters() if n not in names]
    for p in model.parameters():
        p.grad.mul_(weight)
    if me.reshards:
        reduced = reshard_to_core(model, me)
    else:
        reduced = {n: p.grad for n, p, _ in sharded}
    if me.dp_group is not None:
        tensors = list(reduced.values()) + (replicated if me.tp_rank == 0 else [])
        _flat_collective(tensors, lambda t: dist.all_reduce(t, group=me.dp_group))
    if me.reshards:
        reshard_from_core(model, reduced, me)
    if len(me.tp_ranks) > 1:
        src = me.tp_ranks[0]
        _flat_collective(replicated, lambda t: dist.broadcast(t, src, group=me.tp_group))
