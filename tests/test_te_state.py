"""Transformer Engine's FP8 ``_extra_state`` without pickle (issue 17, section 1), on the CPU and
without TE: the converter against TE-format dicts built by hand from TE's source
(``get_extra_state`` in ``pytorch/module/base.py``, TE 2.9 and 2.20), and checkpoints of a model
holding a stand-in TE module whose extra state is pickled and guarded as TE >= 2.18's is."""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tutorial_lib.checkpoint import load_checkpoint, load_model_state_dict, model_state_dict
from tutorial_lib.checkpoint.files import CheckpointError, save_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8 import DelayedScaling
from tutorial_lib.fp8.scaling import Format, FP8ModuleState, ScalingMeta
from tutorial_lib.fp8.te_state import (
    TE_STATE_FORMAT,
    TE_UNSAFE_PICKLE_ENV,
    from_te_extra_state,
    te_extra_state,
    to_te_extra_state,
)
from tutorial_lib.model import GPT
from tutorial_lib.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
L = 4  # history length


# ---- a stand-in for TE's recipe and a TE module (the parts the extra state touches) ----------
class _TEFormat(enum.Enum):
    E4M3 = 448.0
    HYBRID = (448.0, 57344.0)


@dataclass
class _TEDelayedScaling:
    margin: int = 0
    fp8_format: _TEFormat = _TEFormat.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    reduce_amax: bool = True

    @classmethod
    def delayed(cls) -> bool:
        return True


class _TELinear(nn.Linear):
    """``fp8_meta``, ``init_fp8_meta_tensors`` and extra state as in TE's base module: the extra
    state is a pickled uint8 tensor, and loading a non-empty one is refused unless the opt-in
    variable is set (TE >= 2.18, ``_extra_state.should_load_extra_state_pickle``)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.fp8_meta: dict[str, Any] = {"fp8_checkpoint": False, "fp8_group": None}

    def init_fp8_meta_tensors(self, recipe: _TEDelayedScaling) -> None:
        n = self.fp8_meta["num_gemms"]
        for key, per_gemm in (("scaling_fwd", 3), ("scaling_bwd", 2)):
            self.fp8_meta[key] = types.SimpleNamespace(
                scale=torch.ones(per_gemm * n),
                amax_history=torch.zeros(recipe.amax_history_len, per_gemm * n),
            )

    def get_extra_state(self) -> torch.Tensor:
        if "recipe" not in self.fp8_meta:
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": self.fp8_meta["recipe"]}
        for d in ("fwd", "bwd"):
            state[f"scale_{d}"] = self.fp8_meta[f"scaling_{d}"].scale.clone()
            state[f"amax_history_{d}"] = self.fp8_meta[f"scaling_{d}"].amax_history.clone()
        state["extra_fp8_variables"] = {
            k: v
            for k, v in self.fp8_meta.items()
            if isinstance(v, bool | int | float | str | tuple | list)
        }
        return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, torch.Tensor):
            raise RuntimeError("Unsupported checkpoint format.")
        if state.numel() == 0:
            return
        if os.environ.get(TE_UNSAFE_PICKLE_ENV) != "1":
            raise RuntimeError("Refusing to load pickled Transformer Engine extra state.")
        loaded = pickle.loads(state.numpy().tobytes())
        self.fp8_meta.update(loaded["extra_fp8_variables"])
        self.fp8_meta["recipe"] = loaded["recipe"]
        self.init_fp8_meta_tensors(loaded["recipe"])
        for d in ("fwd", "bwd"):
            self.fp8_meta[f"scaling_{d}"].scale.copy_(loaded[f"scale_{d}"])
            self.fp8_meta[f"scaling_{d}"].amax_history.copy_(loaded[f"amax_history_{d}"])

    def fake_fp8_run(self, seed: int) -> None:
        """Leave the state a few FP8 steps would: TE's recipe, history, scales."""
        self.fp8_meta.update(
            num_gemms=1, fp8_checkpoint=True, fp8_max_fwd=448.0, fp8_max_bwd=57344.0
        )
        self.fp8_meta["recipe"] = _TEDelayedScaling(margin=1, amax_history_len=L)
        self.init_fp8_meta_tensors(self.fp8_meta["recipe"])
        g = torch.Generator().manual_seed(seed)
        for d in ("fwd", "bwd"):
            meta = self.fp8_meta[f"scaling_{d}"]
            meta.amax_history.copy_(torch.rand(meta.amax_history.shape, generator=g) * 10)
            meta.scale.copy_(448.0 / meta.amax_history.amax(0).clamp(min=1e-3))


