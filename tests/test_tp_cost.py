"""Tests for ``cluster.tp_traffic``: the TP communication model against hand-computed numbers."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from tutorial_lib.cluster.tp_traffic import (
    ALLREDUCE_ALGORITHMS,
    LINKS,
    allreduce_bytes,
    allreduce_factor,
    link_ridge,
    ridge_degree,
    ridge_width,
    tp_layer_comm_bytes,
    tp_layer_flops,
    tp_layer_times,
    tp_network_intensity,
)
from tutorial_lib.cluster.tp_traffic_viz import plot_allreduce_ridge
from tutorial_lib.hardware import SPECS

NVLINK, IB = LINKS["NVLink 4 (H100/H200 SXM)"], LINKS["InfiniBand NDR (one 400 Gb/s port per GPU)"]


def test_ring_allreduce_by_hand() -> None:
    assert allreduce_bytes(1000.0, 1) == 0.0
    assert allreduce_bytes(1000.0, 4) == 1500.0  # 2 * 1000 * 3/4
    with pytest.raises(ValueError, match="ranks"):
        allreduce_bytes(1.0, 0)


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


@pytest.mark.parametrize("t", [2, 3, 4, 8, 16, 72])
def test_nvls_sends_the_buffer_once_the_ring_about_twice(t: int) -> None:
    assert allreduce_factor(t, "ring") == pytest.approx(2 * (t - 1) / t)
    assert allreduce_factor(t, "nvls") == 1.0
    # Equal at t = 2 (the ring's two steps each move half the buffer); the ring's 2(t-1)/t
    # tends to 2, so NVLS approaches half the ring's bytes.
    ratio = allreduce_factor(t, "ring") / allreduce_factor(t, "nvls")
    assert ratio == pytest.approx(2 - 2 / t) and 1 <= ratio < 2
    assert allreduce_bytes(1000.0, t) == pytest.approx(1000.0 * 2 * (t - 1) / t)
    assert allreduce_bytes(1000.0, t, "nvls") == 1000.0


def test_one_rank_communicates_nothing_with_either_algorithm() -> None:
    h100 = SPECS["H100 SXM"]
    for algorithm in ALLREDUCE_ALGORITHMS:
        assert allreduce_factor(1, algorithm) == 0.0
        assert tp_layer_comm_bytes(2, 64, 1024, 1, algorithm=algorithm) == 0.0
        assert tp_network_intensity(1024, 1, algorithm=algorithm) == math.inf
        assert ridge_width(h100, NVLINK, 1, algorithm=algorithm) == 0.0
        assert tp_layer_times(1, 64, 1024, 1, h100, NVLINK, algorithm=algorithm)["comm_s"] == 0
    with pytest.raises(ValueError, match="algorithm must be one of"):
        allreduce_factor(4, "tree")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        ridge_degree(4096, h100, NVLINK, algorithm="tree")


def test_nvls_intensity_is_flops_over_bytes() -> None:
    b, s, h, t = 2, 64, 1024, 8
    sent = tp_layer_comm_bytes(b, s, h, t, algorithm="nvls")
    assert sent == pytest.approx(4 * b * s * h * 2)  # four all-reduces, each buffer once
    assert tp_network_intensity(h, t, algorithm="nvls") == pytest.approx(
        tp_layer_flops(b, s, h, t) / sent
    )
    assert tp_network_intensity(h, t, algorithm="nvls") == pytest.approx(18 * h / (t * 2))


def test_ridge_moves_towards_narrower_layers_and_higher_degrees_with_nvls() -> None:
    h100 = SPECS["H100 SXM"]
    ridge = link_ridge(h100, NVLINK)  # the link's ridge itself does not depend on the algorithm
    for t in (2, 4, 8, 16):
        ring, nvls = (ridge_width(h100, NVLINK, t, algorithm=a) for a in ALLREDUCE_ALGORITHMS)
        assert ring == pytest.approx(ridge * (t - 1) * 2 / 9)  # the chapter's formula
        assert nvls == pytest.approx(ridge * t / 9)
        assert nvls <= ring if t == 2 else nvls < ring  # the same at t = 2
        for algorithm, width in (("ring", ring), ("nvls", nvls)):  # on the ridge there
            assert tp_network_intensity(round(width) + 1, t, algorithm=algorithm) > ridge
            assert tp_network_intensity(round(width) - 1, t, algorithm=algorithm) < ridge
    for h in (1024, 4096, 16384):
        ring_t = ridge_degree(h, h100, NVLINK)
        nvls_t = ridge_degree(h, h100, NVLINK, algorithm="nvls")
        assert nvls_t > ring_t > 1
        # There, the intensity (continued to real t) equals the ridge.
        assert 9 * h / ((ring_t - 1) * 2) == pytest.approx(ridge)
        assert 18 * h / (nvls_t * 2) == pytest.approx(ridge)
        t = math.floor(ring_t)  # the widest whole degree still above the ridge
        assert tp_network_intensity(h, t) >= ridge > tp_network_intensity(h, t + 1)
    assert ridge_degree(1, h100, NVLINK, algorithm="nvls") == 1.0  # too narrow: clamped at 1


def test_nvls_exposes_less_of_the_layer() -> None:
    h100 = SPECS["H100 SXM"]
    ring = tp_layer_times(1, 4096, 8192, 8, h100, NVLINK)
    nvls = tp_layer_times(1, 4096, 8192, 8, h100, NVLINK, algorithm="nvls")
    assert nvls["compute_s"] == ring["compute_s"]
    assert ring["comm_s"] == pytest.approx(1.75 * nvls["comm_s"])
    assert nvls["exposed_fraction"] < ring["exposed_fraction"]


def test_ridge_figure_draws_both_algorithms() -> None:
    fig = plot_allreduce_ridge(
        SPECS["H100 SXM"], NVLINK, hiddens=(1024, 4096), degrees=range(2, 17), hardware="model"
    )
    left, right = fig.axes
    assert len(left.lines) == 2 * 2 + 1  # ring and NVLS per width, plus the ridge
    assert [line.get_linestyle() for line in right.lines] == ["-", "--"]
    legend = right.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == [
        "ring all-reduce",
        "NVLS (in-switch sum)",
    ]
    assert "TP degree" in left.get_xlabel() and "FLOPs per byte" in left.get_ylabel()
    ring, nvls = (np.asarray(line.get_ydata(), dtype=float) for line in right.lines)
    assert nvls[-1] < ring[-1]  # NVLS needs narrower layers
    plt.close(fig)
