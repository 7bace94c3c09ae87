"""Tests for tutorial_lib.fp8.scaling: the recipe, the delayed-scaling update, state, reduction.

The update is checked bit for bit against ``naive_update`` below: a float64 loop, one element
at a time, that follows the rules of TE's ``delayed_scaling.cu`` as prose, with the final scale
rounded to float32 once. (Rounding a float64 quotient of two float32 numbers to float32 gives
the correctly rounded float32 quotient: 53 >= 2 * 24 + 2 bits, so the double rounding is
harmless.) The amax reduction runs for real on two gloo processes.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib.fp8 import E4M3, E5M2, DelayedScaling, update_amax_and_scale
from tutorial_lib.fp8.autocast import reduce_amax
from tutorial_lib.fp8.quantizers.base import tensor_amax
from tutorial_lib.fp8.scaling import (
    FLT_MAX,
    GEMM1_INPUT,
    GEMM1_OUTPUT,
    GEMM1_WEIGHT,
    GRAD_INPUT1,
    GRAD_OUTPUT1,
    Format,
    FP8ModuleState,
    ScalingMeta,
)

INF, NAN = math.inf, math.nan


def f32(x: float) -> float:
    """x rounded to float32 (overflow gives inf), back as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def min_algo(history: torch.Tensor) -> torch.Tensor:
    """TE's own test callable: the smallest amax in the history."""
    return history.min(dim=0).values


def first4_algo(history: torch.Tensor) -> torch.Tensor:
    return history[:4].amax(dim=0)


def naive_update(
    history: torch.Tensor,
    scale: torch.Tensor,
    fp8_max: float,
    margin: int,
    algo: str | Callable,
    reduced: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    length, n = history.shape
    h, s = history.double().tolist(), scale.double().tolist()
    r = None if reduced is None else reduced.double().tolist()
    scaled_max = fp8_max * 2.0**-margin
    currents = [r[j] if r is not None and r[j] != 0 else h[0][j] for j in range(n)]
    if callable(algo):  # TE's unfused path: the callable sees row 0 = current amax
        seen = history.clone()
        seen[0] = torch.tensor(currents, dtype=torch.float32)
        user = algo(seen).double().tolist()
    new_h = [[0.0] * n for _ in range(length)]
    new_s = [0.0] * n
    for j in range(n):
        col, current = [h[i][j] for i in range(length)], currents[j]
        rolls = callable(algo) or current != 0
        if rolls:
            col = [0.0] if length == 1 else [0.0, *col[2:], current]
        for i in range(length):
            new_h[i][j] = col[i]
        if callable(algo):
            amax = user[j]
        elif algo == "most_recent":
            amax = current
        else:
            amax = 0.0
            if current != 0:  # the window: old rows 1..L-1, then the current amax
                for v in [h[i][j] for i in range(1, length)] + [current]:
                    if not math.isnan(v) and v > amax:
                        amax = v
        new = f32(scaled_max / amax) if math.isfinite(amax) and amax > 0 else s[j]
        new_s[j] = FLT_MAX if math.isinf(new) else new
    return torch.tensor(new_h, dtype=torch.float32), torch.tensor(new_s, dtype=torch.float32)


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype == torch.float32 and actual.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    assert torch.equal(actual[~nan], expected[~nan])  # torch.equal: NaN never equals NaN
    assert torch.equal(actual.view(torch.int32), expected.view(torch.int32))


# ---- the recipe ----------------------------------------------------------------------------------
def test_recipe_mirrors_te_names_and_defaults() -> None:
    r = DelayedScaling()
    te_fields = [
        "margin",
        "fp8_format",
        "amax_history_len",
        "amax_compute_algo",
        "reduce_amax",
        "fp8_dpa",
        "fp8_mha",
    ]
    names = [f.name for f in dataclasses.fields(r)]
    assert [n for n in names if n in te_fields] == te_fields  # TE's names, in TE's order
    assert sorted(set(names) - set(te_fields)) == [  # TE's Float8CurrentScaling names; TE's
        "accumulation",  # ours: how the emulation sums (fp8.gemm), keyword-only
        "fp8_gemm_dgrad",  # delayed-scaling behaviour (the fields every Recipe has)
        "fp8_gemm_fprop",
        "fp8_gemm_wgrad",
    ]
    with pytest.raises(TypeError):  # keyword-only: no positional order to get wrong
        DelayedScaling(0)  # type: ignore[misc]
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (
        0,
        Format.HYBRID,
        1024,
        "max",
    )
    assert (r.reduce_amax, r.fp8_dpa, r.fp8_mha) == (True, False, False)
    assert (r.fp8_format.fwd, r.fp8_format.bwd) == (E4M3, E5M2)
    e4m3 = DelayedScaling(fp8_format=Format.E4M3)
    assert (e4m3.fp8_format.fwd, e4m3.fp8_format.bwd) == (E4M3, E4M3)
    assert (Format.HYBRID.fwd.max, Format.HYBRID.bwd.max) == (448, 57344)
    assert repr(Format.HYBRID) == "Format.HYBRID"
    assert DelayedScaling(amax_compute_algo=min_algo).amax_compute_algo is min_algo


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fp8_format": Format.E5M2}, ValueError, "E5M2 training is not supported.*HYBRID"),
        ({"fp8_format": "hybrid"}, TypeError, "Format"),
        ({"margin": -1}, ValueError, "margin"),
        ({"margin": 0.5}, ValueError, "margin"),
        ({"amax_history_len": 0}, ValueError, "amax_history_len"),
        ({"amax_compute_algo": "mean"}, ValueError, "'max', 'most_recent' or a callable"),
    ],
)
def test_recipe_validation(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        DelayedScaling(**kwargs)


def test_tensor_indices_match_te() -> None:
    assert (GEMM1_INPUT, GEMM1_WEIGHT, GEMM1_OUTPUT) == (0, 1, 2)
    assert (GRAD_OUTPUT1, GRAD_INPUT1) == (0, 1)


# ---- the update rule, by hand --------------------------------------------------------------------
def column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)[:, None]


