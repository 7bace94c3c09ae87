"""tutorial_lib.fp8.checkpoint: activation checkpointing of FP8 blocks gives exactly the run
without it (same losses, gradients and scaling state), and plain torch.utils.checkpoint around
an FP8 layer is refused with a message naming the helper (issue 17)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.utils.checkpoint

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.fp8 import DelayedScaling, autocast, checkpoint
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.recipes import Float8BlockScaling
from tutorial_lib.model import GPT

CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)
RECIPE = DelayedScaling(amax_history_len=4)


def _model(checkpointed: bool) -> GPT:
    model = build_model(CFG, precision="fp8", seed=0)
    if checkpointed:  # same parameter names: only each block's forward goes through the helper
        for block in model.blocks:
            block.forward = functools.partial(checkpoint, block.forward)
    return model


def _train(model: GPT, steps: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], int]:
    """Losses, then gradients and the full state dict per step; and FP8Linear forward calls."""
    calls = [0]
    for m in model.modules():
        if isinstance(m, FP8Linear):
            m.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    record: list[torch.Tensor] = []
    for _ in range(steps):
        idx, tgt = torch.randint(0, CFG.vocab_size, (2, 8, CFG.block_size), generator=gen)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            with autocast(recipe=RECIPE):
                _, loss = model(idx, tgt)
        assert loss is not None
        loss.backward()
        record.append(loss.detach().clone())
        record += [p.grad.clone() for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad(set_to_none=True)
        record += [t.clone() for t in model.state_dict().values()]
    return record, calls[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checkpointed_blocks_train_exactly_as_without(dtype: torch.dtype) -> None:
    """The recompute reuses the first forward's scales and records no amax a second time: every
    loss, gradient, weight and scaling buffer is bit for bit the same over 3 steps."""
    ref, ref_calls = _train(_model(False), 3, dtype)
    got, got_calls = _train(_model(True), 3, dtype)
    assert got_calls == 2 * ref_calls  # the blocks really were recomputed
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a, b), i
    model = _model(False)
    _train(model, 1, dtype)
    assert all(  # the scales did move, so reusing the right ones mattered
        not m.fp8_scale_fwd[:2].eq(1).any() for m in model.modules() if isinstance(m, FP8Linear)
    )


def test_plain_torch_checkpoint_is_refused_naming_the_helper() -> None:
    """Its recompute would run outside the FP8 region (torch's CheckpointError in backward)."""
    model = build_model(CFG, precision="fp8", seed=0)
    x = torch.randn(8, CFG.block_size, CFG.n_embd, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"blocks\.0\..*tutorial_lib\.fp8\.checkpoint"):
        with autocast(recipe=RECIPE):
            torch.utils.checkpoint.checkpoint(model.blocks[0], x, use_reentrant=False)
    out = torch.utils.checkpoint.checkpoint(model.blocks[0], x, use_reentrant=False)  # no FP8
    out.sum().backward()


@pytest.mark.parametrize("recipe", [RECIPE, Float8BlockScaling()], ids=["delayed", "block"])
def test_reentrant_torch_checkpoint_is_refused_at_its_recompute(recipe: object) -> None:
    """use_reentrant=True runs the block under no_grad, then recomputes it in the backward pass,
    after the FP8 region has exited: in high precision. The recompute raises, naming the fix."""
    model = build_model(CFG, precision="fp8", seed=0)
    x = torch.randn(8, CFG.block_size, CFG.n_embd, requires_grad=True)
    with autocast(recipe=recipe):
        out = torch.utils.checkpoint.checkpoint(model.blocks[0], x, use_reentrant=True)
    with pytest.raises(
        RuntimeError, match=r"blocks\.0\..*reentrant.*tutorial_lib\.fp8\.checkpoint"
    ):
        out.sum().backward()
    fresh = build_model(CFG, precision="fp8", seed=0)  # never ran FP8: plain high precision
    torch.utils.checkpoint.checkpoint(fresh.blocks[0], x, use_reentrant=True).sum().backward()


def test_the_helper_refuses_nesting_and_reentrant_mode() -> None:
    block = build_model(CFG, precision="fp8", seed=0).blocks[0]
    x = torch.randn(8, CFG.block_size, CFG.n_embd, requires_grad=True)
    with pytest.raises(ValueError, match="non-reentrant"):
        checkpoint(block, x, use_reentrant=True)
    with pytest.raises(RuntimeError, match="cannot be nested"), autocast(recipe=RECIPE):
        checkpoint(lambda y: checkpoint(block, y), x)
    with torch.no_grad(), autocast(recipe=RECIPE):  # no grad: simply runs the function
        assert torch.equal(checkpoint(block, x), block(x))
