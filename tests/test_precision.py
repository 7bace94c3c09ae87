"""Tests for tutorial_lib.precision: the policy registry, device checks, autocast and TF32."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.model import GPT
from tutorial_lib.precision import (
    POLICIES,
    PrecisionPolicy,
    available_policies,
    get_policy,
    register_policy,
)
from tutorial_lib.train import TrainConfig, Trainer

BUILTIN = {"fp32", "tf32", "bf16", "fp16"}


@pytest.fixture
def registry() -> Iterator[dict[str, PrecisionPolicy]]:
    """The registry, restored to its exact previous contents afterwards."""
    saved = dict(POLICIES)
    yield POLICIES
    POLICIES.clear()
    POLICIES.update(saved)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, tuple[int, int]], list[int]]:
    """``fake_gpu(name, (major, minor))`` makes torch.cuda report such a device; returns the
    list of device indices the capability was queried for."""
    queried: list[int] = []

    def install(name: str, cc: tuple[int, int]) -> list[int]:
        def capability(index: int | None = None) -> tuple[int, int]:
            queried.append(index)  # type: ignore[arg-type]
            return cc

        monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        return queried

    return install


# ---- registry ------------------------------------------------------------------------------


def test_builtin_policies_registered() -> None:
    assert BUILTIN <= set(available_policies())
    assert available_policies() == list(POLICIES)
    for name in BUILTIN:
        policy = get_policy(name)
        assert policy.name == name and policy.description


def test_builtin_policy_settings() -> None:
    fp32, tf32, bf16, fp16 = (get_policy(n) for n in ("fp32", "tf32", "bf16", "fp16"))
    assert (fp32.autocast_dtype, fp32.allow_tf32, fp32.grad_scaler) == (None, False, False)
    assert (tf32.autocast_dtype, tf32.allow_tf32, tf32.peak_dtype) == (None, True, "tf32")
    assert (bf16.autocast_dtype, bf16.grad_scaler, bf16.peak_dtype) == (
        torch.bfloat16,
        False,
        "bf16",
    )
    assert (fp16.autocast_dtype, fp16.grad_scaler, fp16.peak_dtype) == (
        torch.float16,
        True,
        "fp16",
    )


def test_unknown_policy_lists_available() -> None:
    with pytest.raises(ValueError, match="Unknown precision policy 'fp12'") as info:
        get_policy("fp12")
    for name in BUILTIN:
        assert name in str(info.value)


def test_get_policy_accepts_a_policy_object() -> None:
    custom = PrecisionPolicy("unregistered", "not in the registry")
    assert get_policy(custom) is custom
    assert get_policy(custom, "cpu") is custom


def test_register_duplicate_rejected(registry: dict[str, PrecisionPolicy]) -> None:
    original = registry["fp32"]
    with pytest.raises(ValueError, match="'fp32' is already registered"):
        register_policy(PrecisionPolicy("fp32", "impostor"))
    assert get_policy("fp32") is original


def test_register_new(registry: dict[str, PrecisionPolicy]) -> None:
    extra = register_policy(PrecisionPolicy("test-only", "registered by a test"))
    assert "test-only" in available_policies() and get_policy("test-only") is extra


# ---- device checks -------------------------------------------------------------------------


def test_fp16_on_cpu_is_rejected_with_advice() -> None:
    get_policy("fp16")  # without a device, no check
    with pytest.raises(RuntimeError, match=r"fp16.*CUDA.*'bf16'"):
        get_policy("fp16", "cpu")


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16"])
def test_cpu_runs_other_policies(name: str) -> None:
    assert get_policy(name, torch.device("cpu")).name == name


def test_bf16_rejected_on_turing(fake_gpu: Callable[..., list[int]]) -> None:
    fake_gpu("Tesla T4", (7, 5))
    with pytest.raises(RuntimeError, match="compute capability >= 8.0") as info:
        get_policy("bf16", "cuda")
    message = str(info.value)
    assert "Tesla T4 is 7.5" in message and "'fp16'" in message


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (9, 0), (10, 0)])
def test_bf16_accepted_from_ampere(fake_gpu: Callable[..., list[int]], cc: tuple[int, int]) -> None:
    fake_gpu("Some GPU", cc)
    assert get_policy("bf16", "cuda").name == "bf16"


def test_device_check_uses_the_given_index(fake_gpu: Callable[..., list[int]]) -> None:
    queried = fake_gpu("NVIDIA H100 80GB HBM3", (9, 0))
    get_policy("bf16", "cuda:3")
    get_policy("bf16", "cuda")
    assert queried == [3, 0]  # an explicit index, else the current device


def test_fp16_needs_volta(fake_gpu: Callable[..., list[int]]) -> None:
    fake_gpu("Tesla P100", (6, 0))
    with pytest.raises(RuntimeError, match="compute capability >= 7.0"):
        get_policy("fp16", "cuda")


def test_fp16_accepted_on_volta(fake_gpu: Callable[..., list[int]]) -> None:
    fake_gpu("Tesla V100", (7, 0))
    assert get_policy("fp16", "cuda").name == "fp16"


# ---- autocast, TF32, scaler ----------------------------------------------------------------


def test_bf16_autocast_on_cpu_keeps_fp32_master_weights() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(13, 7)
    x = torch.randn(5, 13)
    with get_policy("bf16").autocast("cpu"):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32 and layer.bias.dtype == torch.float32
    ref = x @ layer.weight.T + layer.bias
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=2e-2)  # bf16 tolerance
    assert layer(x).dtype == torch.float32  # autocast ends with the context


def test_fp32_policy_does_not_autocast() -> None:
    with get_policy("fp32").autocast(torch.device("cpu")):
        assert nn.Linear(4, 3)(torch.randn(2, 4)).dtype == torch.float32


def test_extra_context_is_entered() -> None:
    entered: list[str] = []

    class Marker:
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: object) -> None:
            entered.append("out")

    policy = PrecisionPolicy("marked", "test", extra_context=Marker)
    with policy.autocast("cpu"):
        assert entered == ["in"]
    assert entered == ["in", "out"]


@pytest.fixture
def tf32_flags() -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize(("name", "inside"), [("fp32", False), ("tf32", True)])
@pytest.mark.parametrize("outside", [False, True])
def test_matmul_settings_sets_and_restores(
    tf32_flags: None, name: str, inside: bool, outside: bool
) -> None:
    torch.backends.cuda.matmul.allow_tf32 = outside
    torch.backends.cudnn.allow_tf32 = outside
    with get_policy(name).matmul_settings():
        assert torch.backends.cuda.matmul.allow_tf32 is inside
        assert torch.backends.cudnn.allow_tf32 is inside
    assert torch.backends.cuda.matmul.allow_tf32 is outside
    assert torch.backends.cudnn.allow_tf32 is outside


def test_matmul_settings_restores_after_exception(tf32_flags: None) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    with pytest.raises(KeyError), get_policy("fp32").matmul_settings():
        assert torch.backends.cuda.matmul.allow_tf32 is False
        raise KeyError("boom")
    assert torch.backends.cuda.matmul.allow_tf32 is True


def test_grad_scaler_only_for_fp16() -> None:
    assert get_policy("fp32").make_grad_scaler("cpu") is None
    assert get_policy("bf16").make_grad_scaler("cpu") is None
    scaler = get_policy("fp16").make_grad_scaler("cpu")
    assert isinstance(scaler, torch.amp.GradScaler)


# ---- training under bf16 -------------------------------------------------------------------


def test_bf16_training_on_cpu(tiny_cfg: GPTConfig, tiny_data: TokenData) -> None:
    cfg = TrainConfig(
        steps=20,
        batch_size=4,
        lr=1e-2,
        warmup_steps=2,
        eval_every=0,
        precision="bf16",
        progress=False,
    )
    torch.manual_seed(0)
    trainer = Trainer(GPT(tiny_cfg), tiny_data, cfg, device="cpu")
    losses = [r["loss"] for r in trainer.train()]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.5, losses
    # Master weights and optimizer state stay FP32 under autocast.
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    for state in trainer.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32
