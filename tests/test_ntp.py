"""Nonuniform TP: planning, shard maps and routes (pure Python), then real DP x TP jobs on gloo
whose training must match one process on the same global batch."""

from __future__ import annotations

import pytest
import torch

from tutorial_lib.config import GPTConfig
from tutorial_lib.jobs.ntp_workers import (
    global_batch,
    ntp_train_worker,
    replica_slices,
    train_reference,
)
from tutorial_lib.model import GPT
from tutorial_lib.parallel.launch import spawn
from tutorial_lib.parallel.ntp import (
    Route,
    degraded_shard_map,
    local_batch,
    plan_ntp,
    reshard_routes,
    token_weights,
)
from tutorial_lib.parallel.shard import (
    ShardMap,
    global_index,
    join_units,
    split_by_unit,
    unit_specs,
)

# 12 heads: TP 4 -> 3 heads per rank, TP 3 -> 4; odd vocab and block sizes catch shape mix-ups.
CFG = GPTConfig(vocab_size=61, block_size=13, n_layer=2, n_head=12, n_embd=48)
FP32 = {"rtol": 1e-5, "atol": 1e-6}


# ---- planning ----------------------------------------------------------------------------------
def test_plan_reduced_degree_and_padding() -> None:
    plan = plan_ntp(8, 3, {0: [5, 2], 2: [1]})
    assert plan.reduced_tp == 6  # 8 - the most failures in one replica (2)
    r0, r1, r2 = plan.replicas
    assert (r0.tp, r0.active, r0.failed, r0.deactivated) == (6, (0, 1, 3, 4, 6, 7), (2, 5), ())
    assert (r1.tp, r1.active, r1.degraded) == (8, tuple(range(8, 16)), False)
    # one failure, padded to two by switching off its highest-numbered healthy rank
    assert (r2.tp, r2.active, r2.failed, r2.deactivated) == (
        6,
        (16, 18, 19, 20, 21, 22),
        (17,),
        (23,),
    )
    assert plan.world_size == 20 and plan.job_ranks[6] == 8
    assert plan.tp_group(1) == list(range(6, 14))
    assert plan.dp_group(0) == [0, 6, 14] and plan.dp_group(5) == [5, 11, 19]
    assert plan.locate(15) == (2, 1)  # physical rank 18: replica 2's TP rank 1
    assert "deactivated [23]" in plan.describe()


def test_plan_without_failures_is_uniform() -> None:
    plan = plan_ntp(4, 2, {1: []})
    assert plan.reduced_tp == 4 and not any(r.degraded for r in plan.replicas)
    assert plan.job_ranks == tuple(range(8)) and plan.dp_group(3) == [3, 7]


