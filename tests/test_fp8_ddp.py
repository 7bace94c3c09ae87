"""FP8 state under DistributedDataParallel (issue 17, section 1): DDP's default
``broadcast_buffers=True`` must not copy rank 0's FP8 scaling buffers into the other ranks.

Two gloo ranks on the CPU run two FP8 steps of one ``FP8Linear`` under ``DDP(model)``, each rank
with its own data (rank 0's batch amaxes 8 then 1, rank 1's 2 then 3). Expected, as in TE (whose
scaling state DDP never sees): without amax reduction each rank keeps its own history and scales;
with it both hold the MAX-reduced amaxes. The control run shows the failure mode the handling
prevents: without the ignore list, rank 1 quantizes with rank 0's scale.
"""

from __future__ import annotations

from typing import Any

import pytest
import spawn_workers
import torch
from torch import nn

from tutorial_lib.fp8 import convert_to_fp8, exclude_fp8_from_ddp
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.parallel.launch import spawn

AMAXES = [[8.0, 1.0], [2.0, 3.0]]  # per rank, per step


def scale(amax: float) -> float:
    """E4M3's max over ``amax``, divided in float32 as the update does."""
    return (torch.tensor(448.0) / torch.tensor(amax)).item()


# name: (reduce_amax, exclude FP8 buffers from DDP's broadcast)
CASES = {"local": (False, True), "reduced": (True, True), "no_exclusion": (False, False)}


@pytest.fixture(scope="module")
def ranks() -> dict[str, list[dict[str, Any]]]:
    """Each case's per-rank results (one spawn of two gloo ranks)."""
    by_rank = spawn(spawn_workers.fp8_ddp_steps, 2, AMAXES, CASES, timeout_s=180)
    return {case: [result[case] for result in by_rank] for case in CASES}


def test_without_reduction_each_rank_keeps_its_own_state(ranks: dict[str, Any]) -> None:
    for rank, result in enumerate(ranks["local"]):
        first, second = AMAXES[rank]
        assert result["history"] == [0.0, 0.0, first, second]
        assert result["scale_used"] == [1.0, scale(first)]  # its own step-1 scale
        assert result["scale"] == [scale(max(first, second))]


def test_with_reduction_ranks_hold_the_reduced_amaxes(ranks: dict[str, Any]) -> None:
    reduced = [max(step) for step in zip(*AMAXES, strict=True)]  # [8, 3]
    for result in ranks["reduced"]:
        assert result["history"] == [0.0, 0.0, *reduced]
        assert result["scale_used"] == [1.0, scale(reduced[0])]
        assert result["scale"] == [scale(max(reduced))]


def test_control_ddp_broadcast_overwrites_rank_1(ranks: dict[str, Any]) -> None:
    """Without the ignore list, DDP copies rank 0's buffers into rank 1 before each forward: rank
    1's second step quantizes with rank 0's scale (448/8) and its history holds rank 0's amax."""
    rank1 = ranks["no_exclusion"][1]
    assert rank1["scale_used"] == [1.0, scale(8.0)]
    assert rank1["history"] == [0.0, 0.0, 8.0, 3.0]


def test_convert_to_fp8_fills_ddps_ignore_list() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 32))
    model._ddp_params_and_buffers_to_ignore = ["users.own"]  # type: ignore[assignment]
    convert_to_fp8(model, amax_history_len=4)
    names = exclude_fp8_from_ddp(model)  # again: idempotent
    assert len(names) == 12 and "2.fp8_amax_history_bwd" in names
    assert model._ddp_params_and_buffers_to_ignore == ["users.own", *names]
    outer = nn.ModuleDict({"inner": model})  # wrapping a parent: call it there
    exclude_fp8_from_ddp(outer)
    assert "inner.0.fp8_scale_fwd" in outer._ddp_params_and_buffers_to_ignore
    assert set(FP8Linear.FP8_STATE_BUFFERS) == {n for n, _ in FP8Linear(16, 16).named_buffers()}
