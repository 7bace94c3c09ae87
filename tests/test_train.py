"""Tests for tutorial_lib.train: schedule, config checks, the step, accumulation, clipping,
checkpoints (atomic writes, exact resume) and the non-finite-loss guard."""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib import train as train_mod
from tutorial_lib.build import build_model
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.checkpoint.files import CheckpointError, save_checkpoint
from tutorial_lib.config import PRESETS, GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.model import GPT
from tutorial_lib.precision import POLICIES, PrecisionPolicy
from tutorial_lib.train import NonFiniteLossError, TrainConfig, Trainer, lr_at

ROW_KEYS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "peak_mem_bytes",
    "val_loss",
}


def _cfg(**overrides: Any) -> TrainConfig:
    base: dict[str, Any] = dict(
        steps=30, batch_size=8, lr=1e-2, warmup_steps=3, eval_every=0, progress=False
    )
    return TrainConfig(**{**base, **overrides})


def _trainer(
    model_cfg: GPTConfig, data: Any, cfg: TrainConfig, seed: int = 0, **kw: Any
) -> Trainer:
    torch.manual_seed(seed)
    return Trainer(GPT(model_cfg), data, cfg, device="cpu", **kw)


def _record_grads(trainer: Trainer) -> list[dict[str, torch.Tensor]]:
    """Make ``trainer.optimizer.step`` record a copy of every gradient it is about to apply."""
    seen: list[dict[str, torch.Tensor]] = []
    step = trainer.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        seen.append(
            {
                n: p.grad.detach().clone()
                for n, p in trainer.model.named_parameters()
                if p.grad is not None
            }
        )
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    return seen


def _global_norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))


# ---- schedule ------------------------------------------------------------------------------


def test_lr_warmup_is_linear_and_reaches_peak() -> None:
    cfg = TrainConfig(steps=50, lr=2e-3, warmup_steps=8, min_lr_ratio=0.1)
    warm = [lr_at(s, cfg) for s in range(8)]
    assert warm[0] == pytest.approx(2e-3 / 8)
    steps = [b - a for a, b in zip(warm, warm[1:], strict=False)]
    assert steps == pytest.approx([2e-3 / 8] * 7)  # equal increments: linear
    assert warm[-1] == pytest.approx(2e-3)  # the last warm-up step is at the peak
    assert lr_at(8, cfg) == pytest.approx(2e-3)  # and the cosine starts there


def test_lr_cosine_midpoint_and_end() -> None:
    cfg = TrainConfig(steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.2)
    # Half-way through the decay the cosine is at the mean of peak and floor.
    assert lr_at(60, cfg) == pytest.approx(0.5 * (1e-3 + 2e-4))
    # A quarter of the way: min + (peak - min) * (1 + cos(pi/4)) / 2.
    assert lr_at(35, cfg) == pytest.approx(2e-4 + 8e-4 * (1 + math.sqrt(0.5)) / 2)
    assert lr_at(110, cfg) == pytest.approx(2e-4)
    assert lr_at(10_000, cfg) == pytest.approx(2e-4)  # clamped after the run's end


def test_lr_without_warmup_starts_at_peak() -> None:
    cfg = TrainConfig(steps=20, lr=5e-4, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(0, cfg) == pytest.approx(5e-4)
    assert lr_at(20, cfg) == pytest.approx(0.0, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 400),
    warmup=st.integers(0, 60),
    lr=st.floats(1e-6, 1.0),
    ratio=st.floats(0.0, 1.0),
)
def test_lr_schedule_properties(steps: int, warmup: int, lr: float, ratio: float) -> None:
    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=warmup, min_lr_ratio=ratio)
    lrs = [lr_at(s, cfg) for s in range(steps + 5)]
    tol = 1e-12 * lr
    warm, decay = lrs[:warmup], lrs[warmup:]
    assert all(0 < x <= lr + tol for x in warm)
    assert all(b > a for a, b in zip(warm, warm[1:], strict=False))  # strictly rising
    assert all(lr * ratio - tol <= x <= lr + tol for x in decay)
    assert all(b <= a + tol for a, b in zip(decay, decay[1:], strict=False))  # never rising
    if decay:
        assert decay[0] == pytest.approx(lr)  # the decay starts at the peak
    if warmup < steps:  # a decay phase exists: it ends at the floor, at the run's last step
        assert lr_at(steps, cfg) == pytest.approx(lr * ratio)
        assert lr_at(steps - 1, cfg) >= lr * ratio - tol


