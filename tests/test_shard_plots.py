"""Tests for ``parallel.shard_plots``: the shard-map figure shows each unit in its owner's colour."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tutorial_lib.config import GPTConfig  # noqa: E402
from tutorial_lib.parallel.ntp import degraded_shard_map  # noqa: E402
from tutorial_lib.parallel.shard import ShardMap  # noqa: E402
from tutorial_lib.parallel.shard_plots import plot_shard_maps, rank_colors, unit_owners  # noqa: E402

CFG = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=6, n_embd=12)  # FFN 48
ROUND_ROBIN = ShardMap.from_units(
    CFG, [(0, 3), (1, 4), (2, 5)], [range(r, 48, 3) for r in range(3)]
)


@pytest.fixture(autouse=True)
def isolated_style() -> Iterator[None]:
    with mpl.rc_context():
        yield
    plt.close("all")


def test_unit_owners_inverts_the_map() -> None:
    np.testing.assert_array_equal(unit_owners(ROUND_ROBIN, "heads"), [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(unit_owners(ShardMap.even(CFG, 4), "heads"), [0, 0, 1, 1, 2, 3])
    assert unit_owners(ROUND_ROBIN, "ffn")[:7].tolist() == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="axis must be one of"):
        unit_owners(ROUND_ROBIN, "rows")


def test_figure_has_a_row_per_map_and_the_owners_as_images() -> None:
    healthy = ShardMap.even(CFG, 4)
    maps = {"healthy": healthy, "degraded": degraded_shard_map(healthy, 3), "rr": ROUND_ROBIN}
    fig = plot_shard_maps(maps, title="Maps", note="a note")
    assert len(fig.axes) == 2 * len(maps)
    assert fig._suptitle.get_text() == "Maps"
    for row, (name, shard_map) in enumerate(maps.items()):
        heads_ax, ffn_ax = fig.axes[2 * row], fig.axes[2 * row + 1]
        assert heads_ax.get_ylabel() == name
        for ax, axis in ((heads_ax, "heads"), (ffn_ax, "ffn")):
            (image,) = ax.get_images()
            np.testing.assert_array_equal(image.get_array()[0], unit_owners(shard_map, axis))
        # rank numbers written into the head cells
        assert [t.get_text() for t in heads_ax.texts] == [
            str(r) for r in unit_owners(shard_map, "heads")
        ]
    assert "index" in fig.axes[-2].get_xlabel() and "FFN" in fig.axes[-1].get_xlabel()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"TP rank {r}" for r in range(4)]
    assert any(t.get_text() == "a note" for t in fig.texts)


def test_rank_keeps_its_colour_across_maps() -> None:
    fig = plot_shard_maps({"tp2": ShardMap.even(CFG, 2), "tp3": ROUND_ROBIN})
    colors = rank_colors(3)
    for ax in fig.axes[::2]:
        image = ax.get_images()[0]
        for unit, rank in enumerate(image.get_array()[0]):
            assert tuple(image.to_rgba(rank)) == pytest.approx(colors[rank]), unit


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least one shard map"):
        plot_shard_maps({})
    with pytest.raises(ValueError, match="Cannot colour 21 ranks"):
        rank_colors(21)
