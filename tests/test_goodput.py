"""Tests for tutorial_lib.cluster.goodput: Young's and Daly's intervals against hand values and
Daly's published results, the exact Poisson goodput, the trace simulation on a hand-made trace
against a hand computation, monotone behaviour, the simulated optimum against Daly on a long
trace, the ``goodput`` key of ``ntp_reproduce`` and errors."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest

# test_planner's toy job: 64 GPUs in domains of 8, 16 TP groups of 4, replicas of 2 stages.
from test_planner import JOB, MODEL  # noqa: E402

from tutorial_lib.cluster import reproduce
from tutorial_lib.cluster.failures import FailureModel, FailureTrace, Recovery, simulate_trace
from tutorial_lib.cluster.goodput import (
    BREAKDOWN,
    RestartCost,
    daly_interval,
    job_mtbf_hours,
    optimal_interval,
    simulate_goodput,
    young_interval,
)
from tutorial_lib.cluster.plan_options import PLAN_POLICIES
from tutorial_lib.cluster.plans import plan_cluster
from tutorial_lib.cluster.replica_cost import TrainingJob
from tutorial_lib.cluster.report import format_report

CKPT = MODEL.params() * 14.0  # bytes of a checkpoint at the default 14 bytes per parameter
# Downtime 540 + 270 + 90 = 900 s = 0.25 h; a checkpoint write takes 360 s = 0.1 h.
HAND = RestartCost(
    detect_s=540.0, restart_s=270.0, read_bandwidth=CKPT / 90, write_bandwidth=CKPT / 360
)


def _trace(hours: float, rows: list[tuple[int, float, float]]) -> FailureTrace:
    """A trace of JOB's 64 GPUs from (gpu, start, end) rows sorted by start."""
    gpu, start, end = (np.array(c) for c in zip(*rows, strict=True)) if rows else [np.array([])] * 3
    return FailureTrace(
        64, hours, 1.0, gpu.astype(np.int64), start.astype(float), end.astype(float),
        np.ones(len(gpu), bool),
    )  # fmt: skip


# ---- intervals ----------------------------------------------------------------------------------
def test_young_interval_by_hand() -> None:
    assert young_interval(7.0, 14.0) == pytest.approx(14.0, rel=1e-12)  # sqrt(2 x 7 x 14)
    assert young_interval(300.0, 86400.0) == pytest.approx(7200.0, rel=1e-12)  # 5 min, 24 h


def test_daly_interval_reproduces_dalys_published_results() -> None:
    """Daly (2006), figure captions, delta = 5 min: M = 24 h -> 117 min, 6 h -> 57 min, 15 min ->
    9.1 min (rounded there). By hand at 24 h: sqrt(2 x 5 x 1440) = 120 and delta / 2M = 1/576,
    so 120 (1 + 1/72 + 1/5184) - 5 = 116.690 min. The simpler sqrt(2 delta M) - delta gives
    7.25 min at 15 min, which Daly's figure rules out."""
    minute = 60.0
    for mtbf_min, published, tol in ((1440, 117, 0.5), (360, 57, 0.5), (15, 9.1, 0.05)):
        assert daly_interval(5 * minute, mtbf_min * minute) / minute == pytest.approx(
            published, abs=tol
        )
    by_hand = 120 * (1 + 1 / 72 + 1 / 5184) - 5
    assert daly_interval(5 * minute, 1440 * minute) / minute == pytest.approx(by_hand, rel=1e-12)
    assert daly_interval(10.0, 5.0) == 5.0 == daly_interval(12.0, 5.0)  # delta >= 2M: M


def expected_goodput(
    interval_s: float,
    checkpoint_write_s: float,
    downtime_s: float,
    mtbf_s: float,
    throughput: float = 1.0,
) -> float:
    """Goodput of checkpoints every ``interval_s`` of compute under Poisson failures at rate
    1/M that strike while running and while recovering (a failure in a recovery starts it
    again): Daly's (2006) exact model, wall time M e^(R/M) (e^((tau+delta)/M) - 1) per tau of
    work, so goodput = throughput x (tau / M) e^(-R/M) / (e^((tau + delta)/M) - 1), with
    ``throughput`` the mean relative throughput the job runs at. Young's and Daly's intervals
    approximate its maximiser."""
    tau, d, r, m = interval_s, checkpoint_write_s, downtime_s, mtbf_s
    return throughput * tau / m * math.exp(-r / m) / math.expm1((tau + d) / m)


