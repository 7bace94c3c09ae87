"""Monte Carlo over failures: the throughput each policy keeps over random failure patterns
(``throughput_samples``), the share of uniform-TP replicas that survive them
(``availability_samples``), and the spare scale-up domains each policy needs to hold the global
batch through a failure trace (``spare_domains``).

Random patterns are nested: each sample is one random order of the GPUs, and a failed fraction f
fails its first ``round(f n)``, so each sample's curve is the same cluster failing further.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_positive_int
from .failures import FailureTrace
from .packing import best_plans, candidates, evaluate, pack
from .plan_options import PLAN_POLICIES
from .replica_cost import TrainingJob
from .replicas import replica_availability

__all__ = ["throughput_samples", "availability_samples", "SpareResult", "spare_domains"]


def _check_fractions(fractions: Sequence[float] | np.ndarray, samples: int) -> np.ndarray:
    f = np.asarray(fractions, dtype=np.float64).ravel()
    if f.size == 0 or not np.all((f >= 0) & (f <= 1)):
        raise ValueError(f"failed fractions must lie in [0, 1], got {list(f)}.")
    check_positive_int(samples, "samples")
    return f


def _nested_failures(
    n_gpus: int, fractions: np.ndarray, samples: int, seed: int
) -> tuple[list[int], list[np.ndarray]]:
    """Per sample, one random order of the GPUs; fraction f fails its first round(f n). Nested,
    so each sample's curve is the same cluster failing further."""
    rng = np.random.default_rng(seed)
    k = [round(f * n_gpus) for f in fractions]
    orders = [rng.choice(n_gpus, max(k), replace=False) for _ in range(samples)]
    return k, orders


def throughput_samples(
    job: TrainingJob,
    fractions: Sequence[float] | np.ndarray,
    samples: int,
    seed: int = 0,
    policies: Sequence[str] = PLAN_POLICIES,
) -> dict[str, np.ndarray]:
    """{policy: (len(fractions), samples) relative throughput} for uniformly random failures."""
    f = _check_fractions(fractions, samples)
    k, orders = _nested_failures(job.cluster.n_gpus, f, samples, seed)
    out = {p: np.empty((len(f), samples)) for p in policies}
    for i, ki in enumerate(k):
        counts = np.stack(
            [np.bincount(o[:ki] // job.base_tp, minlength=job.n_slots) for o in orders]
        )
        for p in policies:
            out[p][i] = best_plans(job, counts, p).throughput
    return out


def availability_samples(
    n_gpus: int,
    domain_size: int,
    tps: Sequence[int],
    fractions: Sequence[float] | np.ndarray,
    samples: int,
    seed: int = 0,
) -> dict[int, np.ndarray]:
    """{tp: (len(fractions), samples)} share of TP-``tp`` replicas with no failed GPU."""
    f = _check_fractions(fractions, samples)
    k, orders = _nested_failures(n_gpus, f, samples, seed)
    return {
        tp: np.array(
            [[replica_availability(n_gpus, domain_size, tp, o[:ki]) for o in orders] for ki in k]
        )
        for tp in tps
    }


# ---- spare capacity over a failure trace --------------------------------------------------------
@dataclass(frozen=True)
class SpareResult:
    """needed: spare domains that hold the global batch all the time (None: more than
    ``available``); paused_fraction: share of time the batch falls short with no spares."""

    needed: int | None
    available: int
    paused_fraction: float


def _capacity(job: TrainingJob, counts: np.ndarray, policy: str) -> np.ndarray:
    """Largest global batch the policy's plans reach on these (S, n) slot counts."""
    _, leaders = pack(job, counts)
    healthy = (counts == 0).sum(axis=1)
    return np.max(
        [evaluate(job, leaders, healthy, c).batches.sum(axis=1) for c in candidates(job, policy)],
        axis=0,
    )


def spare_domains(
    job: TrainingJob, trace: FailureTrace, policies: Sequence[str] = PLAN_POLICIES
) -> dict[str, SpareResult]:
    """Spare scale-up domains each policy needs to hold ``job``'s global batch through ``trace``.

    The trace covers the job's GPUs followed by the spare domains (which fail too); with k spares
    the cluster is the first n_gpus + k x domain_size GPUs, and any replicas its TP groups form
    may run. Found by bisection (the batch a policy reaches never falls as domains are added)."""
    n, dom = job.cluster.n_gpus, job.cluster.domain_size
    if trace.n_gpus < n or (trace.n_gpus - n) % dom:
        raise ValueError(
            f"The trace must cover the job's {n} GPUs plus whole spare domains of "
            f"{dom}; it has {trace.n_gpus}."
        )
    available = (trace.n_gpus - n) // dom
    spd = job.slots_per_domain
    # the intervals where the trace is constant (between failure starts and ends): how long each
    # lasts, and the failed GPUs per TP group in it
    edges = np.unique(np.clip(np.concatenate(([0.0], trace.start, trace.end)), 0.0, trace.hours))
    times = edges[edges < trace.hours]
    durations = np.diff(np.append(times, trace.hours))
    counts = trace.down_per_group(times, job.base_tp)
    target = job.par.global_batch

    def short(k: int, policy: str) -> np.ndarray:
        return _capacity(job, counts[:, : job.n_slots + k * spd], policy) < target

    out = {}
    for policy in policies:
        paused = float(durations[short(0, policy)].sum() / trace.hours)
        lo, hi = -1, available  # short at lo (or lo = -1), enough at hi if at all
        if short(available, policy).any():
            out[policy] = SpareResult(None, available, paused)
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if short(mid, policy).any() else (lo, mid)
        out[policy] = SpareResult(hi, available, paused)
    return out