@pytest.mark.parametrize(
    ("base_tp", "n_replicas", "failed", "message"),
    [
        (4, 2, {2: [0]}, "Replica 2 is out of range: the job has 2 replicas"),
        (4, 2, {-1: [0]}, "out of range"),
        (4, 2, {0: [4]}, r"failed TP rank\(s\) \[4\] outside \[0, 4\)"),
        (4, 2, {0: [1, 1]}, r"lists failed TP rank\(s\) \[1\] more than once"),
        (4, 2, {1: [3, 2, 1, 0]}, "lost all 4 GPUs: nothing left to run it; drop it from data"),
        (0, 2, {}, "base_tp >= 1"),
        (4, 0, {}, "n_replicas >= 1"),
    ],
)
def test_plan_errors(base_tp: int, n_replicas: int, failed: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_ntp(base_tp, n_replicas, failed)


# ---- degraded shard maps and routes ------------------------------------------------------------
MAPS = [  # (healthy map, reduced degree)
    (ShardMap.even(CFG, 4), 3),
    (ShardMap.even(CFG, 4), 2),
    (ShardMap.even(CFG, 4), 1),
    (ShardMap.even(CFG, 5), 3),  # uneven healthy shards: 3, 3, 2, 2, 2 heads
    (
        ShardMap.from_units(
            CFG,
            [(0, 5, 7), (1, 2, 11), (3, 4, 6), (8, 9, 10)],
            [tuple(range(r, 192, 4)) for r in range(4)],
        ),
        3,
    ),
]


def test_degraded_map_of_tp4_on_3_ranks() -> None:
    degraded = degraded_shard_map(ShardMap.even(CFG, 4), 3)
    assert degraded.heads == ((0, 1, 2, 9), (3, 4, 5, 10), (6, 7, 8, 11))
    assert degraded.ffn[0][:50] == tuple(range(48)) + (144, 147)  # own, then every 3rd extra
    assert degraded.ffn_counts() == [64, 64, 64]
    assert reshard_routes(ShardMap.even(CFG, 4), degraded)[:2] == [
        Route(3, 0, "heads", (9,)),
        Route(3, 0, "ffn", tuple(range(144, 192, 3))),
    ]


@pytest.mark.parametrize(("healthy", "t"), MAPS)
def test_degraded_map_is_own_then_received(healthy: ShardMap, t: int) -> None:
    degraded = degraded_shard_map(healthy, t)
    routes = reshard_routes(healthy, degraded)
    assert degraded.tp == t and routes == sorted(routes, key=lambda r: (r.src, r.dst))
    for axis, total in (("heads", CFG.n_head), ("ffn", 4 * CFG.n_embd)):
        units = getattr(degraded, axis)
        assert sorted(u for rank in units for u in rank) == list(range(total))  # each unit once
        own = getattr(healthy, axis)
        extra = [u for rank in own[t:] for u in rank]
        for i in range(t):
            received = [u for r in routes if r.dst == i and r.axis == axis for u in r.units]
            assert units[i] == own[i] + tuple(received)
            assert list(received) == extra[i::t]  # round-robin, in extra-rank order
        for r in routes:
            if r.axis == axis:
                assert r.src >= t > r.dst and set(r.units) <= set(own[r.src])


@pytest.mark.parametrize(("healthy", "t"), MAPS)
def test_resharded_gradient_is_the_degraded_shard(healthy: ShardMap, t: int) -> None:
    """What makes the all-reduce one to one: a healthy core rank's own units plus what the extra
    ranks send it are, in order, exactly degraded rank i's shard of the same full tensor."""
    degraded = degraded_shard_map(healthy, t)
    routes = reshard_routes(healthy, degraded)
    shapes = {k: v.shape for k, v in GPT(CFG).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for name, spec in unit_specs(CFG).items():
        total = CFG.n_head if spec.axis == "heads" else 4 * CFG.n_embd
        full = torch.randn(shapes[f"blocks.0.{name}"], generator=g)

        def shard(m: ShardMap, r: int, spec=spec, full=full, total=total) -> torch.Tensor:
            return full.index_select(spec.dim, global_index(spec, getattr(m, spec.axis)[r], total))

        pieces = [
            split_by_unit(shard(healthy, r), spec, getattr(healthy, spec.axis)[r])
            for r in range(healthy.tp)
        ]
        for i in range(t):
            got = dict(pieces[i])
            for route in routes:
                if route.dst == i and route.axis == spec.axis:
                    got.update({u: pieces[route.src][u] for u in route.units})
            units = getattr(degraded, spec.axis)[i]
            assert torch.equal(join_units(got, spec, units), shard(degraded, i)), name


def test_degraded_map_and_route_errors() -> None:
    healthy = ShardMap.even(CFG, 4)
    with pytest.raises(ValueError, match=r"must be in \[1, 4\]"):
        degraded_shard_map(healthy, 0)
    with pytest.raises(ValueError, match=r"must be in \[1, 4\]"):
        degraded_shard_map(healthy, 5)
    with pytest.raises(ValueError, match="does not keep all its healthy heads"):
        reshard_routes(healthy, ShardMap.even(CFG, 3))  # rank 1 would own heads 4-7, not 3
    with pytest.raises(ValueError, match="at most as many ranks"):
        reshard_routes(ShardMap.even(CFG, 3), healthy)


# ---- batches and token weights -----------------------------------------------------------------
def test_local_batch_policies() -> None:
    assert local_batch(8, 3, 4, "keep") == 8
    assert local_batch(8, 3, 4, "scale") == 6
    assert local_batch(7, 3, 4, "scale") == 5  # floor(21 / 4)
    assert local_batch(2, 1, 8, "scale") == 1  # at least one sequence
    with pytest.raises(ValueError, match="Unknown batch policy 'boost'"):
        local_batch(8, 3, 4, "boost")
    with pytest.raises(ValueError, match="1 <= tp_active <= 4"):
        local_batch(8, 5, 4)


def test_token_weights() -> None:
    assert token_weights([4, 3]) == pytest.approx([4 / 7, 3 / 7])
    assert token_weights([5, 5, 5]) == pytest.approx([1 / 3] * 3)
    for bad in ([], [4, 0]):
        with pytest.raises(ValueError, match="positive batches"):
            token_weights(bad)


def test_token_weighted_replica_losses_are_the_global_mean() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    batches = [4, 3, 1]
    idx, tgt = global_batch(CFG, sum(batches), step=0)
    full = model(idx, tgt)[1]
    parts = [model(idx[s], tgt[s])[1] for s in replica_slices(batches)]
    weighted = sum(w * loss for w, loss in zip(token_weights(batches), parts, strict=True))
    torch.testing.assert_close(weighted, full, **FP32)
    assert abs(sum(parts) / 3 - full) > 1e-4  # plain averaging is a different objective


# ---- executed jobs on gloo ---------------------------------------------------------------------
STEPS = 3


def _max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in b)


def _check_job(results: list[dict], policy: str, steps: int) -> None:
    replica_rank0 = [r for r in results if r["tp_rank"] == 0]
    batches = results[0][policy]["batches"]
    reference = train_reference(CFG, batches, steps)
    for r in replica_rank0:  # every replica holds the single-process model
        torch.testing.assert_close(r[policy]["state"], reference, **FP32)
        assert all(
            torch.equal(r[policy]["state"][k], replica_rank0[0][policy]["state"][k])
            for k in reference
        )
    grads = [r[policy]["replicated_grads"] for r in results]  # bitwise equal on every rank
    assert all(torch.equal(g[k], grads[0][k]) for g in grads for k in grads[0])
    if len(set(batches)) > 1:  # the test must fail if the gradients were averaged unweighted
        plain = train_reference(CFG, batches, steps, weights=[1 / len(batches)] * len(batches))
        assert _max_rel_diff(plain, reference) > 1e3 * FP32["rtol"]


def test_ntp_job_matches_single_process() -> None:
    """7 processes: replica 0 at TP 4, replica 1 at TP 3 after losing TP rank 1 (physical rank
    5). Both batch policies in one job: "keep" (4 + 4 sequences) and "scale" (4 + 3)."""
    results = spawn(ntp_train_worker, 7, CFG, 4, 2, {1: [1]}, 4, STEPS, timeout_s=300)
    assert [(r["replica"], r["tp_rank"]) for r in results] == [(0, i) for i in range(4)] + [
        (1, i) for i in range(3)
    ]
    assert results[0]["keep"]["batches"] == [4, 4] and results[0]["scale"]["batches"] == [4, 3]
    for policy in ("keep", "scale"):
        _check_job(results, policy, STEPS)


@pytest.mark.slow
def test_ntp_job_with_two_extra_ranks_and_padding() -> None:
    """8 processes, 3 replicas of base TP 4: replica 2 loses TP ranks 0 and 2, so t' = 2;
    replica 1 loses only TP rank 1 and switches off TP rank 3 to match. Replica 0's two extra
    ranks both send to both core ranks."""
    failed = {1: [1], 2: [2, 0]}
    results = spawn(ntp_train_worker, 8, CFG, 4, 3, failed, 4, 2, ("scale",), timeout_s=300)
    assert [(r["replica"], r["tp_rank"]) for r in results][4:] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert results[0]["scale"]["batches"] == [4, 2, 2]
    _check_job(results, "scale", 2)
