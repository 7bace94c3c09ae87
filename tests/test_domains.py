"""Chapter 11's comparison of scale-up domains (``cluster.domains``): NVL8 Hopper systems
against NVL32 and NVL72, checked against a hand count of what dropping replicas costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tutorial_lib.cluster.domains import DOMAIN_MODEL, domain_comparison, domain_jobs
from tutorial_lib.cluster.monte_carlo import _nested_failures
from tutorial_lib.cluster.specs import check_config


def test_jobs_put_tp_inside_each_domain() -> None:
    jobs = domain_jobs()
    assert {n: (j.cluster.domain_size, j.base_tp) for n, j in jobs.items()} == {
        "DGX H100": (8, 8),
        "DGX H200": (8, 8),
        "B200 NVL32 (NTP paper)": (32, 32),
        "GB200 NVL72": (72, 72),
    }
    for job in jobs.values():
        check_config(job.model, job.cluster, job.par)  # a layout the cost model accepts
        assert DOMAIN_MODEL.heads % job.base_tp == 0
        assert job.local_batch == 8 and job.par.tp * job.par.pp * job.par.dp == job.cluster.n_gpus
    assert jobs["DGX H100"].degrees == (6, 7)  # TP 8 degrades to 7 or 6, no further


def test_dp_drop_on_nvl8_by_hand() -> None:
    # F failed GPUs in F distinct TP-8 groups; packing puts them in ceil(F / pp) replicas, so
    # dp-drop keeps (dp - ceil(F / pp)) / dp of the throughput.
    job = domain_jobs()["DGX H100"]
    fraction, samples = 0.001, 6
    (k,), orders = _nested_failures(job.cluster.n_gpus, np.array([fraction]), samples, 3)
    expected = []
    for order in orders:
        groups = len(set((order[:k] // job.base_tp).tolist()))
        expected.append((job.par.dp - math.ceil(groups / job.par.pp)) / job.par.dp)
    rows = domain_comparison((fraction,), samples=samples, seed=3)
    h100 = next(r for r in rows if r["cluster"] == "DGX H100")
    assert h100["dp-drop"] == pytest.approx(float(np.mean(expected)))


def test_the_domain_decides_what_a_failure_costs() -> None:
    rows = domain_comparison((0.001, 0.005), samples=8, seed=0)
    by = {(r["cluster"], r["failed_fraction"]): r for r in rows}
    for f in (0.001, 0.005):
        nvl8, nvl32, nvl72 = (
            by[("DGX H100", f)],
            by[("B200 NVL32 (NTP paper)", f)],
            by[("GB200 NVL72", f)],
        )
        # dropping replicas costs more the larger the TP group a failure idles
        assert nvl8["dp-drop"] > nvl32["dp-drop"] > nvl72["dp-drop"]
        for r in (nvl8, nvl32, nvl72):
            assert r["dp-drop"] <= r["ntp"] <= r["ntp-pw"] <= 1.0
        # what NTP wins back grows with the domain
        gains = [r["ntp"] - r["dp-drop"] for r in (nvl8, nvl32, nvl72)]
        assert gains[0] < gains[1] < gains[2]
        assert by[("DGX H200", f)]["dp-drop"] == pytest.approx(nvl8["dp-drop"])
    with pytest.raises(ValueError, match="samples"):
        domain_comparison(samples=0)
