"""Cluster-scale planning after GPU failures: which replicas run, at which TP degree, with which
local batch and power, and what that costs in throughput, as in the simulation of the NTP paper
(Arfeen et al., "Nonuniform-Tensor-Parallelism", arXiv 2504.06095, sections 4.3-4.4 and 6).

A ``TrainingJob`` is a healthy data-parallel job (``ParallelConfig``: base TP degree ``tp``,
``pp`` TP groups per replica, one per pipeline stage, ``dp`` replicas) on a ``ClusterSpec``. A
*slot* is one TP group: ``tp`` consecutive GPUs of a scale-up domain.
``plan_cluster(job, failed, policy)`` returns a ``ClusterPlan``: per replica its slots, TP
degree, local batch, power, speed and throughput.

Policies
    ``dp-drop``: a TP group with a failed GPU drops out; the healthy groups are regrouped into
    as many whole replicas as they make, and the global batch shrinks with them.
    ``ntp``: a degraded replica runs every stage at a reduced degree with the largest local
    batch that keeps pace with a healthy replica.
    ``ntp-pw``: the same, but the degraded stages' survivors are boosted (up to ``PowerBoost.cap``
    over TDP, +30% in the paper's rack) to keep the whole local batch.

Modelling assumptions (each stated where it is used):

- **Packing** (paper sec. 4.4): at restart the resource manager puts partially failed TP groups
  into as few replicas as possible, worst first, at the lowest ranks; a replica's degree is set
  by its worst group. A group with fewer survivors than the lowest allowed degree is dead.
  A replica may run below its best degree (deactivating healthy ranks, as
  ``ntp.plan_ntp`` does), so a group with fewer failures is never worse off.
- **Degrees**: by default each degraded replica runs at its own best degree and the DP
  all-reduce pairs ranks at the lowest degree in the job (the *core* degree); every replica with
  more ranks reshards its gradients to the core ranks first (counted in full, an upper bound: the
  paper overlaps it). ``TrainingJob(one_reduced_tp=True)`` is ``ntp.plan_ntp``'s rule, one degree
  for all.
- **Step times** come from ``cost_terms`` (Narayanan et al.'s terms, the same code): a degraded
  replica's busiest rank owns ``ceil(heads / t')`` heads and ``ceil(ffn / t')`` FFN columns
  (``TrainingJob(shard_split="whole")``, the default; ``"even"``, the paper's assumption, splits
  the work evenly over the survivors), its
  pipeline sends are ``t / t'`` larger, and the job's DP all-reduce moves ``t / core`` more bytes
  per rank. A synchronous job steps at its slowest replica, so ``ntp`` picks the largest batch at
  which a degraded replica keeps pace. The busiest stage has ``ceil(layers / pp)`` layers.
- **Power to speed**: throughput follows the clock and the clock follows power:
  speed = (power / TDP) ** ``exponent``, dividing the work of a boosted replica inside its
  scale-up domain (GEMMs, memory-bound kernels, TP collectives; so its pipeline bubble too), but
  not its sends over the scale-out network, the optimizer step or the DP all-reduce. The default
  0.7 is the paper's figure (Table 1: a TP30 replica at 1.1x power loses 2.8% performance per
  watt, so it runs 1.1 x 0.972 = 1.069 = 1.1 ** 0.70 times faster; 1.2x power gives 1.2 ** 0.63).
  If the cap is not enough, ``shortfall="shrink"`` lets that replica drop sequences to keep pace,
  ``"stretch"`` keeps every batch and slows the whole job to the boosted replica's pace.
- **Best of**: a planner never runs a worse plan than a weaker policy would: ``ntp`` falls back to
  ``dp-drop`` (or drops replicas below a degree), ``ntp-pw`` to ``ntp`` (only with ``"shrink"``:
  ``"stretch"`` holds the global batch). ``ClusterPlan.chosen`` says which plan won.
- Not modelled: memory of a degraded replica (t / t' more weights per GPU), the rack's total
  power, failures taking out more than one GPU, restart time (``cluster.goodput`` adds it).

``cluster.packing`` scores the plans, ``cluster.monte_carlo`` runs them over random failures and
failure traces, ``cluster.reproduce`` runs the paper's experiments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .packing import Candidate, best_plans, slot_failures
from .plan_options import option_table
from .replica_cost import TrainingJob
from .replicas import failed_indices

__all__ = ["ReplicaAssignment", "ClusterPlan", "plan_cluster"]


@dataclass(frozen=True, eq=False)
class ReplicaAssignment:
    """One replica of a plan. ``slots``: its TP groups (stage order); ``gpus``: the GPUs that run
    it; ``tp``: degree of its degraded stages (the base degree when healthy); ``power``: power of
    its boosted GPUs over TDP; ``speed``: their speed-up; ``step_time``: seconds per step at
    its own pace (the job steps at the slowest); ``throughput``: its share, relative to a healthy
    replica of the job with no failures."""

    index: int
    slots: tuple[int, ...]
    gpus: np.ndarray
    tp: int
    local_batch: int
    power: float
    speed: float
    step_time: float
    throughput: float
    failed: int


@dataclass(frozen=True, eq=False)
class ClusterPlan:
    """What a policy runs after failures. ``chosen``: the candidate plan that won, (policy, core
    degree); ``idle_slots``: usable TP groups left out; ``dead_slots``: groups too damaged to run."""

    policy: str
    chosen: Candidate
    replicas: tuple[ReplicaAssignment, ...]
    idle_slots: tuple[int, ...]
    dead_slots: tuple[int, ...]
    step_time: float
    healthy_step_time: float
    global_batch: int
    healthy_global_batch: int
    throughput: float

    def describe(self) -> str:
        lines = [
            f"{self.policy} (plan {self.chosen.policy}, core TP {self.chosen.core}): "
            f"{len(self.replicas)} replicas, batch {self.global_batch}/"
            f"{self.healthy_global_batch}, step {self.step_time:.3f} s "
            f"(healthy {self.healthy_step_time:.3f} s), throughput {self.throughput:.4f}"
        ]
        for r in self.replicas:
            if r.failed or r.tp != self.replicas[-1].tp:
                lines.append(
                    f"  replica {r.index}: TP {r.tp}, batch {r.local_batch}, power "
                    f"{r.power:.3f}x, {r.failed} failed, slots {list(r.slots)}"
                )
        return "\n".join(lines)


def plan_cluster(job: TrainingJob, failed: np.ndarray, policy: str) -> ClusterPlan:
    """Plan the job after ``failed`` (GPU indices or a bool mask) under ``policy``.

    Replicas with failed GPUs come first (the lowest ranks), worst first; each GPU is in at most
    one replica and never a failed one."""
    counts = slot_failures(job, failed)
    down = np.zeros(job.n_slots * job.base_tp, bool)
    down[failed_indices(failed, job.cluster.n_gpus)] = True
    best = best_plans(job, counts, policy)
    won = best.evaluations[int(best.choice[0])]
    cand, batches = won.candidate, won.batches
    t, pp = job.base_tp, job.par.pp
    if cand.policy == "dp-drop":
        groups = np.flatnonzero(counts == 0)[: int((batches[0] > 0).sum()) * pp].reshape(-1, pp)
        tab, lead = option_table(job, t, "ntp"), np.zeros(len(groups), np.int64)
    else:
        keep = np.flatnonzero(batches[0] > 0)
        groups = best.order[0][: best.leaders.shape[1] * pp].reshape(-1, pp)[keep]
        tab, lead = option_table(job, cand.core, cand.policy), best.leaders[0][keep]
    healthy_time = job.pace(t) + job.dp_comm(t, job.par.dp)
    dp = job.dp_comm(cand.core, len(groups))
    step_time = float(won.time[0])
    replicas = []
    for i, (slots, f) in enumerate(zip(groups, lead, strict=True)):
        d, b, speed = int(tab["tp"][f]), int(tab["batch"][f]), float(tab["speed"][f])
        gpus = []
        for s in slots:
            alive = s * t + np.flatnonzero(~down[s * t : (s + 1) * t])
            runs_reduced = cand.policy == "ntp" or counts[s] > 0
            gpus.append(alive[:d] if runs_reduced else alive)
        boosted = cand.policy == "ntp-pw" and f > 0
        replicas.append(
            ReplicaAssignment(
                index=i,
                slots=tuple(int(s) for s in slots),
                gpus=np.concatenate(gpus),
                tp=d,
                local_batch=b,
                power=job.power.power_for(speed) if boosted else 1.0,
                speed=speed if boosted else 1.0,
                step_time=float(tab["time"][f]) + dp,
                throughput=b / step_time * healthy_time / job.local_batch,
                failed=int(counts[slots].sum()),
            )
        )
    used = set(groups.ravel().tolist())
    dead = tuple(int(s) for s in np.flatnonzero(counts > job.max_failures))
    idle = tuple(s for s in range(job.n_slots) if s not in used and s not in dead)
    return ClusterPlan(
        policy=policy,
        chosen=cand,
        replicas=tuple(replicas),
        idle_slots=idle,
        dead_slots=dead,
        step_time=step_time,
        healthy_step_time=healthy_time,
        global_batch=int(batches.sum()),
        healthy_global_batch=job.par.global_batch,
        throughput=float(best.throughput[0]),
    )