@pytest.fixture
def te_recipe_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Just enough ``transformer_engine`` for ``te_recipe`` (TE's DelayedScaling from ours)."""
    root, common = types.ModuleType("transformer_engine"), types.ModuleType("_common")
    pytorch, recipe = types.ModuleType("_pytorch"), types.ModuleType("_recipe")
    recipe.DelayedScaling, recipe.Format = _TEDelayedScaling, _TEFormat
    for name, module in {
        "transformer_engine": root,
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": recipe,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    yield


def _te_format_dict() -> dict[str, Any]:
    """What TE's ``get_extra_state`` pickles for a ``te.Linear`` (one GEMM), built by hand."""
    g = torch.Generator().manual_seed(7)
    return {
        "recipe": _TEDelayedScaling(2, _TEFormat.E4M3, L, "most_recent", False),
        "scale_fwd": torch.rand(3, generator=g) * 100,
        "amax_history_fwd": torch.rand(L, 3, generator=g),
        "scale_bwd": torch.rand(2, generator=g) * 100,
        "amax_history_bwd": torch.rand(L, 2, generator=g),
        "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True, "fp8_max_fwd": 448.0},
    }


# ---- the converter ---------------------------------------------------------------------------
def test_te_source_has_the_layout_we_convert(te_source: Callable[[str, str], str]) -> None:
    """The keys we read and write are the ones TE's get_extra_state stores (both TE versions)."""
    for version in ("2.9.0", "2.20.2"):
        source = te_source(version, "pytorch/module/base.py")
        for key in ("recipe", "scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
            assert f'state["{key}"]' in source, (version, key)
        assert 'state["extra_fp8_variables"] = extra' in source


def test_round_trip_through_our_state_without_te() -> None:
    te_dict = _te_format_dict()
    state, recipe = from_te_extra_state(te_dict)
    assert recipe == DelayedScaling(
        margin=2,
        fp8_format=Format.E4M3,
        amax_history_len=L,
        amax_compute_algo="most_recent",
        reduce_amax=False,
    )
    assert torch.equal(state.forward.amax_history, te_dict["amax_history_fwd"])
    assert torch.equal(state.backward.scale, te_dict["scale_bwd"])
    assert torch.equal(state.forward.scale_inv, torch.ones(3) / te_dict["scale_fwd"])

    ours = to_te_extra_state(state, recipe, te_dict["extra_fp8_variables"])
    assert ours["format"] == TE_STATE_FORMAT
    assert ours["recipe"] == {
        "margin": 2,
        "fp8_format": "E4M3",
        "amax_history_len": L,
        "amax_compute_algo": "most_recent",
        "reduce_amax": False,
    }
    assert ours["extra_fp8_variables"] == te_dict["extra_fp8_variables"]
    for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(ours[key], te_dict[key]), key

    buffer = io.BytesIO()  # tensors and plain data only: opens with weights_only=True
    torch.save(ours, buffer)
    buffer.seek(0)
    again, recipe_again = from_te_extra_state(torch.load(buffer, weights_only=True))
    assert recipe_again == recipe
    assert torch.equal(again.backward.amax_history, state.backward.amax_history)


def test_our_fresh_state_converts_with_default_variables() -> None:
    recipe = DelayedScaling(amax_history_len=L)
    state = FP8ModuleState(ScalingMeta.create(6, L), ScalingMeta.create(4, L))  # 2 GEMMs (MLP)
    te_dict = to_te_extra_state(state, recipe)
    assert te_dict["amax_history_fwd"].shape == (L, 6) and te_dict["scale_bwd"].shape == (4,)
    assert te_dict["extra_fp8_variables"] == {"num_gemms": 2}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.pop("scale_bwd"), "lacks"),
        (lambda d: d.update(amax_history_fwd=torch.zeros(L + 1, 3)), "amax_history_len is 4"),
        (
            lambda d: d.update(scale_bwd=torch.ones(3), amax_history_bwd=torch.zeros(L, 3)),
            "per GEMM",
        ),
        (lambda d: d.update(format="someone-else/9"), "Unknown TE extra-state format"),
    ],
    ids=["missing-key", "history-length", "columns", "format"],
)
def test_bad_te_state_is_refused(change: Any, match: str) -> None:
    te_dict = _te_format_dict()
    change(te_dict)
    with pytest.raises(ValueError, match=match):
        from_te_extra_state(te_dict)