# ---- config validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", 0),
        ("batch_size", 0),
        ("grad_accum", 0),
        ("eval_iters", 0),
        ("warmup_steps", -1),
        ("eval_every", -1),
        ("checkpoint_every", -2),
        ("lr", 0.0),
        ("lr", -1e-3),
        ("lr", float("nan")),
        ("min_lr_ratio", -0.1),
        ("min_lr_ratio", 1.5),
    ],
)
def test_train_config_rejects_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field if field != "lr" else "lr > 0"):
        TrainConfig(**{field: value})


def test_train_config_defaults_are_valid() -> None:
    cfg = TrainConfig()
    assert cfg.steps >= 1 and cfg.lr > 0 and cfg.precision == "fp32"


# ---- a short run ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_run(
    tiny_cfg: GPTConfig, data_factory: Callable[..., TokenData]
) -> tuple[Trainer, list[dict[str, Any]]]:
    """30 steps of the tiny model, validating every 7 steps (and at the end)."""
    cfg = _cfg(steps=30, eval_every=7, eval_iters=2)
    trainer = _trainer(tiny_cfg, data_factory(), cfg)
    return trainer, trainer.train()


def test_short_run_loss_falls(short_run: tuple[Trainer, list[dict[str, Any]]]) -> None:
    _, history = short_run
    losses = [r["loss"] for r in history]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(256), abs=0.3)  # near-uniform at init
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, (first, last)


