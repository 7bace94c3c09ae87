"""Why the scale-up domain decides what NTP buys: the same kind of job on NVL8 Hopper systems
(DGX H100, DGX H200), on the NTP paper's B200 NVL32 domains and on GB200 NVL72 racks.

TP lives inside one NVLink domain, so the domain caps the TP degree: 8 on an HGX/DGX Hopper
system, where a TP-8 group that loses a GPU can only run at TP 7 or 6, against 32 or 72 on the
larger domains. A failed GPU takes its whole TP group out of a job that drops replicas
(``dp-drop``): 8 GPUs on NVL8, 32 on NVL32, 72 on NVL72. So the throughput a failure costs, and
what running the damaged group at a lower degree (``ntp``, ``ntp-pw``) wins back, grow with the
domain.

``DOMAIN_MODEL`` is one GPT for all four, 96 layers 18,432 wide with 288 heads of 64 and
sequences of 18,432 tokens, so that TP 8, 32 and 72 all divide its heads and its sequence (for
sequence parallelism) and 8 or 16 stages its layers (about 393B parameters, the class of the NTP
paper's 480B). ``domain_jobs()`` builds one ``TrainingJob`` per cluster (32,768 GPUs, or 36,864
in whole NVL72 racks), 8 sequences per replica, every scale-up domain with the same NCCL
assumptions of its generation (``specs``: nccl-tests' ring and NVLS efficiencies); the paper's
NVL32 B200 cluster gets Blackwell's. ``domain_comparison`` gives each policy's mean relative
throughput under uniformly random failures (``monte_carlo.throughput_samples``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..checks import check_positive_int
from .monte_carlo import throughput_samples
from .plan_options import PLAN_POLICIES
from .replica_cost import PAPER_CLUSTER, TrainingJob, paper_parallel
from .specs import BLACKWELL_NCCL, CLUSTERS, ModelSpec, check_config

__all__ = ["DOMAIN_MODEL", "DOMAIN_SETUPS", "domain_jobs", "domain_comparison"]

DOMAIN_MODEL = ModelSpec(
    layers=96, hidden=18432, heads=288, vocab=51200, seq=18432, name="393B GPT (288 heads)"
)
# cluster name: (domains, tp, pp, reduced TP degrees allowed)
DOMAIN_SETUPS: dict[str, tuple[int, int, int, tuple[int, ...]]] = {
    "DGX H100": (4096, 8, 16, (7, 6)),
    "DGX H200": (4096, 8, 16, (7, 6)),
    PAPER_CLUSTER.name: (1024, 32, 8, (30, 28)),
    "GB200 NVL72": (512, 72, 8, (70, 68)),
}
LOCAL_BATCH = 8  # sequences per replica, as in the NTP paper's setup


def domain_jobs(shard_split: str = "whole") -> dict[str, TrainingJob]:
    """One ``TrainingJob`` per cluster of ``DOMAIN_SETUPS``: ``DOMAIN_MODEL`` at the domain's
    TP degree, BF16, sequence parallelism, selective recomputation, overlapped DP all-reduce and
    a distributed optimizer (the NTP paper's assumptions, ``TrainingJob.paper``)."""
    jobs = {}
    for name, (domains, tp, pp, reduced) in DOMAIN_SETUPS.items():
        if name == PAPER_CLUSTER.name:
            base = dataclasses.replace(PAPER_CLUSTER, **BLACKWELL_NCCL)  # type: ignore[arg-type]
        else:
            base = CLUSTERS[name]
        cluster = dataclasses.replace(base, n_gpus=domains * base.domain_size)
        dp = cluster.n_gpus // (tp * pp)
        par = paper_parallel(tp, pp, dp, LOCAL_BATCH)
        check_config(DOMAIN_MODEL, cluster, par)
        jobs[name] = TrainingJob(
            model=DOMAIN_MODEL,
            cluster=cluster,
            par=par,
            reduced_tps=reduced,
            shard_split=shard_split,
        )
    return jobs


def domain_comparison(
    fractions: tuple[float, ...] = (0.001, 0.005),
    samples: int = 16,
    seed: int = 0,
    shard_split: str = "whole",
) -> list[dict[str, Any]]:
    """Per cluster and failed fraction: the domain and TP degree, and each policy's mean
    relative throughput over ``samples`` uniformly random failure patterns (1 = healthy)."""
    check_positive_int(samples, "samples")
    rows = []
    for name, job in domain_jobs(shard_split).items():
        thr = throughput_samples(job, fractions, samples, seed)
        for i, f in enumerate(fractions):
            rows.append(
                {
                    "cluster": name,
                    "gpu": job.cluster.gpu.name,
                    "domain": job.cluster.domain_size,
                    "gpus": job.cluster.n_gpus,
                    "tp": job.base_tp,
                    "reduced_tps": list(job.degrees),
                    "failed_fraction": f,
                    **{p: float(np.mean(thr[p][i])) for p in PLAN_POLICIES},
                }
            )
    return rows