def test_a_callable_algo_cannot_be_saved_without_pickle() -> None:
    recipe = DelayedScaling(amax_history_len=L, amax_compute_algo=lambda h: h.amax(0))
    state = FP8ModuleState(ScalingMeta.create(3, L), ScalingMeta.create(2, L))
    with pytest.raises(ValueError, match="callable amax_compute_algo"):
        to_te_extra_state(state, recipe)


# ---- checkpoints of a model with TE modules ---------------------------------------------------
CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=32)


def _model(seed: int, run: bool = True) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CFG)
    te = _TELinear(32, 128)
    te.load_state_dict(model.blocks[0].mlp.fc.state_dict(), strict=False)
    model.blocks[0].mlp.fc = te
    if run:
        te.fake_fp8_run(seed)
    return model


def _te_meta(model: GPT) -> dict[str, Any]:
    return model.blocks[0].mlp.fc.fp8_meta


def test_trainer_checkpoint_restores_te_state_without_pickle(
    tmp_path: Path,
    te_recipe_module: None,
    monkeypatch: pytest.MonkeyPatch,
    data_factory: Callable[..., TokenData],
) -> None:
    """Save a Trainer whose model holds a TE module with delayed-scaling state; resume into a
    fresh model: the state comes back although TE's pickle guard is on."""
    monkeypatch.delenv(TE_UNSAFE_PICKLE_ENV, raising=False)
    data = data_factory(seed=0, block_size=CFG.block_size)
    cfg = TrainConfig(steps=1, batch_size=2, eval_every=0, progress=False, precision="fp32")
    trainer = Trainer(_model(0), data, cfg, device="cpu")
    path = trainer.save(tmp_path / "ckpt.pt")
    assert isinstance(load_checkpoint(path)["model"]["blocks.0.mlp.fc._extra_state"], dict)

    fresh = Trainer(_model(1, run=False), data, cfg, device="cpu")
    fresh.resume(path)
    saved, restored = _te_meta(trainer.model), _te_meta(fresh.model)
    assert restored["recipe"] == _TEDelayedScaling(margin=1, amax_history_len=L)
    assert restored["num_gemms"] == 1 and restored["fp8_max_bwd"] == 57344.0
    for key in ("scaling_fwd", "scaling_bwd"):
        assert torch.equal(restored[key].amax_history, saved[key].amax_history)
        assert torch.equal(restored[key].scale, saved[key].scale)
    assert torch.equal(fresh.model.blocks[0].mlp.fc.weight, trainer.model.blocks[0].mlp.fc.weight)


