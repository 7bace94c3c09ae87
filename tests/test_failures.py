"""Tests for tutorial_lib.cluster.failures: the Llama 3 failure model, seeded traces, random
failures and replica availability, and a smoke run of benchmarks/failures.py.

Statistical checks use a fixed seed, so each is deterministic; the bounds are 4 standard
deviations of the quantity under a correct implementation (a two-sided normal tail of ~6e-5, so
about 1 seed in 15,000 would fail), wide enough never to be flaky when a seed changes and tight
enough to catch a bias of a few percent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tutorial_lib.cluster.failures import (
    FailureModel,
    FailureTrace,
    Recovery,
    expected_replica_availability,
    fraction_of_time_above,
    random_failures,
    simulate_trace,
)
from tutorial_lib.cluster.replicas import (
    failed_per_domain,
    failed_per_replica,
    replica_availability,
)

LLAMA3 = FailureModel.llama3()


# ---- the model ---------------------------------------------------------------------------------
def test_llama3_rate_is_the_papers_count_per_gpu_hour() -> None:
    assert LLAMA3.rate_per_gpu_hour == pytest.approx(419 / (54 * 24 * 16384), rel=1e-12)
    assert LLAMA3.hardware_fraction == 0.78
    assert (LLAMA3.hardware.mean_hours, LLAMA3.software.mean_hours) == (120.0, 3.0)
    assert FailureModel() == LLAMA3
    # One unexpected interruption every ~3.1 hours on the paper's 16,384 GPUs.
    assert 1 / (LLAMA3.rate_per_gpu_hour * 16384) == pytest.approx(54 * 24 / 419)
    scaled = FailureModel.llama3(hardware_days=3, dist="exponential", rate_scale=3)
    assert scaled.rate_per_gpu_hour == pytest.approx(3 * LLAMA3.rate_per_gpu_hour)
    assert scaled.hardware == Recovery(72.0, "exponential")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FailureModel(rate_per_gpu_hour=-1e-5), "rate_per_gpu_hour"),
        (lambda: FailureModel(rate_per_gpu_hour=float("nan")), "rate_per_gpu_hour"),
        (lambda: FailureModel(hardware_fraction=1.2), "hardware_fraction"),
        (lambda: FailureModel(hardware_fraction=-0.1), "hardware_fraction"),
        (lambda: Recovery(0.0), "mean_hours"),
        (lambda: Recovery(-3.0), "mean_hours"),
        (lambda: Recovery(float("inf")), "mean_hours"),
        (lambda: Recovery(3.0, "weibull"), "dist"),
        (lambda: Recovery(3.0, "lognormal", sigma=0.0), "sigma"),
        (lambda: FailureModel.llama3(hardware_days=0), "mean_hours"),
        (lambda: FailureModel.llama3(rate_scale=-2), "rate_scale"),
        (lambda: simulate_trace(LLAMA3, 0, 1), "n_gpus"),
        (lambda: simulate_trace(LLAMA3, 8, 0), "days"),
        (lambda: simulate_trace(LLAMA3, 8, 1, step_hours=-1), "step_hours"),
        (lambda: simulate_trace(LLAMA3, 8, 1, burn_in_days=-1), "burn_in_days"),
        (lambda: random_failures(100, 1.5), "fraction"),
        (lambda: random_failures(0, 0.1), "n_gpus"),
        (lambda: fraction_of_time_above(simulate_trace(LLAMA3, 8, 1), 2.0), "threshold"),
        (lambda: failed_per_domain(np.array([1]), 100, 8), "multiple of domain_size"),
        (lambda: failed_per_domain(np.array([3, 3]), 64, 8), "duplicates"),
        (lambda: failed_per_domain(np.array([64]), 64, 8), "lie in"),
        (lambda: failed_per_domain(np.zeros(8, dtype=bool), 64, 8), "shape"),
        (lambda: failed_per_replica(64, 8, 16, np.array([1])), "tp"),
        (lambda: failed_per_replica(64, 8, 8, np.array([1]), gpus_per_replica=12), "multiple"),
        (lambda: failed_per_replica(72, 8, 8, np.array([1]), gpus_per_replica=16), "split"),
        (lambda: expected_replica_availability(10, 11, 1), "gpus_per_replica"),
    ],
)
def test_invalid_arguments_raise_clear_errors(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


# ---- traces ------------------------------------------------------------------------------------
def _arrays(trace: FailureTrace) -> tuple[np.ndarray, ...]:
    return (trace.gpu, trace.start, trace.end, trace.hardware)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a, b = (simulate_trace(LLAMA3, 32768, 15, seed=7) for _ in range(2))
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)
    c = simulate_trace(LLAMA3, 32768, 15, seed=8)
    assert a.n_failures != c.n_failures or not np.array_equal(a.start, c.start)


def test_failure_count_and_cause_match_the_rate() -> None:
    # 5x Llama 3's rate on 100,000 GPUs for 60 days: ~14,000 failures. After a 10-day burn-in
    # (longer than any 5-day recovery) the trace is stationary, so failures starting in the
    # window are expected_failures(); their count is about Poisson, sd = sqrt(mean).
    model = FailureModel.llama3(rate_scale=5)
    trace = simulate_trace(model, 100_000, 60, seed=3, burn_in_days=10)
    in_window = trace.start >= 0
    expected = model.expected_failures(100_000, 60 * 24)
    assert abs(in_window.sum() - expected) < 4 * math.sqrt(expected)
    # Cause: each failure is hardware with probability 0.78 (binomial sd).
    n, hw = in_window.sum(), trace.hardware[in_window].sum()
    assert abs(hw - 0.78 * n) < 4 * math.sqrt(n * 0.78 * 0.22)


@pytest.mark.parametrize(("dist", "cv"), [("exponential", 1.0), ("lognormal", None)])
def test_recovery_times_have_the_configured_means(dist: str, cv: float | None) -> None:
    hw, sw = Recovery(120.0, dist, sigma=0.8), Recovery(3.0, dist, sigma=0.8)
    model = FailureModel(rate_per_gpu_hour=2e-3, hardware_fraction=0.78, hardware=hw, software=sw)
    trace = simulate_trace(model, 20_000, 10, seed=11)
    cv = cv if cv is not None else math.sqrt(math.exp(0.8**2) - 1)  # lognormal sd / mean
    for mask, rec in ((trace.hardware, hw), (~trace.hardware, sw)):
        times = (trace.end - trace.start)[mask]
        assert abs(times.mean() - rec.mean_hours) < 4 * cv * rec.mean_hours / math.sqrt(len(times))
    fixed = simulate_trace(LLAMA3, 32768, 15, seed=0)
    recovery = fixed.end - fixed.start
    np.testing.assert_allclose(recovery[fixed.hardware], 120.0)
    np.testing.assert_allclose(recovery[~fixed.hardware], 3.0)


def test_a_down_gpu_cannot_fail_again_and_the_down_share_is_stationary() -> None:
    # A heavy load (rate x recovery = 0.5) so that arrivals at down GPUs are common: each GPU
    # alternates Exp(0.01/h) up-times with 50 h down, down 1/3 of the time in the long run.
    model = FailureModel(rate_per_gpu_hour=0.01, hardware_fraction=1.0, hardware=Recovery(50.0))
    trace = simulate_trace(model, 2000, 30, seed=5, burn_in_days=20)
    assert model.expected_down_fraction() == pytest.approx(1 / 3)
    order = np.lexsort((trace.start, trace.gpu))
    gpu, start, end = trace.gpu[order], trace.start[order], trace.end[order]
    same = gpu[1:] == gpu[:-1]
    assert same.any() and np.all(start[1:][same] >= end[:-1][same])
    # The time average of 2000 GPUs over 30 days: sd ~ 0.005 (cycles of ~150 h), bound 0.02.
    assert trace.failed_fraction().mean() == pytest.approx(1 / 3, abs=0.02)
    assert trace.down_counts().max() <= 2000


def test_down_at_and_down_counts_agree_with_the_events() -> None:
    model = FailureModel.llama3(rate_scale=200, dist="exponential")
    trace = simulate_trace(model, 500, 4, step_hours=0.5, seed=2, burn_in_days=2)
    assert trace.n_failures > 50 and np.all(np.diff(trace.start) >= 0)
    rng = np.random.default_rng(0)
    times = np.concatenate((trace.times, rng.uniform(0, trace.hours, 40), trace.start[:5]))
    counts = trace.down_counts(times)
    for t, count in zip(times, counts, strict=True):
        brute = np.zeros(500, dtype=bool)
        for g, s, e in zip(trace.gpu, trace.start, trace.end, strict=True):
            brute[g] |= s <= t < e
        np.testing.assert_array_equal(trace.down_at(t), brute)
        np.testing.assert_array_equal(trace.failed_indices(t), np.flatnonzero(brute))
        assert count == brute.sum()
    assert len(trace.times) == 4 * 24 * 2 + 1 and trace.times[-1] == 96.0
    np.testing.assert_allclose(trace.failed_fraction(), trace.down_counts() / 500)


def test_fraction_of_time_above_is_exact() -> None:
    model = FailureModel.llama3(rate_scale=100)
    trace = simulate_trace(model, 1000, 3, seed=4)
    fine = np.arange(0, trace.hours, 1e-3) + 5e-4  # midpoints of a 3.6 s grid
    for threshold in (0.0, 0.002, 0.005, 0.01):
        on_grid = np.mean(trace.down_counts(fine) > threshold * 1000)
        assert fraction_of_time_above(trace, threshold) == pytest.approx(on_grid, abs=2e-3)
    assert fraction_of_time_above(trace, 1.0) == 0.0
    empty = simulate_trace(FailureModel(rate_per_gpu_hour=0.0), 10, 1)
    assert empty.n_failures == 0 and fraction_of_time_above(empty, 0.0) == 0.0
    assert empty.down_counts().sum() == 0 and not empty.down_at(3.0).any()


# ---- random failures, domains and replicas -----------------------------------------------------
@pytest.mark.parametrize(
    ("n", "fraction", "count"),
    [
        (32768, 0.001, 33),
        (1000, 0.0025, 2),
        (1000, 0.0035, 4),
        (7, 0.0, 0),
        (7, 1.0, 7),
        (131072, 0.01, 1311),
    ],
)
def test_random_failures_exact_count_distinct_sorted(n: int, fraction: float, count: int) -> None:
    idx = random_failures(n, fraction, seed=1)
    assert len(idx) == count == round(fraction * n)
    assert len(np.unique(idx)) == count and np.all(np.diff(idx) > 0)
    assert count == 0 or (idx.min() >= 0 and idx.max() < n)
    np.testing.assert_array_equal(idx, random_failures(n, fraction, seed=1))


def test_failed_per_domain_counts_and_masks() -> None:
    failed = np.array([0, 7, 8, 63])
    np.testing.assert_array_equal(failed_per_domain(failed, 64, 8), [2, 1, 0, 0, 0, 0, 0, 1])
    mask = np.zeros(64, dtype=bool)
    mask[failed] = True
    np.testing.assert_array_equal(failed_per_domain(mask, 64, 8), failed_per_domain(failed, 64, 8))
    assert failed_per_domain(np.array([], dtype=np.int64), 64, 8).sum() == 0


def test_replica_layouts() -> None:
    # TP 64 in 72-GPU domains: GPUs 64..71 of each domain are spares and count for no replica.
    counts = failed_per_replica(144, 72, 64, np.array([3, 70, 72 + 63]))
    np.testing.assert_array_equal(counts, [1, 1])
    assert replica_availability(144, 72, 64, np.array([70, 71])) == 1.0
    # TP 4 in 8-GPU domains, replicas of 16 GPUs (4 TP groups = 2 domains): 32 GPUs, 2 replicas.
    np.testing.assert_array_equal(failed_per_replica(32, 8, 4, np.array([15, 16]), 16), [1, 1])
    assert replica_availability(32, 8, 4, np.array([0, 1, 2]), 16) == 0.5
    assert replica_availability(32, 8, 4, np.array([0, 4, 8]), 4) == 5 / 8


def test_expected_availability_is_the_hypergeometric() -> None:
    n, k, f = 40, 6, 5
    assert expected_replica_availability(n, k, f) == pytest.approx(
        math.comb(n - k, f) / math.comb(n, f), rel=1e-12
    )
    assert expected_replica_availability(n, k, 0) == 1.0
    assert expected_replica_availability(8, 4, 6) == 0.0


def test_availability_of_random_failures_matches_the_closed_form() -> None:
    # 82 failures (1%) in 8192 GPUs, 128 replicas of TP 64. Linearity: the mean availability is
    # the hypergeometric C(n-k, F)/C(n, F). One draw has sd <= sqrt(a(1-a)/128) ~ 0.044 (the
    # replicas are negatively correlated, which only lowers it); the mean of 50 draws 0.0063.
    n, k = 8192, 64
    draws = [replica_availability(n, 64, k, random_failures(n, 0.01, seed=s)) for s in range(50)]
    expected = expected_replica_availability(n, k, round(0.01 * n))
    assert np.mean(draws) == pytest.approx(expected, abs=4 * 0.0063)
    # Independent failures with p = F/n give (1-p)^k; drawing without repeats lowers it by a
    # factor ~exp(-F k(k-1) / (2 n^2)), here 0.25%.
    binomial = (1 - 82 / n) ** k
    assert expected / binomial == pytest.approx(math.exp(-82 * k * (k - 1) / (2 * n**2)), abs=1e-4)
    # The NTP paper's Figure 3 point: TP 64 on 32,768 GPUs with 0.1% failed keeps ~94%.
    failed = random_failures(32768, 0.001, seed=0)
    assert expected_replica_availability(32768, 64, len(failed)) == pytest.approx(0.9375, abs=1e-3)


# ---- benchmarks/failures.py --------------------------------------------------------------------
def test_benchmark_smoke(load_benchmark: Callable[[str], ModuleType], tmp_path: Path) -> None:
    bench = load_benchmark("failures.py")
    argv = [
        "--gpus",
        "1024,2048",
        "--days",
        "2",
        "--avail-gpus",
        "1024",
        "--tp",
        "8,64",
        "--repeats",
        "1",
        "--preset",
        "ci",
        "--out",
        str(tmp_path),
    ]
    path = bench.main(argv)
    assert path.parent == tmp_path and path.name.startswith("failures__")
    record = json.loads(path.read_text())
    assert record["benchmark"] == "failures" and record["environment"]["preset"] == "ci"
    assert record["environment"]["device_summary"]
    ops = [(r["op"], r["gpus"]) for r in record["rows"]]
    assert ops == [
        ("simulate_trace", 1024),
        ("simulate_trace", 2048),
        ("random_failures + availability", 1024),
        ("random_failures + availability", 1024),
    ]
    assert all(r["median_ms"] > 0 for r in record["rows"])
    assert [r["tp"] for r in record["rows"][2:]] == [8, 64]
    assert path.with_suffix(".md").exists()
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpus", "0"])
