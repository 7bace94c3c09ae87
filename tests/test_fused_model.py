"""The GPT on our Triton kernels (``kernels.fused``) and under ``torch.compile``, built by
``build_model``: same function, same parameters, same training, alone and combined with BF16 and
FP8; and the Trainer refuses a model built for another precision.

Kernels run in Triton's interpreter here (no GPU); compiled steps use Inductor's C++ backend.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import TINY
from torch import nn

from tutorial_lib.build import ModelRecipe, build_model
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.policy import FP8_LOSS_TOLERANCE
from tutorial_lib.kernels.fused import (
    AddNormBlock,
    BiasGELUMLP,
    TritonCrossEntropy,
    TritonGELU,
    TritonLayerNorm,
    TritonLayers,
)
from tutorial_lib.layers import GELU, CrossEntropy
from tutorial_lib.model import GPT, MLP
from tutorial_lib.precision import BF16_LOSS_TOLERANCE
from tutorial_lib.train import TrainConfig, Trainer

# Widths divisible by 16 for the FP8 combinations.
FP8_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)


def _pair(cfg: GPTConfig, seed: int = 0) -> tuple[GPT, GPT]:
    torch.manual_seed(seed)
    eager = GPT(cfg)
    fused = GPT(cfg, layers=TritonLayers())
    fused.load_state_dict(eager.state_dict())
    return eager, fused


def _batch(cfg: GPTConfig, b: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(cfg.vocab_size, (b, cfg.block_size + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def test_factory_builds_triton_modules_with_the_same_state_dict() -> None:
    eager, fused = _pair(TINY)
    assert eager.state_dict().keys() == fused.state_dict().keys()
    block = fused.blocks[0]
    assert isinstance(block.ln1, TritonLayerNorm) and isinstance(block.ln2, TritonLayerNorm)
    assert isinstance(block.mlp.act, TritonGELU) and isinstance(fused.loss_fn, TritonCrossEntropy)
    assert type(block.mlp.fc) is nn.Linear  # GEMMs stay cuBLAS/ATen


def test_fused_forward_and_gradients_match_eager() -> None:
    eager, fused = _pair(TINY)
    x, y = _batch(TINY)
    logits_e, loss_e = eager(x, y)
    logits_f, loss_f = fused(x, y)
    # FP32 throughout; the kernels sum in a different order than ATen: ~1e-6 relative.
    torch.testing.assert_close(logits_f, logits_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_f, loss_e, rtol=1e-5, atol=1e-6)
    loss_e.backward()
    loss_f.backward()
    for (name, pe), pf in zip(eager.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(pf.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_build_model_fused_has_the_eager_weights_and_no_eager_modules() -> None:
    eager = build_model(TINY, seed=0)
    fused = build_model(TINY, fused=True, seed=0)
    assert fused.recipe == ModelRecipe(precision="fp32", fused=True)
    for (name, pe), (_, pf) in zip(eager.named_parameters(), fused.named_parameters(), strict=True):
        assert torch.equal(pe, pf), name  # same seed, same initial weights
    kinds = {type(m) for m in fused.modules()}
    assert nn.LayerNorm not in kinds and GELU not in kinds and CrossEntropy not in kinds
    assert sum(isinstance(m, TritonLayerNorm) for m in fused.modules()) == 2 * TINY.n_layer + 1
    assert all(type(b) is AddNormBlock and type(b.mlp) is BiasGELUMLP for b in fused.blocks)


def test_layernorm_without_bias_builds_too() -> None:
    cfg = GPTConfig(vocab_size=256, block_size=29, n_layer=1, n_head=3, n_embd=36, bias=False)
    eager = build_model(cfg, seed=0)
    fused = build_model(cfg, fused=True, seed=0)
    assert type(fused.blocks[0].mlp) is MLP  # no fc bias to fold into the GELU kernel
    x, y = _batch(cfg)
    torch.testing.assert_close(fused(x, y)[1], eager(x, y)[1], rtol=1e-5, atol=1e-6)


def _train(
    data: TokenData, precision: str, steps: int, cfg: GPTConfig = TINY, **opts: bool
) -> Trainer:
    tc = TrainConfig(
        steps=steps,
        batch_size=4,
        lr=3e-3,
        warmup_steps=1,
        eval_every=0,
        precision=precision,
        progress=False,
    )
    model = build_model(cfg, precision=precision, device="cpu", seed=0, **opts)
    trainer = Trainer(model, data, tc, device="cpu")
    trainer.train()
    return trainer


def test_trainer_refuses_a_model_built_for_another_precision(
    data_factory: Callable[..., TokenData],
) -> None:
    tc = TrainConfig(steps=1, batch_size=2, eval_every=0, precision="fp8", progress=False)
    data = data_factory(block_size=FP8_CFG.block_size)
    with pytest.raises(ValueError, match=r"build_model\(cfg, precision='fp8'\)"):
        Trainer(GPT(FP8_CFG), data, tc, device="cpu")  # plain Linear layers: no FP8 GEMMs
    with pytest.raises(ValueError, match="built for precision 'bf16'.*precision is 'fp8'"):
        Trainer(build_model(FP8_CFG, precision="bf16"), data, tc, device="cpu")


def _losses(trainer: Trainer) -> list[float]:
    return [float(r["loss"]) for r in trainer.history]  # type: ignore[arg-type]


def test_fused_training_matches_eager_fp32(data_factory: Callable[..., TokenData]) -> None:
    eager = _train(data_factory(), "fp32", 4)
    fused = _train(data_factory(), "fp32", 4, fused=True)
    assert _losses(fused) == pytest.approx(_losses(eager), abs=1e-4)


@pytest.mark.slow
def test_compiled_training_matches_eager_and_saves_plain_keys(
    data_factory: Callable[..., TokenData], tmp_path
) -> None:
    eager = _train(data_factory(), "fp32", 4)
    compiled = _train(data_factory(), "fp32", 4, compile=True)
    # Inductor reorders FP32 reductions: equal to a few ulps, not bit for bit.
    assert _losses(compiled) == pytest.approx(_losses(eager), abs=1e-4)
    assert compiled.compile_time_s is not None and compiled.compile_time_s > 0
    assert eager.compile_time_s is None
    state = load_checkpoint(compiled.save(tmp_path / "checkpoint.pt"))["model"]
    assert not any(k.startswith("_orig_mod") for k in state)
    assert state.keys() == eager.model.state_dict().keys()


def test_fused_bf16_stays_within_the_bf16_tolerance(
    data_factory: Callable[..., TokenData],
) -> None:
    eager = _train(data_factory(), "bf16", 3)
    fused = _train(data_factory(), "bf16", 3, fused=True)
    for a, b in zip(_losses(fused), _losses(eager), strict=True):
        assert abs(a - b) < BF16_LOSS_TOLERANCE


def test_fused_combines_with_fp8(data_factory: Callable[..., TokenData]) -> None:
    data = data_factory(block_size=FP8_CFG.block_size)
    fp8 = _train(data, "fp8", 3, cfg=FP8_CFG)
    both = _train(data_factory(block_size=FP8_CFG.block_size), "fp8", 3, cfg=FP8_CFG, fused=True)
    mlp = both.model.blocks[0].mlp
    assert isinstance(mlp.fc, FP8Linear) and isinstance(mlp.act, TritonGELU)
    assert type(mlp) is MLP  # the FP8 GEMM adds fc's bias: not folded into the GELU kernel
    assert isinstance(both.model.blocks[0].ln2, TritonLayerNorm)
    for a, b in zip(_losses(both), _losses(fp8), strict=True):
        assert abs(a - b) < FP8_LOSS_TOLERANCE
    # The FP8 scaling state still advances (it is what a checkpoint restores).
    assert float(mlp.fc.fp8_state.forward.amax_history.abs().sum()) > 0


@pytest.mark.slow
def test_compile_combines_with_fp8(data_factory: Callable[..., TokenData]) -> None:
    data = data_factory(block_size=FP8_CFG.block_size)
    fp8 = _train(data, "fp8", 3, cfg=FP8_CFG)
    both = _train(data_factory(block_size=FP8_CFG.block_size), "fp8", 3, cfg=FP8_CFG, compile=True)
    for a, b in zip(_losses(both), _losses(fp8), strict=True):
        assert abs(a - b) < FP8_LOSS_TOLERANCE


def test_build_model_refuses_what_cannot_combine(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutorial_lib.build as build_mod
    from tutorial_lib.parallel.mesh import ParallelDims
    from tutorial_lib.parallel.shard import ShardMap
    from tutorial_lib.parallel.tp_model import TPSpec

    calls = []

    def parallelize(model: GPT, group: object, shard_map: ShardMap, fused: bool, sp: bool) -> GPT:
        calls.append(fused)  # stands in for tp_model.parallelize: told about the fused kernels
        return model

    monkeypatch.setattr(build_mod, "parallelize", parallelize)
    two_ranks = ParallelDims(tp=TPSpec(None, ShardMap.even(TINY, 2)))
    model = build_model(TINY, fused=True, parallel=two_ranks)
    assert calls == [True] and model.recipe.tp == 2
    one_rank = ParallelDims(tp=TPSpec(None, ShardMap.even(TINY, 1)))
    with pytest.raises(ValueError, match="Not supported: 'te-fp8' under our tensor parallelism"):
        build_model(TINY, precision="te-fp8", parallel=one_rank)
    with pytest.raises(ValueError, match="Unknown precision policy 'fp7'"):
        build_model(TINY, precision="fp7")