def test_te_pickled_state_is_refused_with_the_fix(
    tmp_path: Path, te_recipe_module: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TE_UNSAFE_PICKLE_ENV, raising=False)
    model = _model(0)
    path = save_checkpoint(tmp_path / "plain.pt", {"model": model.state_dict()})  # TE's pickle
    state = load_checkpoint(path)["model"]  # a uint8 tensor: weights_only opens it
    fresh = _model(1, run=False)
    with pytest.raises(
        CheckpointError, match=rf"blocks.0.mlp.fc._extra_state.*{TE_UNSAFE_PICKLE_ENV}=1"
    ):
        load_model_state_dict(fresh, state)
    assert "recipe" not in _te_meta(fresh)  # nothing was loaded
    monkeypatch.setenv(TE_UNSAFE_PICKLE_ENV, "1")  # the user's explicit opt-in: TE unpickles
    load_model_state_dict(fresh, state)
    assert torch.equal(_te_meta(fresh)["scaling_fwd"].scale, _te_meta(model)["scaling_fwd"].scale)


def test_modules_without_fp8_state_save_an_empty_tensor(te_recipe_module: None) -> None:
    model = _model(0, run=False)
    assert te_extra_state(model.blocks[0].mlp.fc) is None
    state = model_state_dict(model)
    assert state["blocks.0.mlp.fc._extra_state"].numel() == 0
    load_model_state_dict(_model(1, run=False), state)
    with pytest.raises(RuntimeError, match=r"(?i)missing key.*_extra_state"):
        load_model_state_dict(_model(1), {k: v for k, v in state.items() if "extra" not in k})


def test_a_mismatched_te_state_is_refused_before_anything_loads(
    te_recipe_module: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose FP8 state was saved for 2 GEMMs cannot load into a module that runs 1:
    the error comes before the weights or any other module's state change."""
    monkeypatch.delenv(TE_UNSAFE_PICKLE_ENV, raising=False)
    state = model_state_dict(_model(0))
    extra = state["blocks.0.mlp.fc._extra_state"]
    for d, per_gemm in (("fwd", 3), ("bwd", 2)):  # the same state, widened to two GEMMs
        extra[f"scale_{d}"] = extra[f"scale_{d}"].repeat(2)
        extra[f"amax_history_{d}"] = extra[f"amax_history_{d}"].repeat(1, 2)
        assert extra[f"scale_{d}"].numel() == 2 * per_gemm
    fresh = _model(1)  # has run: num_gemms = 1
    before = {k: v.clone() for k, v in fresh.state_dict().items() if "extra" not in k}
    scales = {k: _te_meta(fresh)[k].scale.clone() for k in ("scaling_fwd", "scaling_bwd")}
    with pytest.raises(CheckpointError, match=r"blocks.0.mlp.fc._extra_state.*2 GEMM.*runs 1"):
        load_model_state_dict(fresh, state)
    for key, value in fresh.state_dict().items():
        if "extra" not in key:  # TE's extra state is a fresh pickle each time
            assert torch.equal(value, before[key]), key
    for key, scale in scales.items():
        assert torch.equal(_te_meta(fresh)[key].scale, scale)


def test_te_save_condition_is_respected(te_recipe_module: None) -> None:
    """TE saves FP8 state only if ``fp8_meta["fp8_checkpoint"] or fp8 or fp8_calibration``."""
    module = _model(0).blocks[0].mlp.fc
    assert te_extra_state(module) is not None
    module.fp8_meta["fp8_checkpoint"] = False  # e.g. a module last run outside any FP8 region
    assert te_extra_state(module) is None
    module.fp8_calibration = True
    assert te_extra_state(module) is not None


# ---- moving a run between fp8 (FP8Linear) and te-fp8 (fp8.te_checkpoint) ----------------------
RUN_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)


