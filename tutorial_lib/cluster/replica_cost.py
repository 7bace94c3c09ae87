"""Step times of one replica of a data-parallel job, healthy or degraded: ``TrainingJob`` (the
job, with its step-time terms per replica) and ``PowerBoost`` (what a boosted replica may draw).

A ``TrainingJob`` is a healthy DP x PP x TP job (``ParallelConfig``: base TP degree ``tp``,
``pp`` TP groups per replica, one per pipeline stage, ``dp`` replicas) on a ``ClusterSpec``. A
*slot* is one TP group: ``tp`` consecutive GPUs of a scale-up domain. Step times come from
``cluster.cost_terms`` (Narayanan et al.'s terms, the same code); ``cluster.plans`` lists the
modelling assumptions. ``plan_options.option_table`` says what a
degraded replica runs. ``TrainingJob.paper()`` is the NTP paper's setup: ``PAPER_MODEL`` on
``PAPER_CLUSTER``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..checks import check_int
from ..flops import TRAIN_MULTIPLIER, layer_training_flops, lm_head_flops
from ..hardware import SPECS
from .cost_terms import (
    ACTIVATION_PASSES,
    ADAM_STEP_BYTES,
    Breakdown,
    activation_parts,
    dp_allreduce_time,
    exposed_dp_comm,
    exposed_tp_comm,
    pp_p2p_time,
    stage_params,
    tp_layer_time,
    training_flops,
)
from .gemm_model import GemmModel, gemm_compute_time, gemm_model_for
from .specs import ClusterSpec, ModelSpec, ParallelConfig

__all__ = [
    "SHARD_SPLITS",
    "SHORTFALLS",
    "PowerBoost",
    "TrainingJob",
    "PAPER_CLUSTER",
    "PAPER_MODEL",
]

SHORTFALLS = ("shrink", "stretch")
SHARD_SPLITS = ("whole", "even")
_F = TypeVar("_F", bound=Callable[..., Any])


def _memo(fn: _F) -> _F:
    """Cache a TrainingJob method's result per positional arguments, in the job's ``_cache``."""

    @functools.wraps(fn)
    def wrapper(self: TrainingJob, *args: Any) -> Any:
        return self.cached((fn.__name__, *args), lambda: fn(self, *args))

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
class TrainingJob:
    """A healthy DP x PP x TP job on a cluster; ``par.tp`` is the base TP degree.

    reduced_tps: degrees a degraded replica may run at (None: any below the base degree).
    one_reduced_tp: every degraded replica at one degree (``ntp.plan_ntp``'s rule).
    shard_split: how a TP-t' replica splits a layer's work over its t' ranks.

    - ``"whole"`` (default): attention heads and FFN columns are whole units, so the busiest
      rank owns ceil(heads / t') heads and ceil(ffn / t') columns and sets the pace (GEMMs scaled
      by ``_shard_imbalance``, attention activations by ceil(heads / t') t' / heads). On the
      paper's job, 128 heads over 30 ranks leave 5 on the busiest against a mean of 4.27: a TP-30
      micro-batch is 1.121 times a TP-32 one, so a TP-30 replica keeps 6 of its 8 sequences, and
      the Figure 7 simulation (seed-0 15-day trace) needs 24 spare domains for ``ntp``.
    - ``"even"``: every rank gets 1/t' of the work (a fractional share of heads and columns). This
      is the NTP paper's idealisation (its abstract: a degraded replica contributes "throughput
      equal to the percentage of still-functional GPUs"). A TP-30 micro-batch is then 1.041
      times a TP-32 one, a TP-30 replica keeps 7 of 8 sequences, and ``ntp`` needs the paper's
      16 spare domains (two 8-domain replicas instead of three).
    """

    model: ModelSpec
    cluster: ClusterSpec
    par: ParallelConfig
    reduced_tps: tuple[int, ...] | None = None
    one_reduced_tp: bool = False
    power: PowerBoost = field(default_factory=PowerBoost)
    # GEMM time from the shape (default: cluster.gemm_model.gemm_model_for(cluster.gpu)), or,
    # with compute_efficiency, the older flat model: FLOPs at that fraction of peak.
    gemm: GemmModel | None = None
    compute_efficiency: float | None = None
    shard_split: str = "whole"
    # Step times and option tables, computed on first use (the job is immutable, so they hold).
    _cache: dict[tuple[Any, ...], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def cached(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` for this job (step times, ``option_table``)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

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
        if self.compute_efficiency is not None:
            if self.gemm is not None:
                raise ValueError("Give compute_efficiency or gemm, not both.")
            if not 0 < self.compute_efficiency <= 1:
                raise ValueError(
                    f"compute_efficiency must be in (0, 1], got {self.compute_efficiency}."
                )
        if self.shard_split not in SHARD_SPLITS:
            raise ValueError(
                f"shard_split must be 'whole' (heads and FFN columns are whole units) or 'even' "
                f"(work splits evenly over the ranks), got {self.shard_split!r}."
            )
        if self.reduced_tps is not None:
            degrees = [check_int(d, "each of reduced_tps", 1) for d in self.reduced_tps]
            if not degrees or max(degrees) >= t:
                raise ValueError(
                    f"reduced_tps must be integers in [1, {t}), got {self.reduced_tps}."
                )

    @classmethod
    def paper(cls, **kwargs: object) -> TrainingJob:
        """The NTP paper's main setup (sec. 6.2): 32,768 B200s in NVL32 domains, the 480B GPT,
        16K sequences, 16M tokens (1024 sequences) per batch, TP 32 with 8 domains per replica
        (here PP 8, micro-batch 1), degraded replicas at TP 30 or 28. Assumed (the paper does not
        say): BF16, sequence parallelism, selective recomputation, overlapped DP all-reduce,
        distributed optimizer, vocabulary 51,200."""
        par = paper_parallel(tp=32, pp=8, dp=128, local_batch=8)
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

    # ---- step times (cost_terms' terms, per replica) ----
    @_memo
    def per_microbatch(self, tp: int, speed: float = 1.0) -> dict[str, float]:
        """Seconds per micro-batch of the busiest stage of a TP-``tp`` replica boosted ``speed``
        times: ``compute``, ``memory_bound`` and ``tp_comm`` (divided by the speed-up) and
        ``pp_p2p`` (over the scale-out network: not). With ``shard_split="whole"`` the busiest
        rank owns whole heads and FFN columns; with ``"even"`` every rank does 1/tp.
        ``compute`` times each of that rank's GEMMs from its shape (``gemm``), or with
        ``compute_efficiency`` divides its FLOPs by that fraction of peak. ``tp_comm`` is what
        ``overlap_tp_comm`` leaves exposed."""
        m, par = self.model, dataclasses.replace(self.par, tp=tp)
        layers = math.ceil(m.layers / par.pp)  # the busiest stage
        whole = self.shard_split == "whole"
        if self.compute_efficiency is not None:  # the flat model, scaled by the busiest rank
            peak = self.cluster.gpu.peak(par.dtype) * self.compute_efficiency  # type: ignore[operator]
            flops = training_flops(m, par.micro_batch, par.recompute) * layers * par.pp / m.layers
            imbalance = _shard_imbalance(m, tp, par.recompute) if whole else 1.0
            compute = flops * imbalance / (tp * par.pp * peak)
        else:  # every GEMM of the busiest rank timed from its shape
            compute = gemm_compute_time(
                self.gemm or gemm_model_for(self.cluster.gpu),
                m.hidden,
                m.heads,
                m.seq,
                m.ffn_width,
                m.vocab,
                layers,
                par.micro_batch,
                tp,
                par.recompute,
                par.dtype,
                logit_share=layers / m.layers,
                split=self.shard_split,
            )
        other, attention = activation_parts(m, par.micro_batch, tp, par.sequence_parallel)
        if whole:
            attention *= math.ceil(m.heads / tp) * tp / m.heads
        redo = {"none": 0.0, "selective": attention, "full": other + attention}[par.recompute]
        traffic = ACTIVATION_PASSES * (other + attention) + redo
        return {
            "compute": compute / speed,
            "memory_bound": layers * traffic / self.cluster.gpu.hbm_bandwidth / speed,
            "tp_comm": exposed_tp_comm(layers * tp_layer_time(m, self.cluster, par), compute, par)
            / speed,
            "pp_p2p": pp_p2p_time(m, self.cluster, par),
        }

    @_memo
    def fixed_time(self, tp: int, core: int) -> float:
        """Seconds of a TP-``tp`` replica's optimizer step plus its gradient reshard to ``core``
        ranks (there and back); neither depends on the batch."""
        par = dataclasses.replace(self.par, tp=tp)
        shard = stage_params(self.model, par) / (par.dp if par.distributed_optimizer else 1)
        optimizer = shard * ADAM_STEP_BYTES / self.cluster.gpu.hbm_bandwidth
        moved = (tp - core) / core * stage_params(self.model, par) * par.grad_bytes
        bw = self.cluster.collective_efficiency * self.cluster.nvlink_bandwidth
        return optimizer + 2 * moved / bw

    @_memo
    def dp_comm(self, core: int, replicas: int) -> float:
        """Exposed DP all-reduce of a job of ``replicas`` replicas pairing at ``core`` ranks: the
        healthy job's (``cost_terms.dp_allreduce_time``) times base/core, less what a healthy
        replica's micro-batch hides when overlapped (``cost_terms.exposed_dp_comm``). The same
        for every replica."""
        if replicas < 2:
            return 0.0
        par = dataclasses.replace(self.par, dp=replicas, global_batch=self.local_batch * replicas)
        time = dp_allreduce_time(self.model, self.cluster, par) * self.par.tp / core
        x = self.per_microbatch(self.par.tp)
        return exposed_dp_comm(time, x["compute"] + x["memory_bound"], self.par)

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
        ``cost_terms.iteration_time`` (tested), plus a ``reshard`` term."""
        core = self.par.tp if core is None else core
        replicas = self.par.dp if replicas is None else replicas
        if not 1 <= core <= tp <= self.par.tp or batch < 1 or batch % self.par.micro_batch:
            raise ValueError(
                f"Need 1 <= core <= tp <= {self.par.tp} and a batch that is a "
                f"positive multiple of {self.par.micro_batch}; got {core}, {tp}, "
                f"{batch}."
            )
        m = batch // self.par.micro_batch
        x = self.per_microbatch(tp, speed)
        parts = {k: m * v for k, v in x.items()}
        parts["pp_bubble"] = sum(x.values()) * (self.par.pp - 1)
        parts["dp_comm"] = self.dp_comm(core, replicas)
        parts["optimizer"] = self.fixed_time(tp, tp)
        parts["reshard"] = self.fixed_time(tp, core) - parts["optimizer"]
        return Breakdown(parts, "s")

    @_memo
    def pace(self, core: int) -> float:
        """A healthy replica's step time without the (common) DP term, in a job pairing at
        ``core`` ranks: the pace every degraded replica must keep."""
        x = sum(self.per_microbatch(self.par.tp).values())
        steps = self.local_batch // self.par.micro_batch + self.par.pp - 1
        return x * steps + self.fixed_time(self.par.tp, core)


def paper_parallel(tp: int, pp: int, dp: int, local_batch: int) -> ParallelConfig:
    """A split with the NTP paper's assumptions (``TrainingJob.paper``): micro-batch 1,
    ``local_batch`` sequences per replica, sequence parallelism, selective recomputation, an
    overlapped DP all-reduce and a distributed optimizer."""
    return ParallelConfig(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=1,
        global_batch=local_batch * dp,
        sequence_parallel=True,
        recompute="selective",
        overlap_dp_comm=True,
        distributed_optimizer=True,
    )


def _shard_imbalance(model: ModelSpec, tp: int, recompute: str) -> float:
    """GEMM FLOPs of the busiest rank over the mean when heads and FFN columns are whole units:
    the attention side of ``flops.layer_training_flops`` (QKV, projection, Q K^T, attention x V;
    8h^2 + 4sh per token and layer forward) scales with ceil(heads/t) t/heads, the MLP (4hf)
    with ceil(ffn/t) t/ffn; the vocabulary-parallel logits (6hV per token) split evenly. 1.0
    when t divides both."""
    f, a = model.ffn, model.heads
    attn, mlp = layer_training_flops(model.hidden, model.seq, f, recompute)
    fa, ff = math.ceil(a / tp) * tp / a, math.ceil(f / tp) * tp / f  # type: ignore[operator]
    logits = TRAIN_MULTIPLIER * lm_head_flops(model.hidden, model.vocab)
    return (model.layers * (attn * fa + mlp * ff) + logits) / (model.layers * (attn + mlp) + logits)


# ---- the NTP paper's setup (``TrainingJob.paper()``) ---------------------------------------
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
