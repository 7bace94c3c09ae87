"""The NTP paper's experiments on the simulated cluster (``python -m tutorial_lib ntp-reproduce``):
replica availability (its Figure 3), the time with more than 0.1% of the GPUs down (Figure 4), the
throughput each policy keeps (Figure 6) and the spare domains it needs (Figure 7), next to what
the paper reports (``PAPER_REPORTED``); and, beyond the paper, each policy's goodput when every
failure restarts the job (``cluster.goodput``). ``cluster.report.format_report`` prints the
result.

``python -m tutorial_lib ntp-reproduce --json`` prints ``ntp_reproduce()``'s dict, with keys:

``availability``
    ``{"gpus", "domain_size", "failed_fraction": [f], "simulated": {tp: [a]}, "expected":
    {tp: [a]}}``: share of DP replicas (one TP group of ``tp`` GPUs each, fixed layout) with no
    failed GPU, for TP 8, 16, 32, 64 (string keys), mean over ``samples`` uniform random
    patterns, and the hypergeometric expectation. Paper Figure 3: TP64 at 0.1% gives 94%.
``throughput_loss``
    ``{"failed_fraction": [f], "mean": {policy: [loss]}, "max": {policy: [loss]}}``: 1 - relative
    throughput on ``TrainingJob.paper()`` over ``samples`` random patterns per fraction. Paper
    Figure 6: DP-DROP loses up to 12%, NTP under 3%, NTP-PW under 1% up to 0.4% failed.
``spare_domains``
    ``{policy: n}``: spare scale-up domains (NVL32) needed so that ``TrainingJob.paper()`` holds
    its full global batch at every moment of every 15-day trace (``FailureModel.llama3()``, spares
    fail too; None: more than ``max_spares``). ``spare_domains_per_trace``: ``{policy: [n]}``;
    ``paused_fraction``: ``{policy: mean share of time the batch falls short with no spares}``.
    Paper Figure 7: DP-DROP 90, NTP 16, NTP-PW 0.
``time_above_0.1pct``
    mean over the traces of the share of time with more than 0.1% of the 32,768 GPUs down (paper
    Figure 4: 81%); ``time_above_0.1pct_per_trace`` lists them.
``goodput``
    ``{policy: {"goodput", "goodput_per_trace", "interval_h", "young_interval_h",
    "daly_interval_h", "optimal_interval_h", "optimal_goodput", "breakdown", "interruptions"}}``:
    useful training over wall time on the job's GPUs of the same traces when every failure stops
    the job and it restarts from its last checkpoint (``cluster.goodput.simulate_goodput``),
    checkpointing at Daly's interval (``interval_h``, compute hours between writes) for the
    job's MTBF; the simulated best interval on a log grid; ``breakdown``: the shares of wall
    time lost to ``lost_work``, ``restart``, ``checkpoint`` and ``degraded`` throughput (means
    over the traces). The paper does not model restarts; Llama 3 reports > 90% effective
    training time on 16K GPUs, half as many failures per hour.
``setup`` (what was run: seed, samples, traces, quick, the job, the ``restart`` costs) and
``paper`` (its numbers).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..checks import check_int, check_positive_int
from .failures import (
    FailureModel,
    FailureTrace,
    expected_replica_availability,
    fraction_of_time_above,
    simulate_trace,
)
from .goodput import (
    RestartCost,
    daly_interval,
    job_mtbf_hours,
    optimal_interval,
    simulate_goodput,
    young_interval,
)
from .monte_carlo import availability_samples, spare_domains, throughput_samples
from .plan_options import PLAN_POLICIES
from .replica_cost import TrainingJob

__all__ = ["PAPER_REPORTED", "AVAILABILITY_TPS", "ntp_reproduce"]

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


def _goodput(
    job: TrainingJob, traces: list[FailureTrace], restart: RestartCost
) -> dict[str, dict[str, Any]]:
    """Per policy, goodput with restarts over ``traces`` at Daly's interval for the job's MTBF,
    and the simulated best interval (the ``goodput`` key)."""
    write_s = restart.write_s(job)
    mtbf_s = job_mtbf_hours(FailureModel.llama3(), job.cluster.n_gpus) * 3600
    young_h, daly_h = young_interval(write_s, mtbf_s) / 3600, daly_interval(write_s, mtbf_s) / 3600
    grid = daly_h * 2.0 ** np.linspace(-3, 3, 49)  # 1/8 to 8 times Daly's, Daly's included
    out = {}
    for p in PLAN_POLICIES:
        runs = [simulate_goodput(job, t, p, daly_h, restart) for t in traces]
        sweep = optimal_interval(job, traces, p, restart, grid)
        out[p] = {
            "goodput": float(np.mean([r.goodput for r in runs])),
            "goodput_per_trace": [r.goodput for r in runs],
            "interval_h": daly_h,
            "young_interval_h": young_h,
            "daly_interval_h": daly_h,
            "optimal_interval_h": sweep.best_h,
            "optimal_goodput": sweep.best_goodput,
            "breakdown": {
                k: float(np.mean([r.breakdown[k] for r in runs])) for k in runs[0].breakdown
            },
            "interruptions": float(np.mean([r.interruptions for r in runs])),
        }
    return out


def ntp_reproduce(
    seed: int = 0,
    samples: int = 32,
    quick: bool = False,
    job: TrainingJob | None = None,
    max_spares: int = 256,
    days: float = 15.0,
) -> dict[str, Any]:
    """The NTP paper's availability, throughput-loss, spare-domain and failure-time figures on
    ``job`` (default ``TrainingJob.paper()``), and goodput with restarts; keys in the module
    docstring. ``samples`` random failure patterns per point; ``max(1, samples // 8)`` traces
    (1 with ``quick``, which also uses 3 failed fractions per curve instead of 11)."""
    check_positive_int(samples, "samples")
    check_int(max_spares, "max_spares", 0)
    job = TrainingJob.paper() if job is None else job
    n, dom = job.cluster.n_gpus, job.cluster.domain_size
    traces = 1 if quick else max(1, samples // 8)
    avail_f = np.linspace(0, 0.01, 3 if quick else 11)
    loss_f = np.linspace(0, 0.005, 3 if quick else 11)
    avail_dom = max(AVAILABILITY_TPS)
    avail = availability_samples(n, avail_dom, AVAILABILITY_TPS, avail_f, samples, seed)
    thr = throughput_samples(job, loss_f, samples, seed)
    per_trace: dict[str, list[int | None]] = {p: [] for p in PLAN_POLICIES}
    paused: dict[str, list[float]] = {p: [] for p in PLAN_POLICIES}
    above, main = [], []
    for i in range(traces):
        trace = simulate_trace(FailureModel.llama3(), n + max_spares * dom, days, seed=seed + i)
        for p, r in spare_domains(job, trace).items():
            per_trace[p].append(r.needed)
            paused[p].append(r.paused_fraction)
        main.append(_main_gpus(trace, n))
        above.append(fraction_of_time_above(main[-1], 0.001))
    restart = RestartCost()
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
        "goodput": _goodput(job, main, restart),
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
                "shard_split": job.shard_split,
                "power_cap": job.power.cap,
                "power_exponent": job.power.exponent,
                "shortfall": job.power.shortfall,
                "healthy_step_s": job.replica_time(job.base_tp, job.local_batch).total,
            },
            "restart": {
                **restart.as_dict(job),
                "mtbf_h": job_mtbf_hours(FailureModel.llama3(), n),
            },
        },
        "paper": PAPER_REPORTED,
    }
