"""tutorial_lib.fp8.autocast: when the delayed-scaling state updates (TE's rules), and that the
updates equal a replay of ``update_amax_and_scale`` bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.fp8 import DelayedScaling, autocast, update_amax_and_scale
from tutorial_lib.fp8.autocast import get_autocast_state
from tutorial_lib.fp8.linear import FP8Linear

RECIPE = DelayedScaling(amax_history_len=4)


def _stack(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        FP8Linear(32, 64, amax_history_len=4), nn.GELU(), FP8Linear(64, 16, amax_history_len=4)
    )


def _snapshot(layer: FP8Linear) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in layer.state_dict().items() if k.startswith("fp8_")}


def test_replay_of_the_update_rule_is_bit_exact() -> None:
    model, recipe = _stack(), DelayedScaling(amax_history_len=3, margin=1)
    first, second = model[0], model[2]
    hist = {n: torch.zeros(3, 3) for n in ("a", "b")}
    scale = {n: torch.ones(3) for n in ("a", "b")}
    g_hist, g_scale = torch.zeros(3, 2), torch.ones(2)
    for step in range(5):
        x = torch.randn(8, 32) * (step + 1)
        dy = torch.randn(8, 16) * 10.0**-step
        with autocast(recipe=recipe):
            hidden = model[1](first(x))
            out = second(hidden)
        out.backward(dy)
        for name, layer, inp in (("a", first, x), ("b", second, hidden)):
            row = torch.stack([inp.abs().max(), layer.weight.abs().max(), torch.tensor(0.0)])
            h = hist[name].clone()
            h[0] = row
            hist[name], scale[name] = update_amax_and_scale(h, scale[name], 448.0, 1, "max")
            assert torch.equal(layer.fp8_amax_history_fwd, hist[name]), (step, name)
            assert torch.equal(layer.fp8_scale_fwd, scale[name]), (step, name)
            assert torch.equal(layer.fp8_scale_inv_fwd, 1 / scale[name])
        h = g_hist.clone()
        h[0] = torch.stack([dy.abs().max(), torch.tensor(0.0)])
        g_hist, g_scale = update_amax_and_scale(h, g_scale, 57344.0, 1, "max")
        assert torch.equal(second.fp8_amax_history_bwd, g_hist) and torch.equal(
            second.fp8_scale_bwd, g_scale
        )


def test_forward_state_updates_when_the_outermost_region_exits() -> None:
    model = _stack()
    before = _snapshot(model[0])
    with autocast(recipe=RECIPE):
        with autocast(recipe=RECIPE):
            out = model(torch.randn(8, 32))
        assert get_autocast_state() is not None and get_autocast_state().enabled
        assert torch.equal(model[0].fp8_scale_fwd, before["fp8_scale_fwd"])  # inner exit: no
        assert model[0].fp8_amax_history_fwd[0, 0] > 0  # amax recorded, not yet rolled
    assert get_autocast_state() is None
    assert not torch.equal(model[0].fp8_scale_fwd, before["fp8_scale_fwd"])
    assert model[0].fp8_amax_history_fwd[0].eq(0).all()  # rolled: row 0 cleared
    assert torch.equal(model[0].fp8_scale_bwd, before["fp8_scale_bwd"])  # no backward yet
    out.sum().backward()
    assert not torch.equal(model[0].fp8_scale_bwd, before["fp8_scale_bwd"])


def test_no_update_without_grad_but_amax_recorded() -> None:
    """As TE: the update at exit needs grad enabled; the amax still goes into row 0."""
    model = _stack()
    before = _snapshot(model[0])
    x = torch.randn(8, 32)
    with torch.no_grad(), autocast(recipe=RECIPE):
        model(x)
    after = _snapshot(model[0])
    assert torch.equal(after["fp8_scale_fwd"], before["fp8_scale_fwd"])
    assert after["fp8_amax_history_fwd"][0, 0] == x.abs().max()
    assert torch.equal(after["fp8_amax_history_bwd"], before["fp8_amax_history_bwd"])


def test_backward_state_updates_once_after_the_whole_backward() -> None:
    model = _stack()
    seen: list[float] = []
    with autocast(recipe=RECIPE):
        hidden = model[1](model[0](torch.randn(8, 32)))
        out = model[2](hidden)
    # runs between the two layers' backward passes
    hidden.register_hook(lambda _g: seen.append(float(model[2].fp8_amax_history_bwd[0, 0])))
    out.backward(torch.full_like(out, 2.0))
    assert seen == [2.0]  # the last layer's amax was still in row 0: no update yet
    for layer in (model[0], model[2]):  # both updated by the first layer's backward, once
        assert layer.fp8_amax_history_bwd[0].eq(0).all()
        assert layer.fp8_amax_history_bwd[-1, 0] > 0 and layer.fp8_amax_history_bwd[-2].eq(0).all()
    assert model[2].fp8_scale_bwd[0] == 57344.0 / 2.0


def test_disabled_region_runs_in_high_precision() -> None:
    model = _stack()
    x = torch.randn(8, 32)
    ref = model[2](model[1](F.linear(x, model[0].weight, model[0].bias)))
    with autocast(enabled=False):
        out = model(x)
    assert torch.equal(out, ref)
    out.sum().backward()  # high-precision forward and backward record nothing
    assert model[0].fp8_amax_history_fwd.eq(0).all()
    assert model[0].fp8_amax_history_bwd.eq(0).all()


def test_a_frozen_first_layer_leaves_the_backward_update_to_the_next() -> None:
    """As TE: only a module whose backward will run (input, weight or bias needs grad) claims the
    backward update. blocks.0.attn.qkv runs first but, frozen with an input that needs no grad,
    never runs backward; the other layers' grad_output scales must still update (issue 17)."""
    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)
    model = build_model(cfg, precision="fp8", seed=0)
    first = model.blocks[0]
    for frozen in (model.tok_emb, model.pos_emb, first.ln1, first.attn.qkv):
        frozen.requires_grad_(False)
    idx = torch.randint(
        0, cfg.vocab_size, (8, cfg.block_size), generator=torch.Generator().manual_seed(0)
    )
    with autocast(recipe=RECIPE):
        _, loss = model(idx, idx)
    assert loss is not None
    loss.backward()
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert layers.pop("blocks.0.attn.qkv").fp8_amax_history_bwd.eq(0).all()  # no backward
    assert len(layers) == 7
    for name, layer in layers.items():
        assert layer.fp8_amax_history_bwd[0].eq(0).all(), name  # rolled: row 0 cleared
        assert layer.fp8_amax_history_bwd[-1, 0] > 0, name
        assert layer.fp8_scale_bwd[0] != 1.0, name


def test_inner_region_can_disable_fp8() -> None:
    model = _stack()
    x = torch.randn(8, 32)
    with autocast(recipe=RECIPE), autocast(enabled=False):
        out = model(x)
    assert torch.equal(out, model[2](model[1](F.linear(x, model[0].weight, model[0].bias))))


def test_recipe_must_be_delayed_scaling() -> None:
    with pytest.raises(TypeError, match="DelayedScaling"):
        with autocast(recipe=object()):  # type: ignore[arg-type]
            pass
    assert get_autocast_state() is None