def test_history_rows(short_run: tuple[Trainer, list[dict[str, Any]]]) -> None:
    trainer, history = short_run
    assert trainer.step == 30
    assert [r["step"] for r in history] == list(range(30))
    eval_steps = {6, 13, 20, 27, 29}  # after steps 7, 14, 21, 28 and at the end (30)
    for r in history:
        assert set(r) == ROW_KEYS
        assert r["lr"] == pytest.approx(lr_at(r["step"], trainer.cfg))
        assert r["step_time_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(trainer.tokens_per_step / r["step_time_s"])
        assert r["mfu"] is None  # no datasheet peak for a CPU
        assert r["peak_mem_bytes"] > 0
        assert r["grad_norm"] > 0 and math.isfinite(r["grad_norm"])
        if r["step"] in eval_steps:
            assert isinstance(r["val_loss"], float) and math.isfinite(r["val_loss"])
        else:
            assert r["val_loss"] is None, r["step"]


def test_tokens_per_step(tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(batch_size=5, grad_accum=3))
    assert trainer.tokens_per_step == 5 * 3 * tiny_cfg.block_size


# ---- gradient accumulation and clipping ----------------------------------------------------


class FixedBatches:
    """A stand-in for ``TokenData`` that hands out consecutive rows of fixed tensors."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y, self.block_size, self.pos = x, y, x.shape[1], 0

    def get_batch(
        self, split: str, batch_size: int, device: Any = "cpu", rows: slice | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        i, self.pos = self.pos, (self.pos + batch_size) % len(self.x)
        x, y = self.x[i : i + batch_size], self.y[i : i + batch_size]
        return (x, y) if rows is None else (x[rows], y[rows])

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


@pytest.mark.parametrize(("batch", "accum"), [(16, 1), (8, 2), (4, 4), (1, 16)])
def test_grad_accumulation_matches_big_batch(
    tiny_cfg: GPTConfig, tiny_data: TokenData, batch: int, accum: int
) -> None:
    x, y = tiny_data.get_batch("train", 16)
    # The reference: one plain forward/backward over all 16 sequences, outside the Trainer.
    torch.manual_seed(0)
    ref_model = GPT(tiny_cfg)
    _, ref_loss = ref_model(x, y)
    ref_loss.backward()
    ref = {n: p.grad for n, p in ref_model.named_parameters()}

    cfg = _cfg(batch_size=batch, grad_accum=accum, grad_clip=0.0)
    trainer = _trainer(tiny_cfg, FixedBatches(x, y), cfg, seed=0)
    seen = _record_grads(trainer)
    row = trainer.train_step()
    assert row["loss"] == pytest.approx(ref_loss.item(), rel=1e-5)
    assert row["grad_norm"] == pytest.approx(_global_norm(ref), rel=1e-4)
    assert set(seen[0]) == set(ref)
    for name, grad in seen[0].items():
        torch.testing.assert_close(grad, ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_grad_clip_bounds_the_applied_gradient(tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    clip = 1e-3
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(grad_clip=clip))
    seen = _record_grads(trainer)
    rows = [trainer.train_step() for _ in range(3)]
    for row, grads in zip(rows, seen, strict=True):
        assert row["grad_norm"] > 10 * clip  # the reported norm is the one before clipping
        assert _global_norm(grads) == pytest.approx(clip, rel=1e-3)  # clipped to the limit


def test_grad_clip_zero_disables_clipping(tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(grad_clip=0.0))
    seen = _record_grads(trainer)
    row = trainer.train_step()
    assert row["grad_norm"] > 0.1
    assert _global_norm(seen[0]) == pytest.approx(row["grad_norm"], rel=1e-5)


# ---- checkpoints: exact resume ---------------------------------------------------------------


def test_resume_reproduces_uninterrupted_run(
    tmp_path: Path, tiny_cfg: GPTConfig, data_factory: Callable[..., TokenData]
) -> None:
    model_cfg = dataclasses.replace(tiny_cfg, dropout=0.2)  # dropout: RNG state matters
    cfg = _cfg(steps=12, batch_size=4, eval_every=3, eval_iters=1)  # evals at 3, 6, 9, 12

    straight = _trainer(model_cfg, data_factory(), cfg, seed=0)
    full = straight.train()

    first = _trainer(model_cfg, data_factory(), cfg, seed=0)
    first.train(6)
    path = first.save(tmp_path / "ckpt.pt")
    del first

    # A fresh process-like start: other weights, a fresh sampler, a disturbed global RNG.
    resumed = _trainer(model_cfg, data_factory(), cfg, seed=1234)
    torch.manual_seed(999)
    resumed.resume(path)
    assert resumed.step == 6 and resumed.last_checkpoint == path
    history = resumed.train()

    assert len(history) == 12
    for a, b in zip(full, history, strict=True):
        assert a["step"] == b["step"]
        assert a["loss"] == b["loss"], a["step"]  # bit-identical, not approximately equal
        assert a["grad_norm"] == b["grad_norm"], a["step"]
        assert a["lr"] == b["lr"] and a["val_loss"] == b["val_loss"]
    for (name, p), q in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(p, q), name


def test_resume_without_rng_restore_diverges(
    tmp_path: Path,
    tiny_cfg: GPTConfig,
    data_factory: Callable[..., TokenData],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control for the test above: with dropout, skipping the RNG restore changes losses."""
    model_cfg = dataclasses.replace(tiny_cfg, dropout=0.2)
    cfg = _cfg(steps=4, batch_size=4)
    straight = _trainer(model_cfg, data_factory(), cfg)
    full = straight.train()
    first = _trainer(model_cfg, data_factory(), cfg)
    first.train(2)
    path = first.save(tmp_path / "ckpt.pt")
    resumed = _trainer(model_cfg, data_factory(), cfg)
    torch.manual_seed(999)
    monkeypatch.setattr(train_mod, "_set_rng_state", lambda state: None)
    resumed.resume(path)
    assert [r["loss"] for r in resumed.train()][2:] != [r["loss"] for r in full][2:]


def test_checkpoint_contents(tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=5), out_dir=tmp_path)
    trainer.train(3)  # train() saves at its target
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    for key in ("model", "optimizer", "schedule", "rng", "data", "step", "model_config"):
        assert key in state, key
    assert state["step"] == 3
    assert state["schedule"] == {"step": 3, "lr": lr_at(3, trainer.cfg)}
    assert set(state["data"]) == {"train", "val"}
    assert torch.equal(state["rng"]["torch"], torch.get_rng_state())
    assert len(state["optimizer"]["state"]) == len(list(trainer.model.parameters()))
    assert len(state["history"]) == 3


def test_load_rejects_other_model_config(
    tiny_cfg: GPTConfig, tiny_data: TokenData, tmp_path: Path
) -> None:
    path = _trainer(tiny_cfg, tiny_data, _cfg()).save(tmp_path / "checkpoint.pt")
    other = _trainer(dataclasses.replace(tiny_cfg, n_layer=3), tiny_data, _cfg())
    with pytest.raises(ValueError, match="model config differs"):
        other.resume(path)
    assert other.step == 0


def test_load_rejects_a_checkpoint_of_another_precision(
    tiny_cfg: GPTConfig, tiny_data: TokenData, tmp_path: Path
) -> None:
    path = _trainer(tiny_cfg, tiny_data, _cfg()).save(tmp_path / "checkpoint.pt")
    assert load_checkpoint(path)["model_recipe"]["precision"] == "fp32"
    bf16 = Trainer(build_model(tiny_cfg, precision="bf16"), tiny_data, _cfg(precision="bf16"))
    with pytest.raises(ValueError, match="trained in precision 'fp32'.*--precision fp32"):
        bf16.resume(path)
    assert bf16.step == 0