def test_expected_goodput_by_hand_and_its_maximiser_is_dalys() -> None:
    """tau 0.5, delta 0.1, R 0.2, M 2: (0.25) e^-0.1 / (e^0.3 - 1) = 0.64657. Maximising it
    numerically: Daly's interval within 1% at every delta / M up to 0.1, Young's drifts off."""
    g = expected_goodput(0.5, 0.1, 0.2, 2.0)
    assert g == pytest.approx(0.25 * math.exp(-0.1) / (math.exp(0.3) - 1), rel=1e-12)
    assert g == pytest.approx(0.64657, abs=1e-5)
    assert expected_goodput(0.5, 0.1, 0.2, 2.0, throughput=0.9) == pytest.approx(0.9 * g)
    best = {}
    for ratio in (1e-4, 1e-3, 1e-2, 0.1):
        grid = np.geomspace(0.01, 3.0, 20001) * math.sqrt(2 * ratio)
        best[ratio] = grid[np.argmax([expected_goodput(t, ratio, 0.05, 1.0) for t in grid])]
        assert daly_interval(ratio, 1.0) == pytest.approx(best[ratio], rel=0.01)
    assert young_interval(1e-4, 1.0) == pytest.approx(best[1e-4], rel=0.01)
    assert young_interval(0.1, 1.0) / best[0.1] > 1.1  # Young's is first order only


def test_llama3_scale_matches_reported_effective_training_time() -> None:
    """Llama 3 (16,384 GPUs, a failure every ~3.1 h) reports > 90% effective training time;
    MegaScale > 90% on > 10,000 GPUs. The default costs at Daly's interval give ~91%."""
    job, cost = TrainingJob.paper(), RestartCost()
    mtbf = job_mtbf_hours(FailureModel.llama3(), 16_384) * 3600
    assert mtbf / 3600 == pytest.approx(54 * 24 / 419, rel=0.01)
    write = cost.write_s(job)
    g = expected_goodput(daly_interval(write, mtbf), write, cost.downtime_s(job), mtbf)
    assert 0.88 < g < 0.95


# ---- the restart cost ---------------------------------------------------------------------------
def test_restart_cost_components() -> None:
    assert HAND.checkpoint_bytes(JOB) == CKPT
    assert HAND.load_s(JOB) == pytest.approx(90.0, rel=1e-12)
    assert HAND.write_s(JOB) == pytest.approx(360.0, rel=1e-12)
    assert HAND.downtime_s(JOB) == pytest.approx(900.0, rel=1e-12)
    assert HAND.reshard_s(JOB, 4) == 0.0 == HAND.reshard_s(JOB, 5)
    # TP 4 -> 3: each survivor gets 1/3 - 1/4 of a stage's 14 bytes per parameter over NVLink.
    moved = MODEL.params() / 2 * 14 * (1 / 3 - 1 / 4)
    assert HAND.reshard_s(JOB, 3) == pytest.approx(moved / (0.7 * 450e9), rel=1e-12)
    assert HAND.downtime_s(JOB, 3) == pytest.approx(900.0 + HAND.reshard_s(JOB, 3))
    later = dataclasses.replace(HAND, replan_s=2.5)
    assert later.reshard_s(JOB, 3) == pytest.approx(HAND.reshard_s(JOB, 3) + 2.5)
    # The paper's job: 480B x 14 B = 7.07 TB, 3.5 s at Llama 3's 2 TB/s; a reshard is ~ms.
    paper = TrainingJob.paper()
    assert RestartCost().write_s(paper) == pytest.approx(3.533, abs=1e-3)
    assert RestartCost().reshard_s(paper, 28) < 0.01