def update(history: torch.Tensor, algo: str | Callable = "max", margin: int = 0, **kw):
    scale = kw.pop("scale", torch.ones(history.shape[1]))
    return update_amax_and_scale(history, scale, 448.0, margin, algo, **kw)


def test_roll_window_and_scale() -> None:
    h, s = update(column(3.0, 1.0, 2.0))  # row 0 = this step
    assert h[:, 0].tolist() == [0.0, 2.0, 3.0]  # row 1 <- row 2, last <- current, row 0 <- 0
    assert s.item() == f32(448 / 3)
    assert update(column(3.0, 1.0, 7.0))[1].item() == 64.0  # max over the whole window
    h1, s1 = update(column(5.0))  # L = 1: only the current amax
    assert h1.tolist() == [[0.0]] and s1.item() == f32(448 / 5)


def test_most_recent_and_margin() -> None:
    h, s = update(column(3.0, 1.0, 7.0), "most_recent", margin=1)
    assert h[:, 0].tolist() == [0.0, 7.0, 3.0]
    want = torch.tensor(224.0) / torch.tensor(3.0)  # REFERENCE.md's example: 74.66666412
    assert s.item() == want.item() == f32(224 / 3)


def test_zero_current_amax_changes_nothing() -> None:
    history = column(0.0, 9.0, 2.0)
    h, s = update(history, scale=torch.tensor([5.0]))
    assert torch.equal(h, history) and s.item() == 5.0  # the history is not even consulted
    h, s = update(column(-0.0, 9.0), scale=torch.tensor([5.0]))
    assert h[1, 0] == 9.0 and s.item() == 5.0  # -0 counts as zero


def test_reduced_amax_replaces_row0_where_nonzero() -> None:
    history = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.5, 0.0]])
    h, s = update(history, "most_recent", reduced_amax=torch.tensor([8.0, 0.0, 0.0]))
    assert h.tolist() == [[0.0, 0.0, 0.0], [8.0, 2.0, 0.0]]
    assert s.tolist() == [56.0, 224.0, 1.0]


def test_nan_inf_and_overflow() -> None:
    _, s = update(column(3.0, NAN, 2.0))  # fmaxf skips NaN
    assert s.item() == f32(448 / 3)
    h, s = update(column(NAN, 1.0), "most_recent", scale=torch.tensor([2.0]))
    assert math.isnan(h[1, 0]) and s.item() == 2.0  # NaN rolls in; the scale is kept
    assert update(column(INF, 1.0), scale=torch.tensor([2.0]))[1].item() == 2.0
    assert update(column(1e-40, 0.0))[1].item() == FLT_MAX  # 448 / 1e-40 overflows
    assert update(column(0.0), scale=torch.tensor([INF]))[1].item() == FLT_MAX