def test_preset_train_config_keeps_warmup_inside_the_run() -> None:
    preset = PRESETS["ci"]
    cfg = TrainConfig.from_preset(preset, steps=3, eval_every=0, precision="bf16")
    assert (cfg.steps, cfg.batch_size, cfg.lr) == (3, preset.batch_size, preset.lr)
    assert cfg.warmup_steps == min(preset.warmup_steps, 3) and cfg.eval_every == 0
    assert TrainConfig.from_preset(preset).steps == preset.steps
    with pytest.raises(TypeError):
        TrainConfig.from_preset(preset, compile=True)  # not a training setting: build_model's


def test_load_rejects_foreign_state(
    tiny_cfg: GPTConfig, tiny_data: TokenData, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg())
    path = save_checkpoint(tmp_path / "foreign.pt", {"model": trainer.model.state_dict()})
    with pytest.raises(ValueError, match="format"):
        trainer.resume(path)


def test_load_checkpoint_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        load_checkpoint(tmp_path / "nope.pt")


# ---- checkpoints: safe to open -------------------------------------------------------------
class _RunsCodeWhenUnpickled:
    """What a malicious checkpoint hides: unpickling it calls a function (here: mkdir)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def test_malicious_checkpoint_is_refused_and_runs_nothing(
    tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData
) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=1))
    marker = tmp_path / "code_ran"
    state = {
        **load_checkpoint(trainer.save(tmp_path / "good.pt")),
        "payload": _RunsCodeWhenUnpickled(marker),
    }
    bad = save_checkpoint(tmp_path / "shared.pt", state)  # a real torch.save archive
    with pytest.raises(
        CheckpointError, match=r"Refusing to open .*shared\.pt.* posix\.mkdir,"
    ) as info:
        load_checkpoint(bad)
    assert "add_safe_globals" not in str(info.value)  # no advice to allow-list the payload
    with pytest.raises(CheckpointError, match="arbitrary code"):
        trainer.resume(bad)
    with open(tmp_path / "raw.pt", "wb") as f:  # a plain pickle, not a torch.save archive
        pickle.dump(state, f)
    with pytest.raises(CheckpointError, match=r"raw\.pt is not a readable checkpoint"):
        load_checkpoint(tmp_path / "raw.pt")
    assert not marker.exists()  # nothing ran
    assert trainer.step == 0


def _damaged_archive(good: Path, bad: Path) -> None:
    """A whole zip whose pickle record is damaged (the protocol byte kept, the opcodes not)."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("data.pkl"):
                data = data[:2] + b"\xff\xfe\xfd" + data[5:]
            dst.writestr(item, data)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "damaged"])
def test_corrupt_checkpoint_names_the_file_and_the_fix(
    tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData, damage: str
) -> None:
    """Not a whole archive, or a whole one with damaged pickle data (corrupt, not unsafe)."""
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=1))
    good_path = trainer.save(tmp_path / "checkpoint.pt")
    good = good_path.read_bytes()
    bad = tmp_path / f"{damage}.pt"
    if damage == "damaged":
        _damaged_archive(good_path, bad)
    else:
        bad.write_bytes(
            {"truncated": good[: len(good) // 2], "garbage": b"garbage\n", "empty": b""}[damage]
        )
    with pytest.raises(
        CheckpointError,
        match=rf"{damage}\.pt is not a readable checkpoint.*"
        r"truncated or corrupt.*from a copy.*--force",
    ):
        load_checkpoint(bad)


def test_every_checkpoint_we_write_opens_safely(
    tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData
) -> None:
    """weights_only=True loads the whole state, optimizer, schedule, RNG, data and history."""
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=2, eval_every=1, eval_iters=1))
    trainer.train()
    path = trainer.save(tmp_path / "checkpoint.pt")
    assert torch.load(path, weights_only=True).keys() == {
        *trainer.run_state(),
        "model",
        "optimizer",
        "checksum",
    }


# ---- checkpoints: atomic writes ------------------------------------------------------------


def _torn_save(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
    f.write(b"PK\x03\x04 half a checkpoint")
    raise OSError("disk full")


@pytest.mark.parametrize("exc", [OSError, KeyboardInterrupt])
def test_save_checkpoint_is_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException]
) -> None:
    path = tmp_path / "ckpt" / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.arange(10)})
    before = path.read_bytes()

    def torn(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise exc("interrupted")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(exc):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(10)})
    monkeypatch.undo()

    assert path.read_bytes() == before  # the previous checkpoint is untouched
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]  # no temp files
    assert load_checkpoint(path)["step"] == 1