# ---- the trace simulation -----------------------------------------------------------------------
# 10 h. GPU 60 is down from the burn-in (no interruption); GPU 5 fails at 1.3 h; GPU 17 fails at
# 1.45 h, during that recovery, which starts again; GPU 40 fails at 5.9 h and stays down.
HAND_TRACE = _trace(10.0, [(60, -2.0, 3.0), (5, 1.3, 4.1), (17, 1.45, 1.5), (40, 5.9, 30.0)])


def test_goodput_on_a_hand_made_trace() -> None:
    """Interval 0.7 h + write 0.1 h = cycles of 0.8 h; downtime 0.25 h.
    [0, 1.3) with GPU 60 down: one cycle, then 0.5 h lost.
    Recovery 1.3 -> 1.45, cut by the next failure; recovery 1.45 -> 1.70.
    [1.70, 5.9) = 4.2 h with GPUs 5, 17, 60 down (at 1.45): 5 cycles, then 0.2 h lost.
    Recovery 5.9 -> 6.15; [6.15, 10) = 3.85 h with GPU 40 down: 4 cycles + 0.65 h kept.
    Kept 0.7 + 3.5 + 3.45 h, lost 0.7, checkpoints 1.0, recoveries 0.65: 10 h."""
    r = [plan_cluster(JOB, np.array(f), "dp-drop").throughput for f in ([60], [5, 17, 60], [40])]
    assert max(r) < 1 and len(set(r)) > 1
    res = simulate_goodput(JOB, HAND_TRACE, "dp-drop", 0.7, HAND)
    assert res.goodput == pytest.approx((0.7 * r[0] + 3.5 * r[1] + 3.45 * r[2]) / 10, rel=1e-9)
    degraded = (0.7 * (1 - r[0]) + 3.5 * (1 - r[1]) + 3.45 * (1 - r[2])) / 10
    expected = {"lost_work": 0.07, "restart": 0.065, "checkpoint": 0.1, "degraded": degraded}
    assert res.breakdown == pytest.approx(expected, rel=1e-9)
    assert res.goodput + sum(res.breakdown.values()) == pytest.approx(1.0, rel=1e-12)
    assert (res.interruptions, res.wall_h) == (3, 10.0)
    assert res.mean_downtime_s == pytest.approx(900.0)


def test_ntp_pays_the_reshard_of_its_plan() -> None:
    """The same trace under ntp: the recoveries at 1.45 h and 5.9 h each add the reshard to the
    lowest degree of their plan (``plan_cluster``'s), e2 and e3 hours, which shorten the runs."""
    failed = ([60], [5, 17, 60], [40])
    r = [plan_cluster(JOB, np.array(f), "ntp").throughput for f in failed]
    low = [min(a.tp for a in plan_cluster(JOB, np.array(f), "ntp").replicas) for f in failed]
    assert low[1] < JOB.base_tp and low[2] < JOB.base_tp
    e2, e3 = (HAND.reshard_s(JOB, d) / 3600 for d in low[1:])
    assert e2 > 0 and e3 > 0
    res = simulate_goodput(JOB, HAND_TRACE, "ntp", 0.7, HAND)
    kept = (0.7, 3.5, 3.45 - e3)
    assert res.goodput == pytest.approx(
        sum(k * x for k, x in zip(kept, r, strict=True)) / 10, rel=1e-9
    )
    assert res.breakdown["restart"] == pytest.approx((0.65 + e2 + e3) / 10, rel=1e-9)
    assert res.breakdown["lost_work"] == pytest.approx((0.7 - e2) / 10, rel=1e-9)
    assert res.goodput > simulate_goodput(JOB, HAND_TRACE, "dp-drop", 0.7, HAND).goodput


