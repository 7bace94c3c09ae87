"""The ``fp8`` precision policy end to end: registry, device checks, training close to BF16,
checkpoints that resume bit for bit, and the CLI."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tutorial_lib.__main__ import main
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8 import convert_to_fp8
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.policy import FP8_LOSS_TOLERANCE, fp8_policy_name, make_fp8_policy
from tutorial_lib.model import GPT
from tutorial_lib.precision import get_policy
from tutorial_lib.train import Trainer

# Widths that are multiples of 16, B*T = 8*32 a multiple of 8.
CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture
def data(data_factory: Callable[..., TokenData]) -> Callable[[], TokenData]:
    return lambda: data_factory(seed=0, block_size=CFG.block_size)


# ---- the policy --------------------------------------------------------------------------------
def test_policy_fields() -> None:
    policy = get_policy("fp8", "cpu")
    assert (policy.name, policy.autocast_dtype, policy.peak_dtype) == ("fp8", torch.bfloat16, "fp8")
    prepare = policy.prepare_model
    assert isinstance(prepare, functools.partial) and prepare.func is convert_to_fp8
    assert not policy.grad_scaler


def test_get_policy_imports_fp8_lazily() -> None:
    code = (
        "import sys; from tutorial_lib.precision import get_policy\n"
        "assert 'tutorial_lib.fp8' not in sys.modules\n"
        "assert get_policy('fp8').name == 'fp8'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_device_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake A100")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(RuntimeError, match=r"sm_80.*emulate=True"):
        get_policy("fp8").validate("cuda")
    make_fp8_policy(emulate=True).validate("cuda")  # opted in
    get_policy("fp8").validate("cpu")  # a CPU always emulates
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    get_policy("fp8").validate("cuda:0")


# ---- training ----------------------------------------------------------------------------------
@pytest.mark.parametrize("accumulation", ["exact", "hopper"])
def test_fp8_trains_close_to_bf16(
    data: Callable[[], TokenData], short_run: Callable[..., Trainer], accumulation: str
) -> None:
    """FP8 follows BF16's loss curve with float32 sums and with Hopper's (``fp8.mma``)."""
    torch.manual_seed(0)
    model = GPT(CFG)
    fp8 = short_run(model, data(), fp8_policy_name("fp8", accumulation), 20)
    assert sum(isinstance(m, FP8Linear) for m in fp8.model.modules()) == 4 * CFG.n_layer
    fp8_losses = [row["loss"] for row in fp8.train()]
    bf16_losses = [row["loss"] for row in short_run(model, data(), "bf16", 20).train()]
    assert all(torch.isfinite(torch.tensor(fp8_losses)))
    assert fp8_losses[-1] < fp8_losses[0] - 1.0
    gap = max(abs(a - b) for a, b in zip(fp8_losses, bf16_losses, strict=True))
    assert gap < FP8_LOSS_TOLERANCE, gap
    qkv = fp8.model.blocks[0].attn.qkv
    assert qkv.fp8_scale_fwd[0] != 1 and qkv.fp8_scale_bwd[0] != 1  # the scales moved


def test_resume_reproduces_the_uninterrupted_run(
    data: Callable[[], TokenData], tmp_path: Path, short_run: Callable[..., Trainer]
) -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    straight = short_run(model, data(), "fp8", 12)
    straight.train()
    first = short_run(model, data(), "fp8", 12)
    first.train(6)
    path = first.save(tmp_path / "ckpt.pt")
    saved = load_checkpoint(path)["model"]
    assert saved["blocks.0.attn.qkv.fp8_amax_history_fwd"].abs().sum() > 0
    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    second = short_run(GPT(CFG), data(), "fp8", 12)
    second.resume(path)
    second.train()
    losses = [row["loss"] for row in second.history]
    assert losses == [row["loss"] for row in straight.history]
    for key, value in straight.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[key], value), key


def test_cli_trains_with_fp8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = [
        "train",
        "--precision",
        "fp8",
        "--preset",
        "ci",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert (out / "checkpoint.pt").exists()
    state = load_checkpoint(out / "checkpoint.pt")["model"]
    assert any(key.endswith("fp8_scale_fwd") for key in state)


def test_no_cpu_training_path_calls_scaled_mm(
    monkeypatch: pytest.MonkeyPatch,
    data: Callable[[], TokenData],
    short_run: Callable[..., Trainer],
) -> None:
    """FP8 training on the CPU, forward and backward, never reaches ``torch._scaled_mm`` (whose
    CPU kernel takes minutes per step on some CPUs); its GEMMs do run in FP8 (histories fill)."""
    calls: list[str] = []

    def record(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("_scaled_mm")
        raise AssertionError("torch._scaled_mm called on a CPU training path")

    monkeypatch.setattr(torch, "_scaled_mm", record)
    torch.manual_seed(0)
    trainer = short_run(GPT(CFG), data(), "fp8", steps=2)
    trainer.train()
    fp8_layers = [m for m in trainer.model.modules() if isinstance(m, FP8Linear)]
    assert fp8_layers and calls == []
    for layer in fp8_layers:  # forward (input, weight) and backward (grad_output) amaxes
        assert (layer.fp8_amax_history_fwd[:, :2] > 0).any(dim=0).all()
        assert (layer.fp8_amax_history_bwd[:, 0] > 0).any()
