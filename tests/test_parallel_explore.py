"""Tests for tutorial_lib.cluster.explore: the chapter 11 plan explorer."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tutorial_lib.cluster.explore import explore_job, explore_plan, plan_explorer  # noqa: E402
from tutorial_lib.cluster.plan_options import PLAN_POLICIES  # noqa: E402


def test_no_failures_keeps_full_throughput() -> None:
    for policy in PLAN_POLICIES:
        s, fig = explore_plan(4096, 32, 32, 0.0, policy, samples=2)
        plt.close(fig)
        assert s["relative_throughput"] == pytest.approx(1.0)
        assert s["failed_gpus"] == 0 and s["degraded_replicas"] == 0
        assert s["global_batch"] == s["healthy_global_batch"] == 8 * s["dp"]


@pytest.mark.parametrize(("gpus", "domain", "tp"), [(32768, 32, 32), (4096, 64, 16), (1024, 8, 8)])
def test_policies_are_ordered(gpus: int, domain: int, tp: int) -> None:
    thr = {}
    for policy in PLAN_POLICIES:
        s, fig = explore_plan(gpus, domain, tp, 0.003, policy, seed=1, samples=2)
        plt.close(fig)
        assert 0 < s["relative_throughput"] <= 1
        thr[policy] = s["relative_throughput"]
    assert thr["dp-drop"] <= thr["ntp"] + 1e-12 <= thr["ntp-pw"] + 2e-12
    assert thr["dp-drop"] < 1  # 0.3% failed always hits some TP group


def test_paper_layout_matches_job_paper() -> None:
    s, fig = explore_plan(samples=2)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    plt.close(fig)
    assert (s["dp"], s["reduced_tps"], s["healthy_global_batch"]) == (128, (28, 30), 1024)
    assert s["failed_gpus"] == 33 and "replicas" in s["describe"]
    assert 1.0 <= s["max_power"] <= 1.3 + 1e-9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tp": 24}, "does not divide the scale-up domain"),
        ({"n_gpus": 1000}, "whole domains"),
        ({"n_gpus": 64, "domain_size": 32, "tp": 32}, "do not split into replicas"),
        ({"policy": "magic"}, "policy"),
        ({"failed_fraction": 0.5}, "failed_fraction"),
        ({"tp": 1, "domain_size": 8}, "at least 2"),
    ],
)
def test_bad_input_raises(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        explore_plan(**kwargs)


def test_explore_job_degrees() -> None:
    assert explore_job(1024, 8, 8).degrees == (4, 6)
    assert explore_job(1024, 8, 2, pp=4).degrees == (1,)


def test_plan_explorer_builds_and_updates() -> None:
    pytest.importorskip("ipywidgets", reason="ipywidgets (the book extra) is not installed")
    box = plan_explorer(n_gpus=4096, failed_fraction=0.002)
    out = box.children[-1]
    assert (
        type(out).__name__ == "HTML" and "<img" in out.value and "relative_throughput" in out.value
    )
    box.children[0].children[2].value = 64  # TP 64 in domains of 32: impossible
    assert "does not divide" in out.value
    box.children[0].children[2].value = 16
    assert "<img" in out.value
