"""What a degraded replica may run under each policy: the largest local batch that keeps pace with
a healthy replica, the speed-up (power boost) that would let it keep its whole batch, and the
table ``option_table`` returns, by failures in the replica's worst TP group.

``PLAN_POLICIES`` are the policies of ``cluster.plans`` (its docstring describes them):
``dp-drop``, ``ntp`` and ``ntp-pw``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .replica_cost import TrainingJob

__all__ = [
    "PLAN_POLICIES",
    "ReplicaOption",
    "fit_batch",
    "speed_needed",
    "replica_option",
    "option_table",
]

PLAN_POLICIES = ("dp-drop", "ntp", "ntp-pw")
_TOL = 1e-9  # relative slack when comparing step times that are equal on paper


class ReplicaOption(NamedTuple):
    """What a degraded replica at one TP degree runs: ``batch`` sequences (0: it cannot keep
    pace), boosted ``speed`` times, in ``time`` seconds per step (its own, without the DP term)."""

    batch: int
    speed: float
    time: float


def fit_batch(job: TrainingJob, tp: int, core: int, speed: float) -> int:
    """Largest local batch (micro-batch multiple, at most the healthy one) with which a TP-``tp``
    replica boosted ``speed`` times keeps pace in a job pairing at ``core`` ranks."""
    mb, p = job.par.micro_batch, job.par.pp
    x = sum(job.per_microbatch(tp, speed).values())
    room = (job.pace(core) - job.fixed_time(tp, core)) * (1 + _TOL) / x - (p - 1)
    return int(min(max(math.floor(room), 0), job.local_batch // mb)) * mb


def speed_needed(job: TrainingJob, tp: int, core: int, batch: int) -> float:
    """Speed-up at which a TP-``tp`` replica with ``batch`` keeps pace (inf: none does)."""
    x = job.per_microbatch(tp)
    steps = batch // job.par.micro_batch + job.par.pp - 1
    room = (job.pace(core) - job.fixed_time(tp, core)) / steps - x["pp_p2p"]
    boosted = sum(x.values()) - x["pp_p2p"]
    return math.inf if room <= 0 else max(1.0, boosted / room * (1 + _TOL))


def replica_option(job: TrainingJob, tp: int, core: int, pw: bool) -> ReplicaOption:
    """What a TP-``tp`` replica runs in a job pairing at ``core`` ranks, boosted if ``pw``."""
    b, power = job.local_batch, job.power
    batch, speed = fit_batch(job, tp, core, 1.0), 1.0
    if pw:
        need = speed_needed(job, tp, core, b)
        if need <= power.max_speed:
            batch, speed = b, need
        elif power.shortfall == "stretch":
            batch, speed = b, power.max_speed
        else:
            batch = fit_batch(job, tp, core, power.max_speed)
            speed = speed_needed(job, tp, core, batch) if batch else 1.0
    if not batch:
        return ReplicaOption(0, 1.0, 0.0)
    time = job.replica_time(tp, batch, speed, core)
    return ReplicaOption(batch, speed, time.total - time["dp_comm"])


def option_table(job: TrainingJob, core: int, policy: str) -> dict[str, np.ndarray]:
    """Per failure count f = 0..t of a replica's worst group, under a job pairing at ``core``:
    ``tp`` (0: cannot run), ``batch``, ``speed``, ``time`` (own step time without DP); computed
    once per job (``TrainingJob.cached``)."""
    return job.cached(("option_table", core, policy), lambda: _option_table(job, core, policy))


def _option_table(job: TrainingJob, core: int, policy: str) -> dict[str, np.ndarray]:
    """Per failure count f = 0..t of a replica's worst group, under a job pairing at ``core``:
    ``tp`` (0: cannot run), ``batch``, ``speed``, ``time`` (own step time without DP). Among the
    degrees a group with f failures can run, the largest batch wins, then the least power (with
    ``"stretch"``: the shortest step), then the highest degree."""
    t = job.base_tp
    out = {
        "tp": np.zeros(t + 1, np.int64),
        "batch": np.zeros(t + 1, np.int64),
        "speed": np.ones(t + 1),
        "time": np.zeros(t + 1),
    }
    out["tp"][0], out["batch"][0], out["time"][0] = t, job.local_batch, job.pace(core)
    choices = [core] if job.one_reduced_tp else [d for d in job.degrees if d >= core]
    options = {d: replica_option(job, d, core, policy == "ntp-pw") for d in choices}
    stretch = policy == "ntp-pw" and job.power.shortfall == "stretch"

    def rank(d: int) -> tuple[int, float, int]:
        o = options[d]
        return o.batch, -o.time if stretch else -job.power.power_for(o.speed), d

    for f in range(1, t + 1):
        fits = [d for d, o in options.items() if d <= t - f and o.batch > 0]
        if fits:
            d = max(fits, key=rank)
            out["tp"][f], out["batch"][f] = d, options[d].batch
            out["speed"][f], out["time"][f] = options[d].speed, options[d].time
    return out
