"""GPU failures over time: a failure model from the Llama 3 run, seeded Monte Carlo traces, and
what random failures do to data-parallel replicas.

- ``FailureModel`` (with ``Recovery``): how often a GPU fails (per GPU-hour), which share of
  failures are hardware, and how long each kind keeps its GPU down. ``FailureModel.llama3()``
  derives the rate from the Llama 3 405B pre-training run and the recovery times from the NTP
  paper's simulation.
- ``simulate_trace`` -> ``FailureTrace``: which GPUs are down when, stored as one event per
  failure (GPU, start, end); ``down_counts``, ``failed_fraction``, ``down_per_group``,
  ``down_at``.
  ``fraction_of_time_above``: the share of a trace with more than a given fraction failed.
- ``random_failures``: a given fraction of GPUs failed, uniformly at random.
- ``expected_replica_availability``: the chance that a replica avoids every one of a number of
  random failures (``cluster.replicas`` counts where given failures land).

Sources: "The Llama 3 Herd of Models" (arXiv 2407.21783), section 3.3.4 "Reliability and
Operational Challenges" and its Table 5; "Nonuniform-Tensor-Parallelism" (Arfeen et al., arXiv
2504.06095), the failure simulation behind its Figure 4 and the availability curves of Figure 3.
Times are in hours throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..checks import check_positive_int

__all__ = [
    "Recovery",
    "FailureModel",
    "FailureTrace",
    "simulate_trace",
    "fraction_of_time_above",
    "random_failures",
    "expected_replica_availability",
    "RECOVERY_DISTS",
    "LLAMA3_INTERRUPTIONS",
    "LLAMA3_DAYS",
    "LLAMA3_GPUS",
    "LLAMA3_HARDWARE_FRACTION",
    "LLAMA3_RATE_PER_GPU_HOUR",
]

# Llama 3 405B pre-training (arXiv 2407.21783, section 3.3.4, Table 5): in a 54-day snapshot on
# 16,384 H100s there were 466 job interruptions, 47 planned and 419 unexpected; about 78% of the
# unexpected ones were attributed to confirmed or suspected hardware issues.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_HARDWARE_FRACTION = 0.78
LLAMA3_RATE_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)  # ~1.97e-5

RECOVERY_DISTS = ("fixed", "exponential", "lognormal")


def check_time(name: str, value: float, positive: bool = False) -> float:
    """``value`` as a float if it is finite and ``>= 0`` (``> 0`` if ``positive``): a time, a
    rate or a bandwidth of the cluster models; else ValueError naming it."""
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        want = "positive" if positive else ">= 0"
        raise ValueError(f"{name} must be {want} and finite, got {value!r}.")
    return float(value)


def check_fraction(name: str, value: float) -> None:
    """ValueError naming ``name`` unless ``value`` lies in [0, 1] (NaN does not)."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}.")