class _TELayerNorm(nn.LayerNorm):
    """TE's op-based LayerNorm as a state dict sees it: weight, bias and an empty extra state
    (``ops/op.py``: no quantizer state, so ``get_extra_state`` returns an empty tensor)."""

    def get_extra_state(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        assert isinstance(state, torch.Tensor) and state.numel() == 0


def _te_model(seed: int) -> GPT:
    """A GPT with stand-in TE modules where ``convert_to_te`` puts TE's (Linears but the tied
    head, every LayerNorm)."""
    torch.manual_seed(seed)
    model = GPT(RUN_CFG)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                new: nn.Module = _TELinear(child.in_features, child.out_features)
            elif type(child) is nn.LayerNorm:
                new = _TELayerNorm(child.normalized_shape)
            else:
                continue
            new.load_state_dict(child.state_dict(), strict=False)
            setattr(parent, name, new)
    return model


def test_an_fp8_run_moves_to_te_and_back_and_resumes_exactly(
    tmp_path: Path,
    te_recipe_module: None,
    monkeypatch: pytest.MonkeyPatch,
    data_factory: Callable[..., TokenData],
    short_run: Callable[..., Trainer],
) -> None:
    """fp8 -> te-fp8 -> fp8 gives back the checkpoint bit for bit, the te-fp8 form loads into
    TE modules (stand-ins following TE's source) with the same scales and histories, and the
    run resumed from the round trip continues exactly as if it had never stopped."""
    from tutorial_lib.checkpoint import convert_checkpoint_file
    from tutorial_lib.fp8.te_checkpoint import convert_checkpoint

    monkeypatch.delenv(TE_UNSAFE_PICKLE_ENV, raising=False)

    def data() -> TokenData:
        return data_factory(seed=0, block_size=RUN_CFG.block_size)

    torch.manual_seed(0)
    model = GPT(RUN_CFG)
    straight = short_run(model, data(), "fp8", 6)
    straight.train()
    first = short_run(model, data(), "fp8", 6)
    first.train(3)
    path = first.save(tmp_path / "fp8.pt")
    original = load_checkpoint(path)

    te_path = convert_checkpoint_file(path, tmp_path / "te.pt", "te-fp8")
    te_state = load_checkpoint(te_path)  # weights_only: no pickle anywhere
    assert te_state["model_recipe"]["precision"] == "te-fp8"
    assert te_state["train_config"]["precision"] == "te-fp8"
    assert not any(k.rsplit(".", 1)[-1].startswith("fp8_") for k in te_state["model"])
    fc = te_state["model"]["blocks.1.mlp.fc._extra_state"]
    assert fc["format"] == TE_STATE_FORMAT and fc["recipe"]["amax_history_len"] == 1024
    assert torch.equal(
        fc["amax_history_fwd"], original["model"]["blocks.1.mlp.fc.fp8_amax_history_fwd"]
    )
    assert torch.equal(fc["scale_bwd"], original["model"]["blocks.1.mlp.fc.fp8_scale_bwd"])
    assert te_state["model"]["blocks.0.ln1._extra_state"].numel() == 0

    te_model = _te_model(1)  # the te-fp8 checkpoint loads into TE modules, without pickle
    load_model_state_dict(te_model, te_state["model"])
    meta = te_model.blocks[1].mlp.fc.fp8_meta
    assert meta["recipe"] == _TEDelayedScaling() and meta["fp8_max_bwd"] == 57344.0
    assert torch.equal(meta["scaling_fwd"].scale, fc["scale_fwd"])
    assert torch.equal(te_model.blocks[1].mlp.fc.weight, first.model.blocks[1].mlp.fc.weight)
    saved_again = model_state_dict(te_model)  # and TE's state comes back out the same
    assert torch.equal(
        saved_again["blocks.1.mlp.fc._extra_state"]["amax_history_bwd"], fc["amax_history_bwd"]
    )

    back = convert_checkpoint(te_state, "fp8")
    assert back["model"].keys() == original["model"].keys()
    for key, value in original["model"].items():
        assert torch.equal(back["model"][key], value), key
    back_path = save_checkpoint(tmp_path / "back.pt", back)
    torch.manual_seed(123)
    second = short_run(GPT(RUN_CFG), data(), "fp8", 6)
    second.resume(back_path)
    second.train()
    assert [r["loss"] for r in second.history] == [r["loss"] for r in straight.history]


def test_conversion_refuses_what_does_not_fit(
    tmp_path: Path, data_factory: Callable[..., TokenData], short_run: Callable[..., Trainer]
) -> None:
    from tutorial_lib.checkpoint import convert_checkpoint_file
    from tutorial_lib.fp8.te_checkpoint import convert_checkpoint

    torch.manual_seed(0)
    bf16 = short_run(GPT(RUN_CFG), data_factory(block_size=32), "bf16", 1)
    bf16.train()
    state = load_checkpoint(bf16.save(tmp_path / "bf16.pt"))
    with pytest.raises(ValueError, match="in precision 'bf16'.*needs one trained in 'fp8'"):
        convert_checkpoint(state, "te-fp8")
    with pytest.raises(ValueError, match="Can convert to"):
        convert_checkpoint(state, "mxfp8")
    fp8 = short_run(GPT(RUN_CFG), data_factory(block_size=32), "fp8", 1)
    fp8.train()
    state = load_checkpoint(fp8.save(tmp_path / "fp8.pt"))
    with pytest.raises(ValueError, match="in precision 'fp8'.*needs one trained in 'te-fp8'"):
        convert_checkpoint(state, "fp8")
    te = convert_checkpoint(state, "te-fp8")
    pickled = dict(te, model=dict(te["model"]))  # TE's own pickle, as model.state_dict() writes
    pickled["model"]["blocks.0.attn.qkv._extra_state"] = torch.ones(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="pickled extra state.*Resume it once under te-fp8"):
        convert_checkpoint(pickled, "fp8")
    short = dict(te, model=dict(te["model"]))
    extra = dict(short["model"]["blocks.0.attn.qkv._extra_state"])
    extra["recipe"] = dict(extra["recipe"], amax_history_len=16)
    extra["amax_history_fwd"] = extra["amax_history_fwd"][:16]
    extra["amax_history_bwd"] = extra["amax_history_bwd"][:16]
    short["model"]["blocks.0.attn.qkv._extra_state"] = extra
    with pytest.raises(ValueError, match="saved under .*amax_history_len': 16"):
        convert_checkpoint(short, "fp8")
    fused = dict(state, model_recipe=dict(state["model_recipe"], fused=True))
    with pytest.raises(ValueError, match="one process"):
        convert_checkpoint(fused, "te-fp8")
    path = fp8.save(tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="new file"):
        convert_checkpoint_file(path, path, "te-fp8")
    assert state["model_recipe"]["precision"] == "fp8"  # the input is never changed


def test_convert_checkpoint_command_and_the_trainers_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Train with the CLI, convert to te-fp8 and back with the command, and resume with the
    command it prints; an fp8 Trainer offered the te-fp8 checkpoint names the way back."""
    from tutorial_lib.__main__ import main

    common = ["--preset", "ci", "--batch-size", "2", "--device", "cpu", "--no-progress"]
    first, te_dir, back_dir = tmp_path / "fp8", tmp_path / "te", tmp_path / "back"
    assert main(["train", "--precision", "fp8", "--steps", "2", "--out", str(first), *common]) == 0
    src, te = first / "checkpoint.pt", te_dir / "checkpoint.pt"
    capsys.readouterr()
    assert main(["convert-checkpoint", str(src), str(te), "--to", "te-fp8"]) == 0
    out = capsys.readouterr().out
    assert f"train --precision te-fp8 --out {te_dir} --resume" in out
    converted = load_checkpoint(te)
    assert converted["model_recipe"]["precision"] == "te-fp8"
    assert (
        main(["convert-checkpoint", str(te), str(back_dir / "checkpoint.pt"), "--to", "fp8"]) == 0
    )
    resume = ["train", "--precision", "fp8", "--steps", "3", "--out", str(back_dir), "--resume"]
    assert main([*resume, *common]) == 0, capsys.readouterr().err
    history = load_checkpoint(back_dir / "checkpoint.pt")["history"]
    assert [r["step"] for r in history] == [0, 1, 2]
    assert history[:2] == load_checkpoint(src)["history"]
    fp8_trainer = _trainer_for(converted)
    with pytest.raises(ValueError, match="convert-checkpoint CKPT NEW --to fp8"):
        fp8_trainer.check_compatible(converted)
    assert main(["convert-checkpoint", str(te), str(tmp_path / "x.pt"), "--to", "te-fp8"]) == 1
    assert "needs one trained in 'fp8'" in capsys.readouterr().err
    assert main(["convert-checkpoint", str(src), str(tmp_path / "y.pt"), "--to", "fp8"]) == 1


def _trainer_for(state: dict[str, Any]) -> Trainer:
    """An fp8 Trainer of the checkpoint's model (one step, CPU)."""
    from tutorial_lib.build import build_model

    cfg = GPTConfig(**state["model_config"])
    data = TokenData(torch.arange(4096) % 256, torch.arange(512) % 256, cfg.block_size, 0)
    train = TrainConfig(steps=1, batch_size=2, eval_every=0, progress=False, precision="fp8")
    return Trainer(build_model(cfg, precision="fp8"), data, train, device="cpu")


def test_te_source_has_the_module_layout_we_convert(
    te_source: Callable[[str, str], str],
) -> None:
    """te.Linear and te.LayerNorm name their parameters as nn.Linear and nn.LayerNorm do,
    weight first (so weights and AdamW's state, indexed by parameter order, carry over), and a
    LayerNorm without FP8 state saves an empty extra state."""
    for version in ("2.9.0", "2.20.2"):
        linear = te_source(version, "pytorch/module/linear.py")
        assert 'self.weight_names = ["weight"]' in linear and 'self.bias_names = ["bias"]' in linear
        weights = linear.index("self.weight_names[i],\n")  # the weight loop registers first,
        assert weights < linear.index("self.bias_names[i],\n")  # the bias loop after it
        norm = te_source(version, "pytorch/ops/basic/layer_norm.py")
        weight = norm.index('self.register_parameter("weight", weight)')
        assert weight < norm.index('self.register_parameter("bias", bias)')
        op = te_source(version, "pytorch/ops/op.py")
        assert "return torch.empty(0, dtype=torch.uint8)" in op, version


@pytest.mark.parametrize(
    ("to", "change", "match"),
    [
        ("te-fp8", lambda m: m.pop("blocks.0.attn.qkv.fp8_scale_bwd"), "no delayed-scaling"),
        (
            "te-fp8",
            lambda m: m.update(
                {
                    k: v[:16]
                    for k, v in m.items()
                    if k.startswith("blocks.0.mlp.fc.fp8_amax_history")
                }
            ),
            "amax history of 16 rows",
        ),
        ("fp8", lambda m: m.update({"blocks.0.ln1._extra_state": torch.ones(3)}), "LayerNorm"),
        ("fp8", lambda m: m.update({"blocks.0.ln2._extra_state": {"a": 1}}), "LayerNorm"),
        ("fp8", lambda m: m.pop("blocks.1.mlp.proj._extra_state"), "is missing"),
    ],
    ids=["missing-buffer", "history-length", "norm-state", "norm-dict", "missing-extra"],
)
def test_conversion_refuses_a_broken_model_state(
    to: str, change: Callable[[dict[str, Any]], object], match: str
) -> None:
    from tutorial_lib.fp8.te_checkpoint import convert_checkpoint

    trainer = _trainer_for({"model_config": dataclasses.asdict(RUN_CFG)})
    state = {
        **trainer.run_state(),
        "model": model_state_dict(trainer.model),
        "optimizer": trainer.optimizer.state_dict(),
    }
    if to == "fp8":
        state = convert_checkpoint(state, "te-fp8")
    change(state["model"])
    with pytest.raises(ValueError, match=match):
        convert_checkpoint(state, to)
    for key, value in (("tp", 2), ("fused", True)):
        other = dict(state, model_recipe=dict(state["model_recipe"], **{key: value}))
        with pytest.raises(ValueError, match="one process"):
            convert_checkpoint(other, to)
    no_bias = dict(state, model_config=dict(state["model_config"], bias=False))
    with pytest.raises(ValueError, match="without biases"):
        convert_checkpoint(no_bias, to)
