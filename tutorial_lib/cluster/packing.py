"""Packing damaged TP groups into replicas and scoring the plans a policy chooses among, vectorised
over many failure patterns at once (``cluster.plans`` turns the winner into a ``ClusterPlan``,
``cluster.monte_carlo`` runs it over random failures and traces).

At restart the resource manager puts partially failed TP groups into as few replicas as
possible, worst first, at the lowest ranks; a replica's degree is set by its worst group, and a
group with fewer survivors than the lowest allowed degree is dead (NTP paper, sec. 4.4). A dead
group counts as the worst: the replica it lands in is lost anyway, so it takes the next worst
groups with it rather than healthy ones. (Packing dead groups last made a further failure
able to *raise* throughput, when it turned a partly failed group dead and freed a healthy one.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .plan_options import PLAN_POLICIES, option_table
from .replica_cost import TrainingJob
from .replicas import failed_indices

__all__ = [
    "Candidate",
    "Evaluation",
    "Best",
    "slot_failures",
    "pack",
    "candidates",
    "evaluate",
    "best_plans",
]


class Candidate(NamedTuple):
    """A plan a policy may choose: ``policy``'s rules with the DP all-reduce pairing ranks at the
    ``core`` degree."""

    policy: str
    core: int


class Evaluation(NamedTuple):
    """A candidate on S failure patterns: ``throughput`` (S,) relative to the healthy job,
    ``batches`` (S, G) kept per replica, ``time`` (S,) the job's step time."""

    candidate: Candidate
    throughput: np.ndarray
    batches: np.ndarray
    time: np.ndarray


class Best(NamedTuple):
    """The best candidate per pattern: its ``throughput`` (S,), ``choice`` (S,) (its index in
    ``evaluations``), every candidate's ``evaluations``, and the packing (``order``,
    ``leaders``) they share; see ``pack``."""

    throughput: np.ndarray
    choice: np.ndarray
    evaluations: list[Evaluation]
    order: np.ndarray
    leaders: np.ndarray


def slot_failures(job: TrainingJob, failed: np.ndarray) -> np.ndarray:
    """(n_slots,) int64 failed GPUs per TP group; ``failed``: GPU indices or an (n_gpus,) bool mask."""
    failed = failed_indices(failed, job.cluster.n_gpus)
    return np.bincount(failed // job.base_tp, minlength=job.n_slots).astype(np.int64)


def pack(job: TrainingJob, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack (S, n) slot failure counts: (order, leaders). ``order`` (S, n): slots worst first
    (dead slots first of all, ties by index); ``leaders`` (S, G): failures in each replica's
    worst group, -1 for a replica that holds a dead group."""
    dead = job.max_failures + 1  # above every usable count: dead slots sort first
    key = np.minimum(counts, dead)
    idx = np.broadcast_to(np.arange(counts.shape[1]), counts.shape)
    order = np.lexsort((idx, -key), axis=-1)
    key = np.take_along_axis(key, order, axis=-1)
    pp = job.par.pp
    n = counts.shape[1] // pp * pp
    lead = key[:, 0:n:pp]
    return order, np.where(lead < dead, lead, -1)


def candidates(job: TrainingJob, policy: str) -> list[Candidate]:
    """The plans a policy chooses among: its own at every core degree and, with ``"shrink"``,
    every weaker policy's; ``"stretch"`` keeps to its own (it holds the batch)."""
    if policy == "ntp-pw" and job.power.shortfall == "stretch":
        return [Candidate("ntp-pw", c) for c in (*job.degrees, job.base_tp)]
    out = [Candidate("dp-drop", job.base_tp)]
    for p in PLAN_POLICIES[1 : PLAN_POLICIES.index(policy) + 1]:
        out += [Candidate(p, c) for c in job.degrees]
    return out


def evaluate(
    job: TrainingJob, leaders: np.ndarray, healthy: np.ndarray, cand: Candidate
) -> Evaluation:
    """Relative throughput, kept batches and job step time of one candidate on S packed patterns
    (``leaders`` from ``pack``; ``healthy``: (S,) TP groups with no failure)."""
    b, t, pp = job.local_batch, job.base_tp, job.par.pp
    if cand.policy == "dp-drop":
        n_rep = healthy // pp
        batches = (np.arange(leaders.shape[1]) < n_rep[:, None]) * b
        time = np.full(len(n_rep), job.pace(t))
    else:
        tab = option_table(job, cand.core, cand.policy)
        lead = np.clip(leaders, 0, t)
        batches = np.where(leaders >= 0, tab["batch"][lead], 0)
        own = np.where(batches > 0, tab["time"][lead], 0.0)
        time = np.maximum(job.pace(cand.core), own.max(axis=1, initial=0.0))
    n_rep = (batches > 0).sum(axis=1)
    time = time + np.array([job.dp_comm(cand.core, int(r)) for r in n_rep])
    healthy_rate = job.local_batch * job.par.dp / (job.pace(t) + job.dp_comm(t, job.par.dp))
    return Evaluation(cand, batches.sum(axis=1) / time / healthy_rate, batches, time)


def best_plans(job: TrainingJob, counts: np.ndarray, policy: str) -> Best:
    """Evaluate every candidate plan on (S, n) slot counts; pick the highest throughput (with
    ``"stretch"``: the largest global batch first)."""
    if policy not in PLAN_POLICIES:
        raise ValueError(f"Unknown policy {policy!r}; use one of {PLAN_POLICIES}.")
    counts = np.atleast_2d(counts)
    order, leaders = pack(job, counts)
    healthy = (counts == 0).sum(axis=1)
    evaluations = [evaluate(job, leaders, healthy, c) for c in candidates(job, policy)]
    thr = np.stack([e.throughput for e in evaluations])
    key = thr
    if policy == "ntp-pw" and job.power.shortfall == "stretch":
        key = np.stack([e.batches.sum(axis=1) for e in evaluations]) + thr / 2  # batch first
    arg = key.argmax(axis=0)
    return Best(thr[arg, np.arange(thr.shape[1])], arg, evaluations, order, leaders)