def test_callable_sees_current_row0_and_always_rolls() -> None:
    seen: list[torch.Tensor] = []

    def spy(history: torch.Tensor) -> torch.Tensor:
        seen.append(history.clone())
        history.fill_(-1.0)  # the callable gets a copy
        return history.new_full((history.shape[1],), 7.0)

    history = torch.tensor([[1.0], [2.0], [3.0]])
    h, s = update(history, spy, reduced_amax=torch.tensor([5.0]))
    assert seen[0][:, 0].tolist() == [5.0, 2.0, 3.0] and history[0, 0] == 1.0
    assert h[:, 0].tolist() == [0.0, 3.0, 5.0] and s.item() == 64.0
    h, _ = update(column(0.0, 2.0, 3.0), min_algo)  # TE's unfused path rolls even on zero
    assert h[:, 0].tolist() == [0.0, 3.0, 0.0]
    with pytest.raises(ValueError, match=r"shape \(1,\)"):
        update(history, lambda h: h)


def test_update_validates_inputs() -> None:
    with pytest.raises(ValueError, match="shape"):
        update_amax_and_scale(torch.zeros(4), torch.ones(1), 448.0, 0, "max")
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        update_amax_and_scale(torch.zeros(4, 3), torch.ones(2), 448.0, 0, "max")
    with pytest.raises(TypeError, match="float32"):
        update_amax_and_scale(
            torch.zeros(4, 1, dtype=torch.float64), torch.ones(1), 448.0, 0, "max"
        )
    with pytest.raises(ValueError, match="amax_compute_algo"):
        update_amax_and_scale(torch.zeros(4, 1), torch.ones(1), 448.0, 0, "avg")


# ---- the update rule, against the naive reference ------------------------------------------------
SPECIAL = [0.0, -0.0, INF, NAN, FLT_MAX, 2.0**-149, f32(1e-40), 2.0**-126, 1.0, 3.0, 448.0]
AMAX = st.one_of(
    st.sampled_from(SPECIAL + [57344.0, 1e-30, 1e30, 1e38]),
    st.floats(min_value=0.0, max_value=f32(1e38), width=32),
    st.floats(min_value=-4.0, max_value=0.0, width=32),  # not real amaxes, but defined
)
SCALE = st.one_of(
    st.sampled_from([1.0, 0.5, INF, FLT_MAX, NAN]), st.floats(f32(1e-30), f32(1e30), width=32)
)
ALGOS: dict[str, str | Callable] = {
    "max": "max",
    "most_recent": "most_recent",
    "min": min_algo,
    "first4": first4_algo,
}


@st.composite
def update_cases(draw: st.DrawFn) -> dict:
    length, n = draw(st.sampled_from([1, 2, 7, 1024])), draw(st.integers(1, 5))
    if length <= 7:
        flat = draw(st.lists(AMAX, min_size=length * n, max_size=length * n))
        history = torch.tensor(flat, dtype=torch.float32).reshape(length, n)
    else:  # a seeded random history with a few drawn specials
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
        history = torch.exp(torch.empty(length, n).uniform_(-80, 80, generator=g))
        history *= torch.rand(length, n, generator=g) > 0.1  # some steps saw nothing
        for _ in range(draw(st.integers(0, 4))):
            history[draw(st.integers(0, length - 1)), draw(st.integers(0, n - 1))] = draw(AMAX)
    history[0] = torch.tensor(draw(st.lists(AMAX, min_size=n, max_size=n)))
    reduced = draw(st.none() | st.lists(AMAX, min_size=n, max_size=n))
    return {
        "history": history,
        "scale": torch.tensor(draw(st.lists(SCALE, min_size=n, max_size=n)), dtype=torch.float32),
        "fp8_max": draw(st.sampled_from([448.0, 57344.0])),
        "margin": draw(st.integers(0, 3)),
        "algo": ALGOS[draw(st.sampled_from(sorted(ALGOS)))],
        "reduced": None if reduced is None else torch.tensor(reduced, dtype=torch.float32),
    }


@settings(max_examples=250, deadline=None)
@given(case=update_cases())
def test_update_is_bitwise_the_naive_reference(case: dict) -> None:
    args = (case["history"], case["scale"], case["fp8_max"], case["margin"], case["algo"])
    before = [t.clone() for t in args[:2]]
    got_h, got_s = update_amax_and_scale(*args, reduced_amax=case["reduced"])
    want_h, want_s = naive_update(*args, case["reduced"])
    assert_bitwise(got_h, want_h)
    assert_bitwise(got_s, want_s)
    assert all(
        torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(args[:2], before, strict=True)
    )


# ---- state ---------------------------------------------------------------------------------------
def record(meta: ScalingMeta, index: int, tensor: torch.Tensor) -> None:
    """What a delayed-scaling cast records: the tensor's amax folded into row 0."""
    meta.fold_amax(index, tensor_amax(tensor))


