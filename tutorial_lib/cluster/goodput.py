"""Goodput with restarts: what share of the wall-clock time a job spends on useful training when
every failure stops it, it restarts from its last checkpoint, and then runs at the throughput
its policy keeps with the GPUs then down.

- ``RestartCost``: what one interruption costs (detection, restart, checkpoint load, NTP's
  reshard) and what a checkpoint write costs, every default sourced.
- ``young_interval`` and ``daly_interval``: the classic optimum checkpoint intervals, both
  approximations of the maximiser of Daly's exact goodput of periodic checkpoints under Poisson
  failures (``tests/test_goodput.py`` checks them and the simulation against it);
  ``job_mtbf_hours``: a job's MTBF.
- ``simulate_goodput`` -> ``GoodputResult``: goodput over a ``FailureTrace``, exactly (no
  "half an interval" average: the work lost is the work since the checkpoint before each
  failure), with a breakdown of where the rest of the time went.
- ``optimal_interval`` -> ``IntervalSweep``: the simulated best interval on a log grid.

Sources (collected in the project's notes on restart costs):

- MegaScale (Jiang et al., arXiv 2402.15627, NSDI'24, sec. 4): "The average time required for
  detecting failure and executing diagnostic tests is less than 10 minutes"; the job "can catch
  up to the training progress prior to the crash within 15 minutes from the latest checkpoints";
  NCCL initialisation "under 30 seconds on more than 10,000 GPUs" once optimised (1047 s on
  2,048 GPUs before).
- Llama 3 (arXiv 2407.21783, sec. 3.3.1 and 3.3.4): Tectonic storage "supports a sustainable
  throughput of 2 TB/s and a peak throughput of 7 TB/s"; "higher than 90% effective training
  time" with 419 unexpected interruptions in 54 days on 16K GPUs.
- Kokolis et al. (arXiv 2410.21680, HPCA'25; read through quotes): restart overhead per failure
  u0 ~ 5-20 minutes (scheduling, initialisation, checkpoint load), checkpoint write ~ 5 min,
  hourly checkpoints typical. ByteRobust (arXiv 2509.16293; quoted): failover "often more than
  10 minutes" at 10,000 GPUs. ByteCheckpoint (arXiv 2407.20143, Table 8; quoted): a 405B
  Megatron checkpoint on 8,960 GPUs loads in 129.49 s and saves in 51.06 s (0.59 s blocking).
- Young, "A First Order Approximation to the Optimum Checkpoint Interval", CACM 17(9), 1974;
  Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
  22(3), 2006.

Times are seconds in ``RestartCost`` and the interval formulas, hours on traces (as in
``cluster.failures``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from .failures import FailureModel, FailureTrace, check_time
from .packing import Best, best_plans
from .plan_options import PLAN_POLICIES, option_table
from .replica_cost import TrainingJob

__all__ = [
    "BREAKDOWN",
    "RestartCost",
    "GoodputResult",
    "IntervalSweep",
    "young_interval",
    "daly_interval",
    "job_mtbf_hours",
    "simulate_goodput",
    "optimal_interval",
]

# Where the wall time that is not goodput goes (``GoodputResult.breakdown``'s keys).
BREAKDOWN = ("lost_work", "restart", "checkpoint", "degraded")


@dataclass(frozen=True, kw_only=True)
class RestartCost:
    """What an interruption and a checkpoint cost. Seconds, bytes and bytes/s.

    Per interruption (``downtime_s``)
        detect_s: noticing the failure and diagnosing it. MegaScale: "less than 10 minutes"
            on average for detection plus diagnostic tests; 600 s takes that bound.
        restart_s: rescheduling, process start and NCCL initialisation. 300 s: the low end of
            Kokolis et al.'s u0 ~ 5-20 min; MegaScale's optimised NCCL init is < 30 s of it at
            10K GPUs. With ``detect_s`` this gives 15 min, MegaScale's catch-up time and just
            above ByteRobust's "more than 10 minutes" failover.
        read_bandwidth: aggregate storage bandwidth a checkpoint loads at: Llama 3's 2 TB/s
            sustained. A real load is slower than its bytes at that rate (ByteCheckpoint's 405B
            load took 129 s, about 44 GB/s if it held 14 bytes per parameter): lower this to
            model it.
        replan_s: extra time an NTP plan with a reduced TP degree adds (the planner's search;
            ``best_plans`` takes milliseconds), on top of the reshard, which is derived
            (``reshard_s``). 0 by default: new communicators are part of ``restart_s``.
    Per checkpoint
        write_bandwidth: aggregate bandwidth a (blocking) checkpoint write reaches: Llama 3's
            2 TB/s sustained (7 TB/s peak). Asynchronous checkpointing blocks far less
            (ByteCheckpoint: 0.59 s of a 51 s save): raise it to model that.
        bytes_per_param: bytes a checkpoint holds per parameter: 2 (BF16 weights) + 12 (FP32
            master weights and Adam's two moments): ``cost_terms.memory_per_gpu``'s 16 less
            the 2-byte gradients, which are not saved.
    """

    detect_s: float = 600.0
    restart_s: float = 300.0
    read_bandwidth: float = 2e12
    write_bandwidth: float = 2e12
    bytes_per_param: float = 14.0
    replan_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("detect_s", "restart_s", "replan_s"):
            check_time(f"RestartCost.{name}", getattr(self, name))
        for name in ("read_bandwidth", "write_bandwidth", "bytes_per_param"):
            check_time(f"RestartCost.{name}", getattr(self, name), positive=True)

    def checkpoint_bytes(self, job: TrainingJob) -> float:
        """Bytes of one checkpoint of ``job``'s model: parameters x ``bytes_per_param``."""
        return job.model.params() * self.bytes_per_param

    def write_s(self, job: TrainingJob) -> float:
        """Seconds a checkpoint write stops training: its bytes at ``write_bandwidth``."""
        return self.checkpoint_bytes(job) / self.write_bandwidth

    def load_s(self, job: TrainingJob) -> float:
        """Seconds to load the last checkpoint at restart: its bytes at ``read_bandwidth``."""
        return self.checkpoint_bytes(job) / self.read_bandwidth

    def reshard_s(self, job: TrainingJob, tp: int) -> float:
        """Seconds to reshard a replica from the base TP degree t to ``tp`` < t (0 when
        ``tp >= t``), plus ``replan_s``. The checkpoint holds the base layout, so every restart
        into a reduced plan pays it: each of the tp ranks of a stage's group held 1/t of the
        stage's state (params / pp x ``bytes_per_param``) and now holds 1/tp, so it receives
        state x (1/tp - 1/t) over NVLink at ``collective_efficiency``; all groups in parallel.
        An upper bound (a distributed optimizer keeps only 1/dp of the Adam state per rank);
        ~6 ms for the paper's job at TP 28: restarts, not reshards, cost NTP its time."""
        t = job.base_tp
        if tp >= t:
            return 0.0
        state = job.model.params() / job.par.pp * self.bytes_per_param
        bw = job.cluster.collective_efficiency * job.cluster.nvlink_bandwidth
        return self.replan_s + state * (1 / tp - 1 / t) / bw

    def downtime_s(self, job: TrainingJob, tp: int | None = None) -> float:
        """Seconds from a failure to training again: detect + restart + load, plus the reshard
        to ``tp`` when the new plan runs a replica at a reduced degree (None: it does not)."""
        reshard = 0.0 if tp is None else self.reshard_s(job, tp)
        return self.detect_s + self.restart_s + self.load_s(job) + reshard

    def as_dict(self, job: TrainingJob) -> dict[str, float]:
        """The parameters and what they give for ``job`` (for ``ntp_reproduce``'s setup)."""
        return {
            **asdict(self),
            "checkpoint_bytes": self.checkpoint_bytes(job),
            "write_s": self.write_s(job),
            "load_s": self.load_s(job),
            "reshard_s_to_lowest_degree": self.reshard_s(job, job.degrees[0]),
            "downtime_s": self.downtime_s(job),
        }


# ---- checkpoint intervals -----------------------------------------------------------------------
def young_interval(checkpoint_write_s: float, mtbf_s: float) -> float:
    """Young (1974): compute time between checkpoints ``sqrt(2 delta M)`` that minimises the
    first-order waste delta / tau + tau / (2 M); ``delta`` the write time, ``M`` the MTBF."""
    d = check_time("checkpoint_write_s", checkpoint_write_s, positive=True)
    m = check_time("mtbf_s", mtbf_s, positive=True)
    return math.sqrt(2 * d * m)


def daly_interval(checkpoint_write_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum of compute time between checkpoints:
    ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta`` for delta < 2M,
    else M. Reproduces Daly's figure results (delta = 5 min: M = 24 h -> 117 min, 6 h -> 57 min,
    15 min -> 9.1 min)."""
    d = check_time("checkpoint_write_s", checkpoint_write_s, positive=True)
    m = check_time("mtbf_s", mtbf_s, positive=True)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def job_mtbf_hours(model: FailureModel, n_gpus: int) -> float:
    """Mean hours between failures of a job on ``n_gpus`` GPUs: 1 / (n x rate), with the rate
    lowered by the share of time a GPU is down (``FailureModel.expected_failures``). Llama 3's
    rate on 32,768 GPUs: ~1.55 h."""
    rate = model.expected_failures(n_gpus, 1.0)
    if rate <= 0:
        raise ValueError("The failure model never fails: the MTBF is infinite.")
    return 1 / rate


# ---- the trace simulation -----------------------------------------------------------------------
class _Segments(NamedTuple):
    """The runs between interruptions of one trace under one policy (independent of the
    checkpoint interval): ``run_h`` (K,) hours running, ``throughput`` (K,) relative,
    ``interrupted`` (K,) bool (ended by a failure, not by the trace's end), and ``downtime_s``
    (F,) of each interruption's recovery as planned."""

    run_h: np.ndarray
    throughput: np.ndarray
    interrupted: np.ndarray
    downtime_s: np.ndarray
    hours: float


def _lowest_degrees(job: TrainingJob, best: Best) -> np.ndarray:
    """(S,) the lowest TP degree a running replica has in each pattern's winning plan."""
    out = np.full(len(best.choice), job.base_tp, np.int64)
    for s, k in enumerate(best.choice):
        ev = best.evaluations[int(k)]
        if ev.candidate.policy == "dp-drop":
            continue
        lead = best.leaders[s]
        running = (ev.batches[s] > 0) & (lead > 0)
        if running.any():
            out[s] = option_table(job, ev.candidate.core, ev.candidate.policy)["tp"][
                lead[running]
            ].min()
    return out


def _segments(
    job: TrainingJob, trace: FailureTrace, policy: str, restart: RestartCost
) -> _Segments:
    """Walk the failures in time order: each one stops the job; the recovery takes
    ``restart.downtime_s`` (with the reshard the new plan needs), and a failure during a
    recovery starts it again. The plan, and so the throughput, is set by the GPUs down at the
    failure; GPUs that come back rejoin at the next restart."""
    if policy not in PLAN_POLICIES:
        raise ValueError(f"Unknown policy {policy!r}; use one of {PLAN_POLICIES}.")
    if not isinstance(restart, RestartCost):
        raise TypeError("restart must be a RestartCost.")
    if trace.n_gpus != job.cluster.n_gpus:
        raise ValueError(f"The trace covers {trace.n_gpus} GPUs, the job {job.cluster.n_gpus}.")
    hours = trace.hours
    fails = trace.start[(trace.start >= 0) & (trace.start < hours)]
    best = best_plans(
        job, trace.down_per_group(np.concatenate(([0.0], fails)), job.base_tp), policy
    )
    degree = _lowest_degrees(job, best)
    down_s = np.array([restart.downtime_s(job, int(d)) for d in degree[1:]])
    runs, thr, cut = [], [], []
    ready, plan = 0.0, 0
    for i, f in enumerate(fails):
        if f >= ready:
            runs.append(f - ready)
            thr.append(best.throughput[plan])
            cut.append(True)
        ready, plan = f + down_s[i] / 3600, i + 1
    if ready < hours:
        runs.append(hours - ready)
        thr.append(best.throughput[plan])
        cut.append(False)
    return _Segments(np.array(runs), np.array(thr), np.array(cut, bool), down_s, hours)


def _account(seg: _Segments, interval_h: np.ndarray, write_h: float) -> dict[str, np.ndarray]:
    """Hours per category for each interval (I,) over the segments: a run computes ``interval``,
    writes for ``write_h``, and so on; a failure loses the compute since the last complete
    write (a write in progress is lost too, counted as checkpoint time)."""
    tau = np.asarray(interval_h, np.float64)[:, None]
    length = seg.run_h[None, :]
    full = np.floor(length / (tau + write_h))
    rem = length - full * (tau + write_h)
    checkpoint = full * write_h + np.maximum(rem - tau, 0.0)
    lost = np.where(seg.interrupted, np.minimum(rem, tau), 0.0)
    kept = length - checkpoint - lost
    return {
        "useful": (kept * seg.throughput).sum(axis=1),
        "degraded": (kept * (1 - seg.throughput)).sum(axis=1),
        "lost_work": lost.sum(axis=1),
        "checkpoint": checkpoint.sum(axis=1),
        "restart": np.full(len(tau), seg.hours - seg.run_h.sum()),
    }


@dataclass(frozen=True)
class GoodputResult:
    """Goodput of one policy on one trace at one checkpoint interval.

    goodput: useful training (healthy-job-equivalent hours: hours kept x relative throughput)
        over wall hours. breakdown: the shares of wall time lost to ``lost_work`` (compute
        since the last checkpoint), ``restart`` (recoveries), ``checkpoint`` (writes) and
        ``degraded`` (kept hours x (1 - throughput)); goodput + their sum = 1.
    interruptions: failures in the trace; mean_downtime_s: one recovery as planned.
    """

    policy: str
    interval_h: float
    wall_h: float
    goodput: float
    breakdown: dict[str, float]
    interruptions: int
    mean_downtime_s: float


def simulate_goodput(
    job: TrainingJob,
    trace: FailureTrace,
    policy: str,
    interval_h: float,
    restart: RestartCost | None = None,
) -> GoodputResult:
    """Goodput of ``job`` under ``policy`` over ``trace`` (on the job's GPUs), checkpointing
    after every ``interval_h`` hours of compute (Young's and Daly's tau; the write adds
    ``restart.write_s``).

    The restart model (the honest one for synchronous training today): **every failure stops
    the job**, whatever the policy. A dead GPU aborts the NCCL communicators, so even when
    dp-drop or NTP could carry on without it, the job restarts from its last checkpoint: it
    pays ``restart.downtime_s`` (detection, restart, checkpoint load, and for an NTP plan at a
    reduced degree the reshard) and loses the compute since that checkpoint, exactly. It then
    runs at the relative throughput its policy's plan keeps with the GPUs down at the failure
    (``packing.best_plans``, as ``throughput_samples`` uses). A failure on a GPU the plan
    leaves idle interrupts too (a small overcount). The trace starts from a checkpoint with
    the GPUs down at time 0 planned for; the work since the last checkpoint at its end is kept.
    """
    tau = check_time("interval_h", interval_h, positive=True)
    restart = RestartCost() if restart is None else restart
    seg = _segments(job, trace, policy, restart)
    hours = _account(seg, np.array([tau]), restart.write_s(job) / 3600)
    mean_down = float(seg.downtime_s.mean()) if len(seg.downtime_s) else 0.0
    return GoodputResult(
        policy=policy,
        interval_h=tau,
        wall_h=trace.hours,
        goodput=float(hours["useful"][0] / trace.hours),
        breakdown={k: float(hours[k][0] / trace.hours) for k in BREAKDOWN},
        interruptions=len(seg.downtime_s),
        mean_downtime_s=mean_down,
    )


class IntervalSweep(NamedTuple):
    """``goodput`` (I,) (mean over the traces) at each of ``intervals_h`` (I,); the best."""

    intervals_h: np.ndarray
    goodput: np.ndarray
    best_h: float
    best_goodput: float


def optimal_interval(
    job: TrainingJob,
    traces: FailureTrace | Sequence[FailureTrace],
    policy: str,
    restart: RestartCost | None = None,
    intervals_h: Sequence[float] | np.ndarray | None = None,
) -> IntervalSweep:
    """The checkpoint interval with the highest simulated goodput (mean over ``traces``), on
    ``intervals_h`` (default: 49 points on a log grid from 1/8 to 8 times Young's interval at
    the traces' observed MTBF). Flat near the optimum, so a single trace's best is noisy."""
    traces = [traces] if isinstance(traces, FailureTrace) else list(traces)
    if not traces:
        raise ValueError("optimal_interval needs at least one trace.")
    restart = RestartCost() if restart is None else restart
    write_h = restart.write_s(job) / 3600
    segs = [_segments(job, t, policy, restart) for t in traces]
    if intervals_h is None:
        failures = sum(len(s.downtime_s) for s in segs)
        mtbf_h = sum(t.hours for t in traces) / max(failures, 1)
        young = young_interval(write_h, mtbf_h)
        grid = young * 2.0 ** np.linspace(-3, 3, 49)
    else:
        grid = np.asarray(intervals_h, np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
            raise ValueError(f"intervals_h must be positive and finite, got {list(grid)}.")
    goodput = np.mean([_account(s, grid, write_h)["useful"] / s.hours for s in segs], axis=0)
    k = int(np.argmax(goodput))
    return IntervalSweep(grid, goodput, float(grid[k]), float(goodput[k]))
