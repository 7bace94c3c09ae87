"""The book's estimated time on one H200 (``tutorial_lib.book_cost``): the hopper preset fits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tutorial_lib import book_cost
from tutorial_lib.book_cost import BOOK_BUDGET_S, Work, book_work, estimate_book, format_estimate
from tutorial_lib.config import get_preset
from tutorial_lib.model import GPT

CHAPTERS = Path(__file__).resolve().parents[1] / "book" / "chapters"


def test_the_hopper_preset_fits_the_budget(record_property) -> None:
    hopper = get_preset("hopper")
    per = estimate_book(hopper)
    assert sum(per.values()) <= BOOK_BUDGET_S, format_estimate(hopper)
    record_property("report", f"book at the hopper preset: {format_estimate(hopper)}")


def test_every_chapter_is_estimated() -> None:
    chapters = {p.name[:2] for p in CHAPTERS.glob("*.ipynb")}
    assert set(estimate_book(get_preset("hopper"))) == chapters


def test_a_step_costs_its_flops_at_the_stated_rate() -> None:
    cfg = get_preset("hopper").model_config()
    model = GPT(cfg)  # the model's own FLOP count, independently of book_cost's call
    flops = model.flops_per_token(training=True) * 8 * cfg.block_size
    rate = book_cost.H200_BF16_GEMM * book_cost.STEP_EFFICIENCY
    assert abs(Work("01", "x", "bf16", 10, 8).cost(cfg) - 10 * flops / rate) < 1e-9
    fp32 = Work("01", "x", "fp32", 10, 8).cost(cfg)
    assert abs(fp32 - 10 * flops / (rate * 67 / 989.5)) < 1e-6  # the datasheet FP32/BF16 ratio
    assert Work("07", "x", seconds=12.5).cost(cfg) == 12.5


def test_the_estimate_follows_the_preset() -> None:
    """More steps cost more, in the chapters that run them (the work is read from the preset)."""
    hopper = get_preset("hopper")
    longer = dataclasses.replace(hopper, recipe_steps=2 * hopper.recipe_steps)
    base, more = estimate_book(hopper), estimate_book(longer)
    assert more["06"] > base["06"] and {k for k in base if more[k] != base[k]} == {"06"}
    step = Work("06", "x", "bf16", 1, hopper.parity_batch_size).cost(hopper.model_config())
    assert more["06"] - base["06"] > 5 * hopper.recipe_steps * step  # BF16 + 4 native + 2 emulated


def test_the_notebooks_run_what_the_estimate_assumes() -> None:
    """Each preset field the estimate prices is the one the chapter's cells read."""
    used = {
        "01": ["preset.steps", "preset.batch_size"],
        "03": ["preset.parity_steps", "preset.parity_batch_size"],
        "04": ["min(preset.steps, 30)"],
        "05": ["preset.parity_steps", "preset.parity_batch_size"],
        "06": ["preset.recipe_steps", "preset.parity_batch_size"],
        "07": ["preset.bench_batch_size", "preset.bench_iters"],
    }
    for chapter, fields in used.items():
        (path,) = CHAPTERS.glob(f"{chapter}_*.ipynb")
        source = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        for field in fields:
            assert field in source, f"chapter {chapter} no longer reads {field}"
    assert {w.chapter for w in book_work(get_preset("hopper")) if w.steps} == {
        "01", "02", "03", "04", "05", "06", "07", "08",
    }  # fmt: skip
