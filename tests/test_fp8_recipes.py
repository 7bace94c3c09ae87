"""Every FP8 recipe through ``FP8Linear``: the GEMMs against a float64 reference built from the
quantizers, device gating, activation checkpointing, training from the CLI with a falling loss,
and checkpoints that resume bit for bit (NVFP4's stochastic-rounding generator included)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tutorial_lib.__main__ import main
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8 import (
    NATIVE,
    RECIPE_PRECISIONS,
    DelayedScaling,
    autocast,
    checkpoint,
    get_quantizer,
)
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.recipes import (
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8RowwiseScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    make_recipe,
    recipe_name,
)
from tutorial_lib.fp8.sr_state import SR_STATE_KEY
from tutorial_lib.model import GPT
from tutorial_lib.precision import get_policy
from tutorial_lib.train import Trainer

STATELESS = {
    "current": Float8CurrentScaling(),
    "block": Float8BlockScaling(),
    "mxfp8": MXFP8BlockScaling(),
    "nvfp4": NVFP4BlockScaling(),
    "rowwise": Float8RowwiseScaling(),
}
# Relative error of one GEMM against its float64 reference: float32 accumulation over K <= 160
# terms of exact products (plus NVFP4's two scale multiplications) stays near 1e-6; 1e-5 is a
# 10x margin that still catches any wrong scale, tile or transpose (those give errors > 1e-2).
GEMM_RTOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


# Each copy's quantizer, written out from TE's recipes (not read from ours): (row-wise copy,
# column-wise copy) options per role. Block: 1x128 tiles for x and dy, 128x128 for w, along
# each copy's rows. NVFP4 (TE's NVFP4BlockScaling defaults): 16x16 weight blocks; the Hadamard
# transform on the column-wise x and dy (the wgrad operands); stochastic rounding of dy.
TE_COPIES: dict[str, dict[str, tuple[dict[str, object], dict[str, object]]]] = {
    "current": {r: ({}, {}) for r in ("input", "weight", "grad_output")},
    "rowwise": {r: ({}, {}) for r in ("input", "weight", "grad_output")},
    "mxfp8": {r: ({}, {}) for r in ("input", "weight", "grad_output")},
    "block": {
        "input": ({"block_scaling_dim": 1}, {"block_scaling_dim": 1}),
        "weight": ({"block_scaling_dim": 2}, {"block_scaling_dim": 2}),
        "grad_output": ({"block_scaling_dim": 1}, {"block_scaling_dim": 1}),
    },
    "nvfp4": {
        "input": ({"block_2d": False}, {"block_2d": False, "rht": True}),
        "weight": ({"block_2d": True}, {"block_2d": True}),
        "grad_output": (
            {"block_2d": False, "stochastic_rounding": True},
            {"block_2d": False, "rht": True, "stochastic_rounding": True},
        ),
    },
}


def _reference(
    name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, dx, dw from ``get_quantizer`` with TE's per-copy options and ``dequantize()``,
    multiplied in float64: dgrad = Q(dy) Q_col(w), wgrad = Q_col(dy)^T Q_col(x)."""
    gen = torch.Generator().manual_seed(seed)

    def q(role: str, col: bool, t: torch.Tensor) -> torch.Tensor:
        options = dict(TE_COPIES[name][role][col])
        if options.get("stochastic_rounding"):
            options["generator"] = gen
        return get_quantizer(name, role, **options).quantize(t).dequantize(torch.float64)

    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    xq, wq = q("input", False, x2), q("weight", False, w)
    gq, wcol = q("grad_output", False, g2), q("weight", True, w.t())
    gcol, xcol = q("grad_output", True, g2.t()), q("input", True, x2.t())
    y = xq @ wq.T + b.double()
    return y.reshape(*x.shape[:-1], -1), (gq @ wcol.T).reshape(x.shape), gcol @ xcol.T


@pytest.mark.parametrize("name", list(STATELESS))
def test_fp8linear_gemms_match_the_quantizer_reference(name: str) -> None:
    recipe = STATELESS[name]
    torch.manual_seed(1)
    layer = FP8Linear(160, 40)  # K = 160: not a multiple of 128, so block tiles are padded
    layer.fp8_name = "layer"
    x = (torch.randn(3, 16, 160) * torch.logspace(-3, 2, 160)).requires_grad_()  # outliers
    g = torch.randn(3, 16, 40)
    seed = None
    if recipe.uses_stochastic_rounding:  # the layer's generator, replayed by the reference
        seed = int(torch.randint(1 << 40, (1,)))
        layer.sr_generator("cpu").manual_seed(seed)
    with autocast(recipe=recipe):
        y = layer(x)
    y.backward(g)
    y_ref, dx_ref, dw_ref = _reference(name, x.detach(), layer.weight, layer.bias, g, seed or 0)
    assert _rel(y, y_ref) < GEMM_RTOL
    assert _rel(x.grad, dx_ref) < GEMM_RTOL
    assert _rel(layer.weight.grad, dw_ref) < GEMM_RTOL
    assert torch.equal(layer.bias.grad, g.reshape(-1, 40).sum(0))
    high = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert 1e-4 < _rel(y, high) < (0.25 if name == "nvfp4" else 0.08)  # quantized, not broken


