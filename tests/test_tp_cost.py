"""Tests for ``cluster.tp_traffic``: the TP communication model against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from tutorial_lib.cluster.tp_traffic import (
    LINKS,
    link_ridge,
    ring_allreduce_bytes,
    ring_allreduce_time,
    tp_layer_comm_bytes,
    tp_layer_flops,
    tp_layer_times,
    tp_network_intensity,
)
from tutorial_lib.hardware import SPECS

NVLINK, IB = LINKS["NVLink 4 (H100/H200 SXM)"], LINKS["InfiniBand NDR (one 400 Gb/s port per GPU)"]


def test_ring_allreduce_by_hand() -> None:
    assert ring_allreduce_bytes(1000.0, 1) == 0.0
    assert ring_allreduce_bytes(1000.0, 4) == 1500.0  # 2 * 1000 * 3/4
    assert ring_allreduce_time(1000.0, 4, 500.0) == 3.0
    with pytest.raises(ValueError, match="ranks"):
        ring_allreduce_bytes(1.0, 0)


def test_layer_bytes_match_narayanan_8bsh() -> None:
    b, s, h, t = 3, 7, 11, 4
    # 8 b s h (t - 1) / t elements per rank and layer, in BF16 (2 bytes).
    assert tp_layer_comm_bytes(b, s, h, t) == pytest.approx(8 * b * s * h * (t - 1) / t * 2)
    assert tp_layer_comm_bytes(b, s, h, t, backward=False) == pytest.approx(
        tp_layer_comm_bytes(b, s, h, t) / 2
    )
    assert tp_layer_comm_bytes(b, s, h, 1) == 0.0


def test_intensity_is_flops_over_bytes() -> None:
    b, s, h, t = 2, 64, 1024, 8
    ratio = tp_layer_flops(b, s, h, t) / tp_layer_comm_bytes(b, s, h, t)
    assert tp_network_intensity(h, t) == pytest.approx(ratio)
    assert tp_network_intensity(h, 1) == math.inf


def test_links_and_ridges_from_the_datasheets() -> None:
    assert NVLINK.bandwidth == 450e9 and IB.bandwidth == 50e9
    h100 = SPECS["H100 SXM"]
    assert link_ridge(h100, NVLINK) == pytest.approx(989.5e12 / 450e9)
    assert link_ridge(h100, IB) == pytest.approx(9 * link_ridge(h100, NVLINK))
    with pytest.raises(ValueError, match="no fp8 peak"):
        link_ridge(SPECS["A100"], NVLINK, "fp8")


def test_layer_times_slower_link_exposes_more() -> None:
    h100 = SPECS["H100 SXM"]
    nv = tp_layer_times(1, 4096, 8192, 8, h100, NVLINK)
    ib = tp_layer_times(1, 4096, 8192, 8, h100, IB)
    assert nv["compute_s"] == ib["compute_s"]
    assert ib["comm_s"] == pytest.approx(9 * nv["comm_s"])
    assert 0 < nv["exposed_fraction"] < ib["exposed_fraction"] < 1