def test_save_checkpoint_failure_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "save", _torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})
    assert list(tmp_path.iterdir()) == []


def test_save_checkpoint_round_trip(tmp_path: Path) -> None:
    state = {"step": 7, "w": torch.randn(3, 5), "nested": {"x": [1, 2.5, None]}}
    path = save_checkpoint(tmp_path / "a" / "b.pt", state)
    assert path == tmp_path / "a" / "b.pt"
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.pt"]
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["nested"] == state["nested"]
    assert torch.equal(loaded["w"], state["w"])


# ---- non-finite loss -----------------------------------------------------------------------


def _nan_from_step(trainer: Trainer, bad_step: int) -> None:
    """From optimizer step ``bad_step`` on, the model's loss is NaN."""
    forward = trainer.model.forward

    def poisoned(idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        logits, loss = forward(idx, targets)
        if loss is not None and trainer.step >= bad_step:
            loss = loss * float("nan")
        return logits, loss

    trainer.model.forward = poisoned  # type: ignore[method-assign]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(
    tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData
) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=10, checkpoint_every=2), out_dir=tmp_path)
    _nan_from_step(trainer, 5)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train()
    err = info.value
    ckpt = tmp_path / "checkpoint.pt"
    assert err.step == 5 and math.isnan(err.loss)
    assert "step 5" in str(err) and str(ckpt) in str(err)
    assert err.checkpoint == ckpt
    state = load_checkpoint(ckpt)
    assert state["step"] == 4  # written after step 4; steps 5.. never reached the disk
    assert len(trainer.history) == 5 and trainer.step == 5
    # The bad step applied no update: the weights are finite and no gradient is left over.
    for p in trainer.model.parameters():
        assert torch.isfinite(p).all() and p.grad is None
    # The checkpoint is usable: a fresh trainer resumes from it.
    fresh = _trainer(tiny_cfg, tiny_data, _cfg(steps=10))
    fresh.resume(err.checkpoint)
    assert fresh.step == 4


def test_nan_loss_without_checkpoint(tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=3))
    _nan_from_step(trainer, 0)
    with pytest.raises(NonFiniteLossError, match="step 0.*No checkpoint") as info:
        trainer.train()
    assert info.value.checkpoint is None
    assert isinstance(info.value, RuntimeError)


def _nan_grad_at_step(trainer: Trainer, bad_step: int) -> None:
    """At optimizer step ``bad_step`` one gradient (final LayerNorm gain) is NaN; loss is fine."""
    weight = trainer.model.ln_f.weight
    weight.register_hook(lambda g: g * float("nan") if trainer.step == bad_step else g)


def test_nan_gradient_with_finite_loss_stops_before_the_update(
    tmp_path: Path, tiny_cfg: GPTConfig, tiny_data: TokenData
) -> None:
    """Clipping spreads one NaN gradient to every weight; the loss only shows it a step later,
    after a checkpoint of NaN weights could have been written. The guard must stop at once."""
    cfg = _cfg(steps=10, batch_size=4, checkpoint_every=1)
    trainer = _trainer(tiny_cfg, tiny_data, cfg, out_dir=tmp_path)
    _nan_grad_at_step(trainer, 3)
    with pytest.raises(NonFiniteLossError, match="gradient norm.*step 3") as info:
        trainer.train()
    assert math.isfinite(info.value.loss) and math.isnan(info.value.grad_norm)
    state = load_checkpoint(info.value.checkpoint)
    assert state["step"] == 3
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_loss_scaler_skips_a_nan_gradient_step(
    tiny_cfg: GPTConfig, tiny_data: TokenData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a grad scaler (the fp16 recipe) an inf/NaN gradient is normal: the scaler skips the
    step and lowers the scale; training goes on. Simulated on the CPU without autocast."""
    policy = PrecisionPolicy("test-scaled-fp32", "fp32 math with a grad scaler", grad_scaler=True)
    monkeypatch.setitem(POLICIES, policy.name, policy)
    trainer = _trainer(tiny_cfg, tiny_data, _cfg(steps=4, batch_size=4, precision=policy.name))
    assert trainer.scaler is not None
    _nan_grad_at_step(trainer, 2)
    trainer.train(2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    scale = trainer.scaler.get_scale()
    row = trainer.train_step()  # step 2: NaN gradient, skipped
    assert math.isnan(row["grad_norm"]) and math.isfinite(row["loss"])
    assert trainer.scaler.get_scale() < scale
    for p, q in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert math.isfinite(trainer.train_step()["loss"])  # and step 3 trains normally