def test_nvfp4_needs_tokens_in_sixteens_for_its_hadamard_transform() -> None:
    layer = FP8Linear(32, 16)
    with pytest.raises(ValueError, match=r"multiple of 16, not 24.*disable_rht=True"):
        with autocast(recipe=NVFP4BlockScaling()):
            layer(torch.randn(3, 8, 32))
    with autocast(recipe=NVFP4BlockScaling(disable_rht=True)):
        assert layer(torch.randn(3, 8, 32)).shape == (3, 8, 16)


def test_nvfp4_draws_stochastic_rounding_from_the_layer_generator() -> None:
    torch.manual_seed(0)
    layer = FP8Linear(32, 16)
    x, g = torch.randn(16, 32, requires_grad=True), torch.randn(16, 16)
    grads = []
    for seed in (5, 5, 6):
        layer.sr_generator("cpu").manual_seed(seed)
        with autocast(recipe=NVFP4BlockScaling()):
            layer(x).backward(g)
        grads.append(layer.weight.grad.clone())
        layer.weight.grad = None
    assert torch.equal(grads[0], grads[1]) and not torch.equal(grads[0], grads[2])
    nearest = NVFP4BlockScaling(disable_stochastic_rounding=True)
    assert not nearest.uses_stochastic_rounding


@pytest.mark.parametrize("name", list(STATELESS))
def test_fp8_checkpoint_recompute_gives_the_same_gradients(name: str) -> None:
    torch.manual_seed(2)
    block = torch.nn.Sequential(FP8Linear(32, 48), torch.nn.GELU(), FP8Linear(48, 32))
    x = torch.randn(2, 8, 32, requires_grad=True)
    grads = []
    for wrap in (False, True):
        for m in block:
            if isinstance(m, FP8Linear):
                m.sr_generator("cpu").manual_seed(7)
        with autocast(recipe=STATELESS[name]):
            y = checkpoint(block, x) if wrap else block(x)
        y.square().sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in block.parameters()])
        x.grad = None
        block.zero_grad(set_to_none=True)
    for plain, ckpt in zip(*grads, strict=True):
        assert torch.equal(plain, ckpt)


# ---- names and devices -------------------------------------------------------------------------
def test_recipes_by_our_names_and_te_names() -> None:
    for te, ours in [
        ("DelayedScaling", "delayed"),
        ("Float8CurrentScaling", "current"),
        ("Float8BlockScaling", "block"),
        ("MXFP8BlockScaling", "mxfp8"),
        ("NVFP4BlockScaling", "nvfp4"),
    ]:
        assert recipe_name(te) == ours == recipe_name(make_recipe(ours))
        assert type(make_recipe(te)) is type(make_recipe(ours))
    assert make_recipe("block", power_2_scale=False).power_2_scale is False
    with pytest.raises(ValueError, match="Unknown FP8 recipe 'fp16'"):
        make_recipe("fp16")
    with pytest.raises(TypeError, match="has no field 'margin'"):
        make_recipe("current", margin=1)
    with pytest.raises(TypeError, match="autocast takes a recipe"):
        with autocast(recipe=object()):  # type: ignore[arg-type]
            pass


def test_recipes_refuse_what_te_refuses() -> None:
    from tutorial_lib.fp8.scaling import Format, MMParams

    with pytest.raises(ValueError, match="both 2"):
        Float8BlockScaling(x_block_scaling_dim=2)  # with w's default 2: a 2-D x 2-D GEMM
    with pytest.raises(ValueError, match="use 1 .1x128. or 2"):
        Float8BlockScaling(grad_block_scaling_dim=3)
    with pytest.raises(ValueError, match="split accumulation"):
        Float8BlockScaling(fp8_gemm_fprop=MMParams(use_split_accumulator=False))
    for cls in (Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling):
        with pytest.raises(ValueError, match="pure E5M2"):
            cls(fp8_format=Format.E5M2)
    with pytest.raises(ValueError, match="amax_epsilon"):
        Float8CurrentScaling(amax_epsilon=-1.0)


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "12.9")  # a CUDA build new enough for every kernel


@pytest.mark.parametrize("name", list(RECIPE_PRECISIONS))
def test_each_recipe_runs_natively_only_where_the_gpu_has_it(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    policy = get_policy(RECIPE_PRECISIONS[name])
    policy.validate("cpu")  # a CPU always emulates
    gpus = [((8, 0), "Fake A100"), ((8, 9), "Fake L40S"), ((9, 0), "Fake H100")]
    for cc, gpu in [*gpus, ((10, 0), "Fake B200")]:
        _fake_gpu(monkeypatch, cc, gpu)
        native = NATIVE[name]
        if native.runs_ours(cc):
            policy.validate("cuda")
            continue
        with pytest.raises(RuntimeError, match=rf"sm_{cc[0]}{cc[1]}.*emulate=True") as err:
            policy.validate("cuda")
        if name == "delayed":
            continue
        if cc >= native.min_cc:  # the math is there, our kernel is not: point to TE
            assert "has the math" in str(err.value) and "te-fp8" in str(err.value)
        else:
            assert native.gpus in str(err.value) and "has the math" not in str(err.value)
    from tutorial_lib.fp8.policy import make_fp8_policy

    make_fp8_policy(name, emulate=True).validate("cuda")  # opted in to the emulation


# ---- training and checkpoints ------------------------------------------------------------------
CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)


