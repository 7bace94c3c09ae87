"""The helpers the chapters call instead of repeating code: setup_chapter, run_training and
fp8.ScaleTrace."""

from __future__ import annotations

import matplotlib as mpl
import pytest
import torch

import tutorial_lib as tl
from tutorial_lib import fp8, viz


def test_setup_chapter_labels_what_the_numbers_are(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mpl.rcParams.update(mpl.rcParamsDefault)
    monkeypatch.setenv("TUTORIAL_PRESET", "hopper")
    assert tl.setup_chapter("measured", device="cpu").preset.name == "hopper"
    monkeypatch.setenv("TUTORIAL_PRESET", "ci")
    preset, device, hw, label = tl.setup_chapter("measured", device="cpu")
    assert device == torch.device("cpu") and preset.name == "ci"
    assert label.startswith(f"measured on {hw.name}, ") and label.endswith(f"preset {preset.name}")
    assert capsys.readouterr().out.startswith("hardware: ")
    styled = mpl.RcParams(viz.BOOK_STYLE)  # validated as matplotlib stores them
    assert all(mpl.rcParams[k] == styled[k] for k in viz.BOOK_STYLE)  # the book's style
    simulated = tl.setup_chapter("simulated", device="cpu").label
    assert simulated.startswith("simulation (a model, not a measurement), ")
    assert hw.name not in simulated


def test_setup_chapter_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="'timed' is not one of"):
        tl.setup_chapter("timed")


def _train_cfg(steps: int, precision: str = "fp32") -> tl.TrainConfig:
    return tl.TrainConfig(
        steps=steps,
        batch_size=2,
        lr=1e-3,
        warmup_steps=1,
        eval_every=0,
        precision=precision,
        progress=False,
    )


def test_run_training_is_reproducible_and_calls_back_every_step() -> None:
    cfg = tl.get_preset("ci").model_config()
    seen: list[int] = []
    a = tl.run_training(
        cfg, _train_cfg(3), device="cpu", on_step=lambda t, row: seen.append(t.step)
    )
    b = tl.run_training(cfg, _train_cfg(3), device="cpu")
    assert seen == [1, 2, 3]
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]
    c = tl.run_training(cfg, _train_cfg(3), device="cpu", seed=1)  # other initial weights
    assert c.history[0]["loss"] != a.history[0]["loss"]


def test_scale_trace_records_one_row_per_step_and_names_wrong_layers() -> None:
    cfg = tl.get_preset("ci").model_config()
    trace = fp8.ScaleTrace("blocks.0.mlp.fc")
    trainer = tl.run_training(cfg, _train_cfg(2, "fp8"), device="cpu", on_step=trace)
    assert len(trace.rows) == 2
    state = dict(trainer.model.named_modules())["blocks.0.mlp.fc"].fp8_state
    assert trace.series("scale_fwd", 1)[-1] == float(state.forward.scale[1])
    assert trace.series("scale_bwd")[-1] == float(state.backward.scale[0])
    window = state.forward.amax_history[1:].max(0).values  # what the next update reads
    assert trace.series("amax_fwd", 0)[-1] == float(window[0]) > 0
    with pytest.raises(ValueError, match="'lm_head' is not an FP8 layer"):
        fp8.ScaleTrace("lm_head")(trainer)