def test_fold_amax_keeps_the_step_maximum() -> None:
    meta = ScalingMeta.create(num_tensors=3, history_len=4)
    record(meta, GEMM1_INPUT, torch.tensor([1.0, -6.0, 2.0]))
    record(meta, GEMM1_INPUT, torch.tensor([5.0]))  # quantized twice: the larger stays
    record(meta, GEMM1_WEIGHT, torch.tensor([NAN, -3.0]).bfloat16())  # NaN skipped
    record(meta, GEMM1_OUTPUT, torch.tensor([INF, 1.0]))
    assert meta.amax_history[0].tolist() == [6.0, 3.0, INF]
    assert meta.amax_history[1:].eq(0).all()


@settings(max_examples=40, deadline=None)
@given(case=update_cases())
def test_meta_update_refreshes_scale_inv(case: dict) -> None:
    algo = case["algo"]
    recipe = DelayedScaling(margin=case["margin"], amax_compute_algo=algo)
    meta = ScalingMeta(
        case["history"].clone(), case["scale"].clone(), torch.ones_like(case["scale"])
    )
    history_view, scale_view = meta.amax_history, meta.scale
    meta.update(recipe, case["fp8_max"], reduced_amax=case["reduced"])
    want_h, want_s = naive_update(
        case["history"], case["scale"], case["fp8_max"], case["margin"], algo, case["reduced"]
    )
    assert meta.amax_history is history_view and meta.scale is scale_view  # updated in place
    assert_bitwise(meta.amax_history, want_h)
    assert_bitwise(meta.scale, want_s)
    want_inv = torch.tensor([f32(1.0 / v) for v in want_s.double().tolist()])
    assert_bitwise(meta.scale_inv, want_inv)


def fresh_state(recipe: DelayedScaling) -> FP8ModuleState:
    """One GEMM's state (3 forward, 2 backward tensors), as a fresh FP8Linear holds it."""
    length = recipe.amax_history_len
    return FP8ModuleState(ScalingMeta.create(3, length), ScalingMeta.create(2, length))


def test_module_state_formats() -> None:
    recipe = DelayedScaling(amax_history_len=16)
    state = fresh_state(recipe)
    record(state.forward, GEMM1_INPUT, torch.tensor([2.0]))
    record(state.backward, GRAD_OUTPUT1, torch.tensor([2.0]))
    state.update(recipe, forward=True)
    state.update(recipe, forward=False)
    assert state.forward.scale.tolist() == [224.0, 1.0, 1.0]  # E4M3 forward
    assert state.backward.scale.tolist() == [28672.0, 1.0]  # E5M2 backward under HYBRID
    e4m3 = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=16)
    record(state.backward, GRAD_OUTPUT1, torch.tensor([2.0]))
    state.update(e4m3, forward=False)
    assert state.backward.scale[0].item() == 224.0


# ---- amax reduction ------------------------------------------------------------------------------
def test_reduce_amax_without_process_group_is_a_copy() -> None:
    assert not dist.is_initialized()
    t = torch.tensor([1.0, 2.0])
    out = reduce_amax(t)
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()


def _gloo_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        local = torch.tensor([1.0 + rank, 5.0 - rank, 0.0, 2.0 * rank])
        singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
        recipe = DelayedScaling(amax_history_len=4)
        state = fresh_state(recipe)
        record(state.forward, GEMM1_INPUT, torch.full((8,), 3.0 * (rank + 1)))
        reduced = reduce_amax(state.forward.amax_history[0])
        state.update(recipe, forward=True, reduced_amax=reduced)
        result = {
            "world": reduce_amax(local),
            "alone": reduce_amax(local, group=singles[rank]),
            "local": local,
            "scale": state.forward.scale,
            "history": state.forward.amax_history,
        }
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_reduce_amax_on_two_gloo_processes(tmp_path: Path) -> None:
    # fork where available: a spawned child re-imports torch (about 5 s on busy cores)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    args = (2, str(tmp_path / "init"), str(tmp_path))
    torch.multiprocessing.start_processes(_gloo_worker, args, nprocs=2, start_method=method)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for rank, res in enumerate(results):
        assert res["world"].tolist() == [2.0, 5.0, 0.0, 2.0]  # elementwise MAX over ranks
        assert torch.equal(res["alone"], res["local"])  # a one-rank group: identity
        assert res["local"].tolist() == [1.0 + rank, 5.0 - rank, 0.0, 2.0 * rank]  # untouched
        assert res["scale"].tolist() == [f32(448 / 6), 1.0, 1.0]  # both ranks: the max amax 6
        assert res["history"][-1].tolist() == [6.0, 0.0, 0.0]
