"""Cluster-scale planning after GPU failures: which replicas run, at which TP degree, with which
local batch and power, and what that costs in throughput, as in the simulation of the NTP paper
(Arfeen et al., "Nonuniform-Tensor-Parallelism", arXiv 2504.06095, sections 4.3-4.4 and 6).

A ``Job`` is a healthy data-parallel job (``ParallelConfig``: base TP degree ``tp``, ``pp``
TP groups per replica, one per pipeline stage, ``dp`` replicas) on a ``ClusterSpec``. A *slot* is
one TP group: ``tp`` consecutive GPUs of a scale-up domain. ``plan(job, failed, policy)`` returns
a ``Plan``: per replica its slots, TP degree, local batch, power, speed and throughput.

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
  paper overlaps it). ``Job(one_reduced_tp=True)`` is ``ntp.plan_ntp``'s rule, one degree for all.
- **Step times** come from ``cost_model`` (Narayanan et al.'s terms, the same code): a degraded
  replica's busiest rank owns ``ceil(heads / t')`` heads and ``ceil(ffn / t')`` FFN columns, its
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
  ``"stretch"`` holds the global batch). ``Plan.chosen`` says which plan won.
- Not modelled: memory of a degraded replica (t / t' more weights per GPU), the rack's total
  power, failures taking out more than one GPU, restart time.

``python -m tutorial_lib ntp-reproduce --json`` prints ``ntp_reproduce()``'s dict, with keys:

``availability``
    ``{"gpus", "domain_size", "failed_fraction": [f], "simulated": {tp: [a]}, "expected":
    {tp: [a]}}``: share of DP replicas (one TP group of ``tp`` GPUs each, fixed layout) with no
    failed GPU, for TP 8, 16, 32, 64 (string keys), mean over ``samples`` uniform random
    patterns, and the hypergeometric expectation. Paper Figure 3: TP64 at 0.1% gives 94%.
``throughput_loss``
    ``{"failed_fraction": [f], "mean": {policy: [loss]}, "max": {policy: [loss]}}``: 1 - relative
    throughput on ``Job.paper()`` over ``samples`` random patterns per fraction. Paper Figure 6:
    DP-DROP loses up to 12%, NTP under 3%, NTP-PW under 1% up to 0.4% failed.
``spare_domains``
    ``{policy: n}``: spare scale-up domains (NVL32) needed so that ``Job.paper()`` holds its full
    global batch at every moment of every 15-day trace (``FailureModel.llama3()``, spares fail too;
    None: more than ``max_spares``). ``spare_domains_per_trace``: ``{policy: [n]}``;
    ``paused_fraction``: ``{policy: mean share of time the batch falls short with no spares}``.
    Paper Figure 7: DP-DROP 90, NTP 16, NTP-PW 0.
``time_above_0.1pct``
    mean over the traces of the share of time with more than 0.1% of the 32,768 GPUs down (paper
    Figure 4: 81%); ``time_above_0.1pct_per_trace`` lists them.
``setup`` (what was run: seed, samples, traces, quick, the job) and ``paper`` (its numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from ..hardware import SPECS
from .cost_model import (
    ACTIVATION_PASSES,
    ADAM_STEP_BYTES,
    DEFAULT_COMPUTE_EFFICIENCY,
    Breakdown,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    _activation_parts,
    _pp_p2p_time,
    _stage_params,
    _tp_layer_time,
    dp_allreduce_time,
    training_flops,
)
from .failures import (
    FailureModel,
    FailureTrace,
    expected_replica_availability,
    fraction_of_time_above,
    replica_availability,
    simulate_trace,
)

__all__ = [
    "POLICIES",
    "PowerBoost",
    "Job",
    "ReplicaAssignment",
    "Plan",
    "slot_failures",
    "plan",
    "relative_throughput",
    "throughput_samples",
    "availability_samples",
    "SpareResult",
    "spare_domains",
    "PAPER_CLUSTER",
    "PAPER_MODEL",
    "PAPER_REPORTED",
    "ntp_reproduce",
    "format_report",
]

POLICIES = ("dp-drop", "ntp", "ntp-pw")
SHORTFALLS = ("shrink", "stretch")
_TOL = 1e-9  # relative slack when comparing step times that are equal on paper
_F = TypeVar("_F", bound=Callable[..., Any])


def _memo(fn: _F) -> _F:
    """Cache a Job method's result per positional arguments (in the instance's __dict__)."""

    @functools.wraps(fn)
    def wrapper(self: Job, *args: Any) -> Any:
        cache = self.__dict__.setdefault("_memo", {})
        key = (fn.__name__, *args)
        if key not in cache:
            cache[key] = fn(self, *args)
        return cache[key]

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class PowerBoost:
    """What a degraded replica's survivors may draw, and what it buys.

    cap: extra power per GPU over TDP (0.3: up to 130% of TDP, the NTP paper's rack).
    exponent: speed = (power / TDP) ** exponent (0.7: the paper's Table 1, see the module).
    shortfall: when the cap is not enough, ``"shrink"`` that replica's batch or ``"stretch"`` the
        job's step time.
    """

    cap: float = 0.3
    exponent: float = 0.7
    shortfall: str = "shrink"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cap) and self.cap >= 0):
            raise ValueError(f"PowerBoost.cap must be >= 0 and finite, got {self.cap!r}.")
        if not (math.isfinite(self.exponent) and self.exponent > 0):
            raise ValueError(f"PowerBoost.exponent must be > 0, got {self.exponent!r}.")
        if self.shortfall not in SHORTFALLS:
            raise ValueError(f"PowerBoost.shortfall must be one of {SHORTFALLS}.")

    @property
    def max_speed(self) -> float:
        return (1 + self.cap) ** self.exponent

    def power_for(self, speed: float) -> float:
        """Power / TDP that runs ``speed`` times faster (1.0 when no boost is needed)."""
        return max(1.0, speed) ** (1 / self.exponent)


@dataclass(frozen=True, kw_only=True, eq=False)
class Job:
    """A healthy DP x PP x TP job on a cluster; ``par.tp`` is the base TP degree.

    reduced_tps: degrees a degraded replica may run at (None: any below the base degree).
    one_reduced_tp: every degraded replica at one degree (``ntp.plan_ntp``'s rule).
    """

    model: ModelSpec
    cluster: ClusterSpec
    par: ParallelConfig
    reduced_tps: tuple[int, ...] | None = None
    one_reduced_tp: bool = False
    power: PowerBoost = field(default_factory=PowerBoost)
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY

    def __post_init__(self) -> None:
        c, p, t = self.cluster, self.par, self.par.tp
        if c.domain_size % t:
            raise ValueError(
                f"The base TP degree {t} does not divide the scale-up domain "
                f"({c.domain_size} GPUs): a TP group must live in one domain."
            )
        if c.n_gpus % c.domain_size:
            raise ValueError(f"n_gpus={c.n_gpus} is not a multiple of domain_size={c.domain_size}.")
        if t * p.pp * p.dp != c.n_gpus:
            raise ValueError(f"tp x pp x dp = {t * p.pp * p.dp} != n_gpus={c.n_gpus}.")
        if p.pp > self.model.layers or p.virtual_stages != 1:
            raise ValueError(
                "Need pp <= layers and virtual_stages == 1 (the interleaved schedule "
                "needs micro-batches divisible by pp, which a shrunk batch breaks)."
            )
        if c.gpu.peak(p.dtype) is None:
            raise ValueError(f"{c.gpu.name} has no {p.dtype} peak.")
        if not 0 < self.compute_efficiency <= 1:
            raise ValueError(
                f"compute_efficiency must be in (0, 1], got {self.compute_efficiency}."
            )
        if self.reduced_tps is not None:
            bad = [d for d in self.reduced_tps if not (isinstance(d, int) and 1 <= d < t)]
            if bad or not self.reduced_tps:
                raise ValueError(
                    f"reduced_tps must be integers in [1, {t}), got {self.reduced_tps}."
                )

    @classmethod
    def paper(cls, **kwargs: object) -> Job:
        """The NTP paper's main setup (sec. 6.2): 32,768 B200s in NVL32 domains, the 480B GPT,
        16K sequences, 16M tokens (1024 sequences) per batch, TP 32 with 8 domains per replica
        (here PP 8, micro-batch 1), degraded replicas at TP 30 or 28. Assumed (the paper does not
        say): BF16, sequence parallelism, selective recomputation, overlapped DP all-reduce,
        distributed optimizer, vocabulary 51,200."""
        par = ParallelConfig(
            tp=32,
            pp=8,
            dp=128,
            micro_batch=1,
            global_batch=1024,
            sequence_parallel=True,
            recompute="selective",
            overlap_dp_comm=True,
            distributed_optimizer=True,
        )
        args = {"model": PAPER_MODEL, "cluster": PAPER_CLUSTER, "par": par, "reduced_tps": (30, 28)}
        return cls(**{**args, **kwargs})  # type: ignore[arg-type]

    # ---- geometry ----
    @property
    def base_tp(self) -> int:
        return self.par.tp

    @property
    def n_slots(self) -> int:
        return self.cluster.n_gpus // self.par.tp

    @property
    def slots_per_domain(self) -> int:
        return self.cluster.domain_size // self.par.tp

    @property
    def local_batch(self) -> int:
        return self.par.global_batch // self.par.dp

    @property
    def degrees(self) -> tuple[int, ...]:
        """Allowed reduced degrees, ascending."""
        return tuple(sorted(set(self.reduced_tps or range(1, self.par.tp))))

    @property
    def max_failures(self) -> int:
        """Most failed GPUs a TP group survives (down to the lowest allowed degree)."""
        return self.par.tp - self.degrees[0]

    # ---- step times (cost_model's terms, per replica) ----
    @_memo
    def _per_microbatch(self, tp: int, speed: float = 1.0) -> dict[str, float]:
        m, par = self.model, dataclasses.replace(self.par, tp=tp)
        layers = math.ceil(m.layers / par.pp)  # the busiest stage
        peak = self.cluster.gpu.peak(par.dtype) * self.compute_efficiency  # type: ignore[operator]
        flops = training_flops(m, par.micro_batch, par.recompute) * layers * par.pp / m.layers
        compute = flops * _shard_imbalance(m, tp, par.recompute) / (tp * par.pp * peak)
        other, attention = _activation_parts(m, par.micro_batch, tp, par.sequence_parallel)
        attention *= math.ceil(m.heads / tp) * tp / m.heads
        redo = {"none": 0.0, "selective": attention, "full": other + attention}[par.recompute]
        traffic = ACTIVATION_PASSES * (other + attention) + redo
        return {
            "compute": compute / speed,
            "memory_bound": layers * traffic / self.cluster.gpu.hbm_bandwidth / speed,
            "tp_comm": layers * _tp_layer_time(m, self.cluster, par) / speed,
            "pp_p2p": _pp_p2p_time(m, self.cluster, par),
        }

    @_memo
    def _fixed(self, tp: int, core: int) -> float:
        """Optimizer step plus the gradient reshard to ``core`` ranks (there and back)."""
        par = dataclasses.replace(self.par, tp=tp)
        shard = _stage_params(self.model, par) / (par.dp if par.distributed_optimizer else 1)
        optimizer = shard * ADAM_STEP_BYTES / self.cluster.gpu.hbm_bandwidth
        moved = (tp - core) / core * _stage_params(self.model, par) * par.grad_bytes
        bw = self.cluster.collective_efficiency * self.cluster.nvlink_bandwidth
        return optimizer + 2 * moved / bw

    @_memo
    def dp_comm(self, core: int, replicas: int) -> float:
        """Exposed DP all-reduce of a job of ``replicas`` replicas pairing at ``core`` ranks: the
        healthy job's (``cost_model.dp_allreduce_time``) times base/core, minus the healthy
        replica's last backward when overlapped. The same for every replica."""
        if replicas < 2:
            return 0.0
        par = dataclasses.replace(self.par, dp=replicas, global_batch=self.local_batch * replicas)
        time = dp_allreduce_time(self.model, self.cluster, par) * self.par.tp / core
        if self.par.overlap_dp_comm:
            x = self._per_microbatch(self.par.tp)
            share = 2 / (4 if self.par.recompute == "full" else 3)
            time = max(0.0, time - (x["compute"] + x["memory_bound"]) * share)
        return time

    def replica_time(
        self,
        tp: int,
        batch: int,
        speed: float = 1.0,
        core: int | None = None,
        replicas: int | None = None,
    ) -> Breakdown:
        """Seconds per step of one replica at TP ``tp`` with local ``batch`` sequences, boosted
        ``speed`` times, in a job pairing at ``core`` ranks with ``replicas`` replicas
        (defaults: the healthy job). At the healthy configuration this is
        ``cost_model.iteration_time`` (tested), plus a ``reshard`` term."""
        core = self.par.tp if core is None else core
        replicas = self.par.dp if replicas is None else replicas
        if not 1 <= core <= tp <= self.par.tp or batch < 1 or batch % self.par.micro_batch:
            raise ValueError(
                f"Need 1 <= core <= tp <= {self.par.tp} and a batch that is a "
                f"positive multiple of {self.par.micro_batch}; got {core}, {tp}, "
                f"{batch}."
            )
        m = batch // self.par.micro_batch
        x = self._per_microbatch(tp, speed)
        parts = {k: m * v for k, v in x.items()}
        parts["pp_bubble"] = sum(x.values()) * (self.par.pp - 1)
        parts["dp_comm"] = self.dp_comm(core, replicas)
        parts["optimizer"] = self._fixed(tp, tp)
        parts["reshard"] = self._fixed(tp, core) - parts["optimizer"]
        return Breakdown(parts, "s")

    @_memo
    def _pace(self, core: int) -> float:
        """A healthy replica's step time without the (common) DP term."""
        x = sum(self._per_microbatch(self.par.tp).values())
        return x * (self.local_batch // self.par.micro_batch + self.par.pp - 1) + self._fixed(
            self.par.tp, core
        )

    def _fit(self, tp: int, core: int, speed: float) -> int:
        """Largest local batch (micro-batch multiple, at most the healthy one) that keeps pace."""
        mb, p = self.par.micro_batch, self.par.pp
        x = sum(self._per_microbatch(tp, speed).values())
        room = (self._pace(core) - self._fixed(tp, core)) * (1 + _TOL) / x - (p - 1)
        return int(min(max(math.floor(room), 0), self.local_batch // mb)) * mb

    def _speed_needed(self, tp: int, core: int, batch: int) -> float:
        """Speed-up at which a TP-``tp`` replica with ``batch`` keeps pace (inf: none does)."""
        x = self._per_microbatch(tp)
        steps = batch // self.par.micro_batch + self.par.pp - 1
        room = (self._pace(core) - self._fixed(tp, core)) / steps - x["pp_p2p"]
        boosted = sum(x.values()) - x["pp_p2p"]
        return math.inf if room <= 0 else max(1.0, boosted / room * (1 + _TOL))

    # ---- what a degraded replica gets, by failures in its worst group ----
    def _option(self, tp: int, core: int, pw: bool) -> tuple[int, float, float]:
        """(batch, speed, own step time without DP) of a TP-``tp`` replica, boosted if ``pw``."""
        b, power = self.local_batch, self.power
        batch, speed = self._fit(tp, core, 1.0), 1.0
        if pw:
            need = self._speed_needed(tp, core, b)
            if need <= power.max_speed:
                batch, speed = b, need
            elif power.shortfall == "stretch":
                batch, speed = b, power.max_speed
            else:
                batch = self._fit(tp, core, power.max_speed)
                speed = self._speed_needed(tp, core, batch) if batch else 1.0
        if not batch:
            return 0, 1.0, 0.0
        time = self.replica_time(tp, batch, speed, core)
        return batch, speed, time.total - time["dp_comm"]

    def table(self, core: int, policy: str) -> dict[str, np.ndarray]:
        """Per failure count f = 0..t of a replica's worst group, under a job pairing at ``core``:
        ``tp`` (0: cannot run), ``batch``, ``speed``, ``time`` (own step time without DP)."""
        return self._tables[(core, policy)]

    @cached_property
    def _tables(self) -> _Tables:
        return _Tables(self)


class _Tables(dict):
    """Lazily built ``Job.table`` entries, keyed by (core, policy)."""

    def __init__(self, job: Job) -> None:
        super().__init__()
        self.job = job

    def __missing__(self, key: tuple[int, str]) -> dict[str, np.ndarray]:
        job, (core, policy) = self.job, key
        t = job.base_tp
        out = {
            "tp": np.zeros(t + 1, np.int64),
            "batch": np.zeros(t + 1, np.int64),
            "speed": np.ones(t + 1),
            "time": np.zeros(t + 1),
        }
        out["tp"][0], out["batch"][0], out["time"][0] = t, job.local_batch, job._pace(core)
        choices = [core] if job.one_reduced_tp else [d for d in job.degrees if d >= core]
        options = {d: job._option(d, core, policy == "ntp-pw") for d in choices}
        stretch = policy == "ntp-pw" and job.power.shortfall == "stretch"
        for f in range(1, t + 1):
            fits = [
                (o[0], -o[2] if stretch else -job.power.power_for(o[1]), d)
                for d, o in options.items()
                if d <= t - f and o[0] > 0
            ]
            if fits:
                d = max(fits)[2]
                out["tp"][f], out["batch"][f] = d, options[d][0]
                out["speed"][f], out["time"][f] = options[d][1], options[d][2]
        self[key] = out
        return out


def _shard_imbalance(model: ModelSpec, tp: int, recompute: str) -> float:
    """GEMM FLOPs of the busiest rank over the mean when heads and FFN columns are whole units:
    the attention side (QKV, projection, Q K^T, attention x V; 8h^2 + 4sh per token and layer
    forward) scales with ceil(heads/t) t/heads, the MLP (4hf) with ceil(ffn/t) t/ffn; the
    vocabulary-parallel logits (6hV per token) split evenly. 1.0 when t divides both."""
    h, s, f, a = model.hidden, model.seq, model.ffn, model.heads
    passes = 4 if recompute == "full" else 3
    attn = passes * (8 * h * h + 4 * s * h) + (12 * s * h if recompute == "selective" else 0)
    mlp = passes * 4 * h * f  # type: ignore[operator]
    fa, ff = math.ceil(a / tp) * tp / a, math.ceil(f / tp) * tp / f  # type: ignore[operator]
    logits = 6 * h * model.vocab
    return (model.layers * (attn * fa + mlp * ff) + logits) / (model.layers * (attn + mlp) + logits)


# ---- packing and evaluation ---------------------------------------------------------------------
def slot_failures(job: Job, failed: np.ndarray) -> np.ndarray:
    """(n_slots,) int64 failed GPUs per TP group; ``failed``: GPU indices or an (n_gpus,) bool mask."""
    n = job.cluster.n_gpus
    failed = np.asarray(failed)
    if failed.dtype == bool:
        if failed.shape != (n,):
            raise ValueError(f"a failure mask must have shape ({n},), got {failed.shape}.")
        failed = np.flatnonzero(failed)
    if failed.size > n:
        raise ValueError(f"{failed.size} failed GPUs, but the cluster has only {n}.")
    if failed.size and not np.issubdtype(failed.dtype, np.integer):
        raise TypeError(f"failed GPU indices must be integers, got dtype {failed.dtype}.")
    failed = failed.astype(np.int64).ravel()
    if failed.size and (failed.min() < 0 or failed.max() >= n):
        raise ValueError(f"failed GPU indices must lie in [0, {n}).")
    if len(np.unique(failed)) != len(failed):
        raise ValueError("failed GPU indices contain duplicates; a GPU fails only once.")
    return np.bincount(failed // job.base_tp, minlength=job.n_slots).astype(np.int64)


def _failed_indices(failed: np.ndarray) -> np.ndarray:
    failed = np.asarray(failed)
    return np.flatnonzero(failed) if failed.dtype == bool else failed.astype(np.int64).ravel()


def _packed(job: Job, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack (S, n) slot failure counts: (order, leaders). ``order`` (S, n): slots worst first
    (dead slots last, ties by index); ``leaders`` (S, G): failures in each complete replica's
    worst group, -1 where there is none (too few usable groups left)."""
    key = np.where(counts > job.max_failures, -1, counts)
    idx = np.broadcast_to(np.arange(counts.shape[1]), counts.shape)
    order = np.lexsort((idx, -key), axis=-1)
    key = np.take_along_axis(key, order, axis=-1)
    pp = job.par.pp
    n = counts.shape[1] // pp * pp
    return order, np.where(key[:, pp - 1 : n : pp] >= 0, key[:, 0:n:pp], -1)


def _candidates(job: Job, policy: str) -> list[tuple[str, int]]:
    """(policy, core degree) plans a policy chooses among: its own at every core degree and, with
    ``"shrink"``, every weaker policy's; ``"stretch"`` keeps to its own (it holds the batch)."""
    if policy == "ntp-pw" and job.power.shortfall == "stretch":
        return [("ntp-pw", c) for c in (*job.degrees, job.base_tp)]
    out = [("dp-drop", job.base_tp)]
    for p in POLICIES[1 : POLICIES.index(policy) + 1]:
        out += [(p, c) for c in job.degrees]
    return out


def _evaluate(job: Job, leaders: np.ndarray, healthy: np.ndarray, cand: tuple[str, int]):
    """Relative throughput (S,), kept batches (S, G) and job step time (S,) of one candidate."""
    b, t, pp = job.local_batch, job.base_tp, job.par.pp
    policy, core = cand
    if policy == "dp-drop":
        n_rep = healthy // pp
        batches = (np.arange(leaders.shape[1]) < n_rep[:, None]) * b
        time = np.full(len(n_rep), job._pace(t))
    else:
        tab = job.table(core, policy)
        lead = np.clip(leaders, 0, t)
        batches = np.where(leaders >= 0, tab["batch"][lead], 0)
        own = np.where(batches > 0, tab["time"][lead], 0.0)
        time = np.maximum(job._pace(core), own.max(axis=1, initial=0.0))
    n_rep = (batches > 0).sum(axis=1)
    time = time + np.array([job.dp_comm(core, int(r)) for r in n_rep])
    healthy_rate = job.local_batch * job.par.dp / (job._pace(t) + job.dp_comm(t, job.par.dp))
    return batches.sum(axis=1) / time / healthy_rate, batches, time


def _best(job: Job, counts: np.ndarray, policy: str):
    """Evaluate every candidate plan on (S, n) slot counts; pick the highest throughput (with
    ``"stretch"``: the largest global batch first). Returns (throughput, choice, results, order,
    leaders)."""
    if policy not in POLICIES:
        raise ValueError(f"Unknown policy {policy!r}; use one of {POLICIES}.")
    counts = np.atleast_2d(counts)
    order, leaders = _packed(job, counts)
    healthy = (counts == 0).sum(axis=1)
    results = [(c, *_evaluate(job, leaders, healthy, c)) for c in _candidates(job, policy)]
    thr = np.stack([r[1] for r in results])
    key = thr
    if policy == "ntp-pw" and job.power.shortfall == "stretch":
        key = np.stack([r[2].sum(axis=1) for r in results]) + thr / 2  # batch first
    arg = key.argmax(axis=0)
    return thr[arg, np.arange(thr.shape[1])], arg, results, order, leaders


def relative_throughput(job: Job, failed: np.ndarray, policy: str) -> float:
    """Throughput of ``plan(job, failed, policy)`` relative to the job with no failures."""
    return float(_best(job, slot_failures(job, failed), policy)[0][0])


# ---- plans --------------------------------------------------------------------------------------
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
class Plan:
    """What a policy runs after failures. ``chosen``: the candidate plan that won, (policy, core
    degree); ``idle_slots``: usable TP groups left out; ``dead_slots``: groups too damaged to run."""

    policy: str
    chosen: tuple[str, int]
    replicas: tuple[ReplicaAssignment, ...]
    idle_slots: tuple[int, ...]
    dead_slots: tuple[int, ...]
    step_time: float
    healthy_step_time: float
    global_batch: int
    healthy_global_batch: int
    throughput: float

    @property
    def core_tp(self) -> int:
        return self.chosen[1]

    def describe(self) -> str:
        lines = [
            f"{self.policy} (plan {self.chosen[0]}, core TP {self.core_tp}): "
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


def plan(job: Job, failed: np.ndarray, policy: str) -> Plan:
    """Plan the job after ``failed`` (GPU indices or a bool mask) under ``policy``.

    Replicas with failed GPUs come first (the lowest ranks), worst first; each GPU is in at most
    one replica and never a failed one."""
    counts = slot_failures(job, failed)
    down = np.zeros(job.n_slots * job.base_tp, bool)
    down[_failed_indices(failed)] = True
    thr, arg, results, order, leaders = _best(job, counts, policy)
    cand, _, batches, time = results[int(arg[0])]
    t, pp = job.base_tp, job.par.pp
    if cand[0] == "dp-drop":
        groups = np.flatnonzero(counts == 0)[: int((batches[0] > 0).sum()) * pp].reshape(-1, pp)
        tab, lead = job.table(t, "ntp"), np.zeros(len(groups), np.int64)
    else:
        keep = np.flatnonzero(batches[0] > 0)
        groups = order[0][: leaders.shape[1] * pp].reshape(-1, pp)[keep]
        tab, lead = job.table(cand[1], cand[0]), leaders[0][keep]
    healthy_time = job._pace(t) + job.dp_comm(t, job.par.dp)
    dp = job.dp_comm(cand[1], len(groups))
    replicas = []
    for i, (slots, f) in enumerate(zip(groups, lead, strict=True)):
        d, b, speed = int(tab["tp"][f]), int(tab["batch"][f]), float(tab["speed"][f])
        gpus = []
        for s in slots:
            alive = s * t + np.flatnonzero(~down[s * t : (s + 1) * t])
            runs_reduced = cand[0] == "ntp" or counts[s] > 0
            gpus.append(alive[:d] if runs_reduced else alive)
        boosted = cand[0] == "ntp-pw" and f > 0
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
                throughput=b / float(time[0]) * healthy_time / job.local_batch,
                failed=int(counts[slots].sum()),
            )
        )
    used = set(groups.ravel().tolist())
    dead = tuple(int(s) for s in np.flatnonzero(counts > job.max_failures))
    idle = tuple(s for s in range(job.n_slots) if s not in used and s not in dead)
    return Plan(
        policy,
        cand,
        tuple(replicas),
        idle,
        dead,
        float(time[0]),
        healthy_time,
        int(batches.sum()),
        job.par.global_batch,
        float(thr[0]),
    )


# ---- Monte Carlo over random failures -----------------------------------------------------------
def _check_fractions(fractions: Sequence[float], samples: int) -> np.ndarray:
    f = np.asarray(fractions, dtype=np.float64).ravel()
    if f.size == 0 or not np.all((f >= 0) & (f <= 1)):
        raise ValueError(f"failed fractions must lie in [0, 1], got {list(f)}.")
    if isinstance(samples, bool) or int(samples) != samples or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}.")
    return f


def _nested_failures(n_gpus: int, fractions: np.ndarray, samples: int, seed: int):
    """Per sample, one random order of the GPUs; fraction f fails its first round(f n). Nested,
    so each sample's curve is the same cluster failing further."""
    rng = np.random.default_rng(seed)
    k = [round(f * n_gpus) for f in fractions]
    orders = [rng.choice(n_gpus, max(k), replace=False) for _ in range(samples)]
    return k, orders


def throughput_samples(
    job: Job,
    fractions: Sequence[float],
    samples: int,
    seed: int = 0,
    policies: Sequence[str] = POLICIES,
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
            out[p][i] = _best(job, counts, p)[0]
    return out


def availability_samples(
    n_gpus: int,
    domain_size: int,
    tps: Sequence[int],
    fractions: Sequence[float],
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


def _trace_states(trace: FailureTrace, n_slots: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(durations (E,), counts (E, n_slots)): failed GPUs per TP group in each interval where the
    trace is constant (between consecutive failure starts and ends)."""
    edges = np.unique(np.clip(np.concatenate(([0.0], trace.start, trace.end)), 0.0, trace.hours))
    times = edges[edges < trace.hours]
    durations = np.diff(np.append(times, trace.hours))
    lo = np.searchsorted(times, np.maximum(trace.start, 0.0), side="left")
    hi = np.searchsorted(times, trace.end, side="left")
    diff = np.zeros((len(times) + 1, n_slots), np.int64)
    slot = trace.gpu // tp
    np.add.at(diff, (lo, slot), 1)
    np.add.at(diff, (hi, slot), -1)
    return durations, np.cumsum(diff, axis=0)[:-1]


def _capacity(job: Job, counts: np.ndarray, policy: str) -> np.ndarray:
    """Largest global batch the policy's plans reach on these (S, n) slot counts."""
    _, leaders = _packed(job, counts)
    healthy = (counts == 0).sum(axis=1)
    return np.max(
        [_evaluate(job, leaders, healthy, c)[1].sum(axis=1) for c in _candidates(job, policy)],
        axis=0,
    )


def spare_domains(
    job: Job, trace: FailureTrace, policies: Sequence[str] = POLICIES
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
    durations, counts = _trace_states(trace, trace.n_gpus // job.base_tp, job.base_tp)
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


# ---- the NTP paper's experiments (``python -m tutorial_lib ntp-reproduce``) ---------------------
PAPER_CLUSTER = ClusterSpec(
    name="B200 NVL32 (NTP paper)",
    gpu=SPECS["B200"],
    n_gpus=32768,
    domain_size=32,
    nvlink_bandwidth=900e9,
    scaleout_bandwidth=800e9 / 8,
    source="NTP paper sec. 6.2: 32K B200 GPUs, NVL32 domains at 1.8 TB/s per GPU (both "
    "directions), one 800 Gb/s InfiniBand NIC per GPU",
)
PAPER_MODEL = ModelSpec(
    layers=100, hidden=20480, heads=128, vocab=51200, seq=16384, name="480B GPT (NTP paper)"
)
# What the paper reports (arXiv 2504.06095v1): the abstract; Figure 3 (availability, 32K GPUs,
# uniform failures); Figure 4 (Llama 3 rates, 15 days); Figure 6 (largest loss over its range of
# failed fractions; NTP-PW's bound holds up to 0.4% failed); Figure 7 (spares for a fixed batch).
PAPER_REPORTED: dict[str, Any] = {
    "availability_tp64_at_0.1pct": 0.94,
    "time_above_0.1pct": 0.81,
    "throughput_loss_max": {"dp-drop": 0.12, "ntp": 0.03, "ntp-pw": 0.01},
    "spare_domains": {"dp-drop": 90, "ntp": 16, "ntp-pw": 0},
    "abstract": "with 0.1% of GPUs failed, a high-TP job can lose nearly 10% of its throughput",
}
AVAILABILITY_TPS = (8, 16, 32, 64)


def _main_gpus(trace: FailureTrace, n_gpus: int) -> FailureTrace:
    """The part of a trace on GPUs 0..n_gpus-1."""
    keep = trace.gpu < n_gpus
    return FailureTrace(
        n_gpus,
        trace.hours,
        trace.step_hours,
        trace.gpu[keep],
        trace.start[keep],
        trace.end[keep],
        trace.hardware[keep],
    )


def ntp_reproduce(
    seed: int = 0,
    samples: int = 32,
    quick: bool = False,
    job: Job | None = None,
    max_spares: int = 256,
    days: float = 15.0,
) -> dict[str, Any]:
    """The NTP paper's availability, throughput-loss, spare-domain and failure-time figures on
    ``job`` (default ``Job.paper()``); keys in the module docstring. ``samples`` random failure
    patterns per point; ``max(1, samples // 8)`` traces (1 with ``quick``, which also uses 3
    failed fractions per curve instead of 11)."""
    _check_fractions([0.0], samples)
    if isinstance(max_spares, bool) or int(max_spares) != max_spares or max_spares < 0:
        raise ValueError(f"max_spares must be a non-negative integer, got {max_spares!r}.")
    job = Job.paper() if job is None else job
    n, dom = job.cluster.n_gpus, job.cluster.domain_size
    traces = 1 if quick else max(1, samples // 8)
    avail_f = np.linspace(0, 0.01, 3 if quick else 11)
    loss_f = np.linspace(0, 0.005, 3 if quick else 11)
    avail_dom = max(AVAILABILITY_TPS)
    avail = availability_samples(n, avail_dom, AVAILABILITY_TPS, avail_f, samples, seed)
    thr = throughput_samples(job, loss_f, samples, seed)
    per_trace: dict[str, list[int | None]] = {p: [] for p in POLICIES}
    paused: dict[str, list[float]] = {p: [] for p in POLICIES}
    above = []
    for i in range(traces):
        trace = simulate_trace(FailureModel.llama3(), n + max_spares * dom, days, seed=seed + i)
        for p, r in spare_domains(job, trace).items():
            per_trace[p].append(r.needed)
            paused[p].append(r.paused_fraction)
        above.append(fraction_of_time_above(_main_gpus(trace, n), 0.001))
    return {
        "availability": {
            "gpus": n,
            "domain_size": avail_dom,
            "failed_fraction": avail_f.tolist(),
            "simulated": {str(tp): a.mean(axis=1).tolist() for tp, a in avail.items()},
            "expected": {
                str(tp): [expected_replica_availability(n, tp, round(f * n)) for f in avail_f]
                for tp in AVAILABILITY_TPS
            },
        },
        "throughput_loss": {
            "failed_fraction": loss_f.tolist(),
            "mean": {p: (1 - v.mean(axis=1)).tolist() for p, v in thr.items()},
            "max": {p: (1 - v.min(axis=1)).tolist() for p, v in thr.items()},
        },
        "spare_domains": {p: None if None in v else max(v) for p, v in per_trace.items()},  # type: ignore[type-var]
        "spare_domains_per_trace": per_trace,
        "paused_fraction": {p: float(np.mean(v)) for p, v in paused.items()},
        "time_above_0.1pct": float(np.mean(above)),
        "time_above_0.1pct_per_trace": above,
        "setup": {
            "seed": seed,
            "samples": samples,
            "traces": traces,
            "quick": quick,
            "days": days,
            "max_spares": max_spares,
            "failure_model": "FailureModel.llama3()",
            "job": {
                "model": dataclasses.asdict(job.model),
                "cluster": job.cluster.name,
                "gpus": n,
                "domain_size": dom,
                "tp": job.base_tp,
                "pp": job.par.pp,
                "dp": job.par.dp,
                "global_batch": job.par.global_batch,
                "reduced_tps": list(job.degrees),
                "power_cap": job.power.cap,
                "power_exponent": job.power.exponent,
                "shortfall": job.power.shortfall,
                "healthy_step_s": job.replica_time(job.base_tp, job.local_batch).total,
            },
        },
        "paper": PAPER_REPORTED,
    }


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def format_report(report: dict[str, Any]) -> str:
    """``ntp_reproduce()``'s result as readable tables, each next to what the paper reports."""
    a, loss, job = report["availability"], report["throughput_loss"], report["setup"]["job"]
    paper = report["paper"]
    tps = list(a["simulated"])
    avail_rows = [
        [f"{100 * f:.2f}%"]
        + [f"{a['simulated'][tp][i]:.3f} ({a['expected'][tp][i]:.3f})" for tp in tps]
        for i, f in enumerate(a["failed_fraction"])
    ]
    loss_rows = [
        [f"{100 * f:.3f}%"]
        + [f"{100 * loss['mean'][p][i]:.2f}% ({100 * loss['max'][p][i]:.2f}%)" for p in POLICIES]
        for i, f in enumerate(loss["failed_fraction"])
    ]
    spare_rows = [
        [
            p,
            str(report["spare_domains"][p]),
            str(report["spare_domains_per_trace"][p]),
            f"{100 * report['paused_fraction'][p]:.1f}%",
            str(paper["spare_domains"][p]),
        ]
        for p in POLICIES
    ]
    return "\n\n".join(
        [
            f"Replica availability on {a['gpus']:,} GPUs, uniform random failures: simulated "
            f"(expected); paper: TP64 at 0.1% -> {paper['availability_tp64_at_0.1pct']}\n"
            + _table(["failed"] + [f"TP{tp}" for tp in tps], avail_rows),
            f"Throughput loss, mean (worst), {job['gpus']:,} GPUs in domains of {job['domain_size']}, "
            f"TP {job['tp']} -> {job['reduced_tps']}, PP {job['pp']}, DP {job['dp']}; paper's worst: "
            + ", ".join(f"{p} {100 * v:.0f}%" for p, v in paper["throughput_loss_max"].items())
            + "\n"
            + _table(["failed"] + list(POLICIES), loss_rows),
            f"Spare domains to hold the global batch over {report['setup']['days']:g}-day traces\n"
            + _table(["policy", "needed", "per trace", "paused w/o spares", "paper"], spare_rows),
            f"Time with > 0.1% of GPUs down: {100 * report['time_above_0.1pct']:.1f}% "
            f"(paper: {100 * paper['time_above_0.1pct']:.0f}%)",
        ]
    )