@pytest.mark.parametrize("precision", [p for r, p in RECIPE_PRECISIONS.items() if r != "delayed"])
def test_resume_reproduces_the_uninterrupted_run(
    precision: str,
    data_factory: Callable[..., TokenData],
    tmp_path: Path,
    short_run: Callable[..., Trainer],
) -> None:
    def data() -> TokenData:
        return data_factory(seed=0, block_size=CFG.block_size)

    torch.manual_seed(0)
    model = GPT(CFG)
    straight = short_run(model, data(), precision, 8)
    straight.train()
    first = short_run(model, data(), precision, 8)
    first.train(4)
    path = first.save(tmp_path / "ckpt.pt")
    saved = load_checkpoint(path)["model"]
    has_sr = any(key.endswith(SR_STATE_KEY) for key in saved)
    assert has_sr == (precision == "nvfp4")
    torch.manual_seed(123)  # another init and another stochastic-rounding seed
    second = short_run(GPT(CFG), data(), precision, 8)
    second.resume(path)
    second.train()
    assert [r["loss"] for r in second.history] == [r["loss"] for r in straight.history]
    for key, value in straight.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[key], value), key


@pytest.mark.parametrize("precision", list(RECIPE_PRECISIONS.values()))
def test_cli_trains_each_recipe_with_a_falling_loss(
    precision: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["train", "--precision", precision, "--preset", "ci", "--steps", "8"]
    args += ["--batch-size", "2", "--out", str(out), "--device", "cpu", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    history = load_checkpoint(out / "checkpoint.pt")["history"]
    losses = [row["loss"] for row in history]
    assert len(losses) == 8 and all(map(lambda v: v == v, losses))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses


def test_delayed_is_still_the_fp8_policy() -> None:
    assert RECIPE_PRECISIONS["delayed"] == "fp8"
    assert isinstance(make_recipe("delayed"), DelayedScaling)


def test_runnable_precision_emulates_only_where_the_gpu_lacks_the_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tutorial_lib.fp8.policy import runnable_fp8_precision

    assert runnable_fp8_precision("nvfp4", "cpu") == "nvfp4"
    _fake_gpu(monkeypatch, (9, 0), "Fake H100")
    assert runnable_fp8_precision("fp8-current", "cuda") == "fp8-current"
    name = runnable_fp8_precision("nvfp4", "cuda")
    assert name == "nvfp4-emulated"
    get_policy(name).validate("cuda")  # the emulating twin passes the device check


def test_sr_state_loads_before_the_layer_runs_and_across_device_types() -> None:
    """The saved stochastic-rounding state waits for the layer's next draw (so a checkpoint can
    load on the CPU before the model moves); a state for another device type reseeds with a
    warning instead of failing the load."""
    torch.manual_seed(0)
    x, g = torch.randn(16, 32, requires_grad=True), torch.randn(16, 16)
    src = FP8Linear(32, 16)
    src.sr_generator("cpu").manual_seed(11)
    state = src.state_dict()  # includes the generator state
    assert state[SR_STATE_KEY].dtype == torch.uint8

    def wgrad(layer: FP8Linear) -> torch.Tensor:
        with autocast(recipe=NVFP4BlockScaling()):
            layer(x).backward(g)
        out = layer.weight.grad.clone()
        layer.weight.grad = None
        return out

    dst = FP8Linear(32, 16)
    dst.load_state_dict(state)
    assert torch.equal(dst.state_dict()[SR_STATE_KEY], state[SR_STATE_KEY])  # kept, unused
    assert torch.equal(wgrad(dst), wgrad(src))  # same weights, same noise
    foreign = dict(state)
    foreign[SR_STATE_KEY] = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's 16 bytes
    other = FP8Linear(32, 16)
    other.load_state_dict(foreign)  # loading never fails on it
    with pytest.warns(RuntimeWarning, match="another device type"):
        wgrad(other)


def test_no_grad_forward_skips_the_backward_copies() -> None:
    """Under no_grad nothing runs backward: no column-wise copies, and NVFP4's 16-token rule
    (for the wgrad GEMM's Hadamard transform) does not apply."""
    layer = FP8Linear(32, 16)
    with torch.no_grad(), autocast(recipe=NVFP4BlockScaling()):
        assert layer(torch.randn(3, 8, 32)).shape == (3, 8, 16)  # 24 tokens: fine here