@dataclass(frozen=True)
class Recovery:
    """How long a failure keeps its GPU down: a distribution with a given mean.

    mean_hours: the mean time from failure to the GPU being back (repair, replacement, restart).
    dist: ``"fixed"`` (every recovery takes exactly the mean), ``"exponential"`` or
        ``"lognormal"`` (log of the time ~ Normal(mu, sigma), mu chosen so the mean is right).
    sigma: the lognormal's shape (standard deviation of the log); unused by the others.
    """

    mean_hours: float
    dist: str = "fixed"
    sigma: float = 1.0

    def __post_init__(self) -> None:
        check_time("Recovery.mean_hours", self.mean_hours, positive=True)
        if self.dist not in RECOVERY_DISTS:
            raise ValueError(f"Recovery.dist must be one of {RECOVERY_DISTS}, got {self.dist!r}.")
        check_time("Recovery.sigma", self.sigma, positive=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` recovery times in hours, float64."""
        if self.dist == "fixed":
            return np.full(n, self.mean_hours)
        if self.dist == "exponential":
            return rng.exponential(self.mean_hours, n)
        mu = math.log(self.mean_hours) - self.sigma**2 / 2  # E[exp(N(mu, s^2))] = exp(mu + s^2/2)
        return rng.lognormal(mu, self.sigma, n)


@dataclass(frozen=True)
class FailureModel:
    """Independent GPU failures at a constant rate, each hardware or software, each followed by
    a recovery during which that GPU is down (and cannot fail again).

    Rate
        rate_per_gpu_hour: failures per GPU-hour while the GPU is up, all causes together.
        hardware_fraction: the share of failures that are hardware; the rest are software.
    Recovery
        hardware: recovery-time distribution of hardware failures (days: repair or replacement).
        software: recovery-time distribution of software failures (hours: restart).

    The defaults are ``FailureModel.llama3()``'s.
    """

    rate_per_gpu_hour: float = LLAMA3_RATE_PER_GPU_HOUR
    hardware_fraction: float = LLAMA3_HARDWARE_FRACTION
    hardware: Recovery = field(default_factory=lambda: Recovery(5 * 24.0))
    software: Recovery = field(default_factory=lambda: Recovery(3.0))

    def __post_init__(self) -> None:
        check_time("rate_per_gpu_hour", self.rate_per_gpu_hour)
        check_fraction("hardware_fraction", self.hardware_fraction)
        for name in ("hardware", "software"):
            if not isinstance(getattr(self, name), Recovery):
                raise TypeError(f"FailureModel.{name} must be a Recovery.")

    @classmethod
    def llama3(
        cls,
        hardware_days: float = 5.0,
        software_hours: float = 3.0,
        dist: str = "fixed",
        rate_scale: float = 1.0,
    ) -> FailureModel:
        """The failure rate of the Llama 3 405B run, with the NTP paper's recovery times.

        Rate: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Llama 3 paper,
        section 3.3.4), counted as one failed GPU each:
        ``rate = 419 / (54 * 24 * 16384) = 419 / 21,233,664 ~ 1.97e-5`` per GPU-hour, i.e. a
        mean time between failures of ~50,700 hours (~5.8 years) per GPU, or one failure every
        ~3.1 hours on the whole 16,384-GPU cluster. Split: ``hardware_fraction = 0.78`` (the
        paper attributes about 78% of the unexpected interruptions to hardware), 0.22 software.

        Recovery: the NTP paper (arXiv 2504.06095, Figure 4) simulates Llama 3's rates with
        hardware failures recovering after 3 or 5 days (which the authors think may be
        optimistic for a hardware replacement) and software failures after 3 hours, and finds
        more than 0.1% of the GPUs down 81% of the time over a 15-day trace. With 5 days and
        all GPUs healthy at the start, 32,768 GPUs give ~82% on average over seeds (3 days:
        ~64%), so 5 days is the default. ``dist="fixed"`` takes the recovery times as exact
        durations; ``"exponential"`` or ``"lognormal"`` keep the means and add spread.
        ``rate_scale`` multiplies the rate (the NTP paper also considers a 3x higher rate).
        """
        check_time("rate_scale", rate_scale)
        return cls(
            rate_per_gpu_hour=LLAMA3_RATE_PER_GPU_HOUR * rate_scale,
            hardware_fraction=LLAMA3_HARDWARE_FRACTION,
            hardware=Recovery(hardware_days * 24.0, dist),
            software=Recovery(software_hours, dist),
        )

    @property
    def mean_recovery_hours(self) -> float:
        """Mean time a failure keeps its GPU down, over both causes."""
        hf = self.hardware_fraction
        return hf * self.hardware.mean_hours + (1 - hf) * self.software.mean_hours

    def expected_down_fraction(self) -> float:
        """Long-run share of time a GPU is down: each GPU alternates Exp(rate) up-times with
        recoveries, so it is ``rate * R / (1 + rate * R)`` with R the mean recovery."""
        load = self.rate_per_gpu_hour * self.mean_recovery_hours
        return load / (1 + load)

    def expected_failures(self, n_gpus: int, hours: float) -> float:
        """Expected failures on ``n_gpus`` GPUs in ``hours`` in the long run (a GPU that is
        down cannot fail, which lowers the rate by the factor ``1 - expected_down_fraction``)."""
        return n_gpus * hours * self.rate_per_gpu_hour * (1 - self.expected_down_fraction())


@dataclass(frozen=True, eq=False)
class FailureTrace:
    """Failures of ``n_gpus`` GPUs over ``[0, hours]``, one entry per failure, sorted by start.

    gpu: (F,) int64 GPU index. start, end: (F,) float64 hours; GPU ``gpu[i]`` is down on
    ``[start[i], end[i])``. A start is negative for a failure that began during the burn-in; an
    end may lie past ``hours``. hardware: (F,) bool, the failure's cause.
    step_hours: spacing of ``times``, the default grid of ``down_counts``/``failed_fraction``.
    """

    n_gpus: int
    hours: float
    step_hours: float
    gpu: np.ndarray
    start: np.ndarray
    end: np.ndarray
    hardware: np.ndarray

    @property
    def n_failures(self) -> int:
        return len(self.gpu)

    @property
    def times(self) -> np.ndarray:
        """The grid 0, step, 2 step, ... up to ``hours``, in hours."""
        return np.arange(math.floor(self.hours / self.step_hours + 1e-9) + 1) * self.step_hours

    @cached_property
    def _sorted_ends(self) -> np.ndarray:
        return np.sort(self.end)

    def down_counts(self, times: np.ndarray | None = None) -> np.ndarray:
        """Number of GPUs down at each time (default ``self.times``): started and not ended."""
        t = self.times if times is None else np.asarray(times, dtype=np.float64)
        started = np.searchsorted(self.start, t, side="right")
        ended = np.searchsorted(self._sorted_ends, t, side="right")
        return (started - ended).astype(np.int64)

    def failed_fraction(self, times: np.ndarray | None = None) -> np.ndarray:
        """Fraction of the GPUs down at each time (default ``self.times``)."""
        return self.down_counts(times) / self.n_gpus

    def down_per_group(self, times: np.ndarray, size: int) -> np.ndarray:
        """(len(times), n_gpus // size) GPUs down in each group of ``size`` consecutive GPUs (a
        TP group) at each of the sorted ``times``."""
        lo = np.searchsorted(times, self.start, side="left")  # first time with start <= t
        hi = np.searchsorted(times, self.end, side="left")  # first time with t >= end
        diff = np.zeros((len(times) + 1, self.n_gpus // size), np.int64)
        np.add.at(diff, (lo, self.gpu // size), 1)
        np.add.at(diff, (hi, self.gpu // size), -1)
        return np.cumsum(diff, axis=0)[:-1]

    def down_at(self, t: float) -> np.ndarray:
        """(n_gpus,) bool: which GPUs are down at time ``t``."""
        mask = np.zeros(self.n_gpus, dtype=bool)
        active = (self.start <= t) & (t < self.end)
        mask[self.gpu[active]] = True
        return mask

    def failed_indices(self, t: float) -> np.ndarray:
        """Sorted indices of the GPUs down at time ``t`` (input for ``failed_per_domain``)."""
        return np.flatnonzero(self.down_at(t))


def _drop_while_down(gpu: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Keep-mask over failures sorted by (gpu, start): a failure arriving while its GPU is
    still down from a kept earlier failure is dropped. By memorylessness this turns Poisson
    arrivals into exact Exp(rate) up-times. Loops over the rank of a failure within its GPU
    (rarely more than 2 or 3), vectorised over GPUs."""
    n = len(gpu)
    first = np.ones(n, dtype=bool)
    first[1:] = gpu[1:] != gpu[:-1]
    group = np.cumsum(first) - 1
    rank = np.arange(n) - np.flatnonzero(first)[group]
    keep = np.zeros(n, dtype=bool)
    last_end = np.full(int(group[-1]) + 1 if n else 0, -np.inf)
    for r in range(int(rank.max()) + 1 if n else 0):
        idx = np.flatnonzero(rank == r)
        ok = start[idx] >= last_end[group[idx]]
        keep[idx[ok]] = True
        last_end[group[idx[ok]]] = end[idx[ok]]
    return keep


def simulate_trace(
    model: FailureModel,
    n_gpus: int,
    days: float,
    step_hours: float = 1.0,
    seed: int = 0,
    burn_in_days: float = 0.0,
) -> FailureTrace:
    """A seeded Monte Carlo trace of ``n_gpus`` GPUs over ``days`` days.

    Failure arrivals on the whole cluster are one Poisson process (rate ``n_gpus * rate``),
    each at a uniformly random GPU and time; a failure is hardware with probability
    ``hardware_fraction`` and draws its recovery time from that cause's distribution; arrivals
    at a GPU that is already down are dropped. No loop over GPUs: the work grows with the
    number of failures, not of GPUs.

    burn_in_days: simulate this long before time 0, so that the trace starts with the GPUs
    that would be down in a cluster already running (default 0: all GPUs start healthy).
    """
    n_gpus = check_positive_int(n_gpus, "n_gpus")
    check_time("days", days, positive=True)
    check_time("step_hours", step_hours, positive=True)
    check_time("burn_in_days", burn_in_days)
    hours, t0 = days * 24.0, -burn_in_days * 24.0
    rng = np.random.default_rng(seed)
    n = rng.poisson(model.rate_per_gpu_hour * n_gpus * (hours - t0))
    gpu = rng.integers(0, n_gpus, n, dtype=np.int64)
    start = t0 + rng.random(n) * (hours - t0)
    hardware = rng.random(n) < model.hardware_fraction
    duration = np.empty(n)
    duration[hardware] = model.hardware.sample(rng, int(hardware.sum()))
    duration[~hardware] = model.software.sample(rng, int(n - hardware.sum()))
    end = start + duration

    order = np.lexsort((start, gpu))
    gpu, start, end, hardware = gpu[order], start[order], end[order], hardware[order]
    keep = _drop_while_down(gpu, start, end) & (end > 0)  # burn-in failures over before 0 go
    order = np.argsort(start[keep], kind="stable")
    return FailureTrace(
        n_gpus=n_gpus,
        hours=hours,
        step_hours=float(step_hours),
        gpu=gpu[keep][order],
        start=start[keep][order],
        end=end[keep][order],
        hardware=hardware[keep][order],
    )


def fraction_of_time_above(trace: FailureTrace, threshold: float) -> float:
    """Share of ``[0, trace.hours]`` during which more than ``threshold`` of the GPUs are down
    (strictly more; e.g. 0.001 for the NTP paper's "> 0.1% failed"). Exact: the count of down
    GPUs is constant between failure starts and ends, so no time grid is involved."""
    check_fraction("threshold", threshold)
    edges = np.concatenate(([0.0, trace.hours], trace.start, trace.end))
    edges = np.unique(np.clip(edges, 0.0, trace.hours))
    above = trace.down_counts(edges[:-1]) > threshold * trace.n_gpus
    return float(np.diff(edges)[above].sum() / trace.hours)


def random_failures(n_gpus: int, fraction: float, seed: int = 0) -> np.ndarray:
    """Sorted indices of ``round(fraction * n_gpus)`` distinct GPUs, chosen uniformly at random
    (Python's ``round``: halves go to the even integer)."""
    n_gpus = check_positive_int(n_gpus, "n_gpus")
    check_fraction("fraction", fraction)
    count = round(fraction * n_gpus)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_gpus, size=count, replace=False)).astype(np.int64)


def expected_replica_availability(n_gpus: int, gpus_per_replica: int, n_failed: int) -> float:
    """Probability that a given replica of ``k = gpus_per_replica`` GPUs avoids all of
    ``n_failed`` failures placed uniformly at random (without repeats) among ``n_gpus`` GPUs:
    the hypergeometric ``C(n - k, F) / C(n, F) = prod_{j<k} (n - F - j) / (n - j)``. By linearity
    this is also the expected replica availability. For F << n it is close to ``(1 - p)^k`` with
    ``p = F / n``, the binomial answer for GPUs failing independently with probability p."""
    k, n, f = gpus_per_replica, n_gpus, n_failed
    if not (1 <= k <= n and 0 <= f <= n):
        raise ValueError(
            f"need 1 <= gpus_per_replica <= n_gpus and 0 <= n_failed <= n_gpus, "
            f"got k={k}, n={n}, F={f}."
        )
    j = np.arange(k, dtype=np.float64)
    return float(np.prod(np.clip((n - f - j) / (n - j), 0.0, None)))
