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
3. **Gradients** (``ntp_grads.ntp_allreduce_grads``). Before the data-parallel all-reduce, a healthy
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .shard import ShardMap

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
        keep_g, off_g, gone_g = (tuple(i * base_tp + r for r in rs) for rs in (keep, off, gone))
        replicas.append(ReplicaPlan(i, len(keep_g), keep_g, off_g, gone_g))
    return NTPPlan(base_tp, reduced, tuple(replicas))


def degraded_shard_map(healthy: ShardMap, t_reduced: int) -> ShardMap:
    """The shard map of a replica at TP ``t_reduced``, derived from the healthy map.

    Core rank i < t' keeps its own units (first, in their order) and then receives the extra
    ranks' units round-robin: all units of rank t', then of t'+1, ..., each in its shard order,
    the j-th of them going to core rank j % t'. The same map serves every degraded replica.
    """
    if not 1 <= t_reduced <= healthy.tp:
        raise ValueError(f"Reduced TP degree {t_reduced} must be in [1, {healthy.tp}].")

    def absorb(units: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        core = [list(u) for u in units[:t_reduced]]
        extra = [u for rank_units in units[t_reduced:] for u in rank_units]
        for j, u in enumerate(extra):
            core[j % t_reduced].append(u)
        return tuple(tuple(c) for c in core)

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