def test_a_failure_during_a_write_loses_the_interval_before_it() -> None:
    """GPU 33 fails at 0.75 h, inside the first write (0.7 -> 0.8 h): the 0.7 h before it are
    lost, the 0.05 h written so far is checkpoint time. Recovery to 1.0 h, then one cycle and
    0.2 h to the end at 2.0 h. A trace ending inside a write keeps its compute (7.15 h: 8
    cycles, 0.7 h, 0.05 h of a write)."""
    r = plan_cluster(JOB, np.array([33]), "ntp").throughput
    res = simulate_goodput(JOB, _trace(2.0, [(33, 0.75, 5.0)]), "ntp", 0.7, HAND)
    e = HAND.reshard_s(JOB, min(a.tp for a in plan_cluster(JOB, np.array([33]), "ntp").replicas))
    kept = 0.9 - e / 3600
    assert res.goodput == pytest.approx(kept * r / 2.0, rel=1e-9)
    assert res.breakdown["lost_work"] == pytest.approx(0.7 / 2.0, rel=1e-12)
    assert res.breakdown["checkpoint"] == pytest.approx(0.15 / 2.0, rel=1e-9)
    end = simulate_goodput(JOB, _trace(7.15, []), "ntp", 0.7, HAND)
    assert end.goodput == pytest.approx(6.3 / 7.15, rel=1e-12)
    assert end.breakdown["checkpoint"] == pytest.approx(0.85 / 7.15, rel=1e-12)


def test_no_failures_leaves_only_the_checkpoint_overhead() -> None:
    """6.4 h = 8 cycles of 0.7 h compute + 0.1 h write: goodput 0.7 / 0.8 = 0.875 exactly; 6.6 h
    adds 0.2 h of compute after the last write."""
    for policy in PLAN_POLICIES:
        res = simulate_goodput(JOB, _trace(6.4, []), policy, 0.7, HAND)
        assert res.goodput == pytest.approx(0.875, rel=1e-12)
        assert res.breakdown == pytest.approx(
            {"lost_work": 0, "restart": 0, "checkpoint": 0.125, "degraded": 0}, abs=1e-12
        )
        assert res.interruptions == 0
    assert simulate_goodput(JOB, _trace(6.6, []), "ntp", 0.7, HAND).goodput == pytest.approx(
        (5.6 + 0.2) / 6.6, rel=1e-12
    )


def _long_trace(hours: float, seed: int = 0) -> tuple[FailureTrace, FailureModel]:
    """JOB's 64 GPUs failing once an hour between them, each back after 0.05 h."""
    model = FailureModel(rate_per_gpu_hour=1 / 64, hardware_fraction=0.0, software=Recovery(0.05))
    return simulate_trace(model, 64, hours / 24, seed=seed), model


def test_more_failures_or_slower_restarts_lower_goodput() -> None:
    trace, _ = _long_trace(200.0)
    keep = np.arange(trace.n_failures) % 2 == 0  # every other failure
    fewer = dataclasses.replace(
        trace, gpu=trace.gpu[keep], start=trace.start[keep], end=trace.end[keep],
        hardware=trace.hardware[keep],
    )  # fmt: skip
    slower = dataclasses.replace(HAND, detect_s=1200.0)
    for policy in PLAN_POLICIES:
        base = simulate_goodput(JOB, trace, policy, 0.2, HAND)
        assert simulate_goodput(JOB, fewer, policy, 0.2, HAND).goodput > base.goodput + 0.05
        assert simulate_goodput(JOB, trace, policy, 0.2, slower).goodput < base.goodput - 0.05
    g = [simulate_goodput(JOB, trace, p, 0.2, HAND).goodput for p in PLAN_POLICIES]
    assert g[0] < g[1] <= g[2]  # dp-drop < ntp <= ntp-pw


def test_simulation_matches_the_exact_model_and_its_optimum_is_near_daly() -> None:
    """2,000 h of ~1 failure an hour, writes of 72 s, downtime 0.25 h. Under Poisson failures
    the simulated goodput over its relative throughput is ``expected_goodput`` at the trace's
    own MTBF, up to where the ~2,000 failures fall in their 0.22 h cycles: the loss per failure
    has a standard deviation of ~0.22 / sqrt(12) h, so sigma ~ 0.064 sqrt(2000) / 2000 ~ 0.0014;
    the bound is 4 sigma, 0.005 (seeds 0-5: at most 0.0024). The simulated best interval lies
    within a factor 1.5 of Daly's: the waste there, ~sqrt(2 delta / M) ~ 0.2, is ~8% higher,
    0.017 of goodput, while the noise between two intervals is ~0.002 (seeds 0-5: 0.90-1.17)."""
    trace, model = _long_trace(2000.0)
    cost = dataclasses.replace(HAND, write_bandwidth=CKPT / 72)
    write_s = cost.write_s(JOB)
    res = simulate_goodput(JOB, trace, "dp-drop", 0.2, cost)
    mtbf_s = 3600 * trace.hours / res.interruptions
    assert mtbf_s / 3600 == pytest.approx(job_mtbf_hours(model, 64), rel=0.1)
    thr = res.goodput / (res.goodput + res.breakdown["degraded"])
    model_g = expected_goodput(0.2 * 3600, write_s, cost.downtime_s(JOB), mtbf_s, thr)
    assert res.goodput == pytest.approx(model_g, abs=0.005)
    sweep = optimal_interval(JOB, trace, "dp-drop", cost)
    daly_h = daly_interval(write_s, mtbf_s) / 3600
    assert 1 / 1.5 < sweep.best_h / daly_h < 1.5
    assert sweep.best_goodput == pytest.approx(sweep.goodput.max())
    assert sweep.goodput[0] < sweep.best_goodput - 0.02 > sweep.goodput[-1]  # a real optimum


# ---- ntp-reproduce ------------------------------------------------------------------------------
def test_ntp_reproduce_reports_goodput_per_policy() -> None:
    report = reproduce.ntp_reproduce(samples=1, quick=True)
    g = report["goodput"]
    assert set(g) == set(PLAN_POLICIES)
    for p in PLAN_POLICIES:
        row = g[p]
        assert 0.5 < row["goodput"] < 1 and set(row["breakdown"]) == set(BREAKDOWN)
        assert row["goodput"] + sum(row["breakdown"].values()) == pytest.approx(1.0)
        assert row["interval_h"] == row["daly_interval_h"] < row["young_interval_h"]
        assert row["optimal_goodput"] >= row["goodput"]
        assert 1 / 2 < row["optimal_interval_h"] / row["daly_interval_h"] < 2
        assert row["interruptions"] > 100  # ~0.65 failures an hour for 15 days
    assert g["dp-drop"]["goodput"] < g["ntp"]["goodput"] < g["ntp-pw"]["goodput"]
    restart = report["setup"]["restart"]
    assert restart["detect_s"] == 600.0 and restart["mtbf_h"] == pytest.approx(1.55, abs=0.01)
    assert "Goodput with restarts" in format_report(report)


# ---- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RestartCost(detect_s=-1.0), "detect_s"),
        (lambda: RestartCost(restart_s=float("nan")), "restart_s"),
        (lambda: RestartCost(read_bandwidth=0.0), "read_bandwidth"),
        (lambda: RestartCost(write_bandwidth=-2e12), "write_bandwidth"),
        (lambda: RestartCost(bytes_per_param=float("inf")), "bytes_per_param"),
        (lambda: young_interval(-1.0, 10.0), "checkpoint_write_s"),
        (lambda: young_interval(1.0, 0.0), "mtbf_s"),
        (lambda: daly_interval(float("nan"), 10.0), "checkpoint_write_s"),
        (lambda: job_mtbf_hours(FailureModel(rate_per_gpu_hour=0.0), 64), "never fails"),
        (lambda: simulate_goodput(JOB, HAND_TRACE, "ntp", 0.0, HAND), "interval_h"),
        (lambda: simulate_goodput(JOB, HAND_TRACE, "ntp", -0.5, HAND), "interval_h"),
        (lambda: simulate_goodput(JOB, HAND_TRACE, "elastic", 0.5, HAND), "policy"),
        (lambda: simulate_goodput(JOB, HAND_TRACE, "ntp", 0.5, 600.0), "RestartCost"),  # type: ignore[arg-type]
        (
            lambda: simulate_goodput(JOB, dataclasses.replace(HAND_TRACE, n_gpus=72), "ntp", 0.5),
            "72 GPUs",
        ),
        (lambda: optimal_interval(JOB, [], "ntp"), "at least one trace"),
        (lambda: optimal_interval(JOB, HAND_TRACE, "ntp", HAND, [0.5, -0.1]), "intervals_h"),
    ],
)
def test_errors(make: Callable[[], object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()
