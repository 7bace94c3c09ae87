"""2D parallelism (``parallel.mesh``): data parallelism over one mesh dimension, our Megatron
tensor parallelism over the other, on 4 gloo ranks against one process.

One ``spawn`` runs every layout in turn (starting processes costs seconds): dp 2 x tp 2 with
FSDP2 and DDP in FP32, BF16 and FP8, sequence and vocabulary parallelism (fused too),
``torch.compile`` under it, a dp 2 x tp 2 run saved at step 3 and resumed at dp 1 x tp 3
(uneven heads and vocabulary; it saves too, from 3 of the 4 processes) and at tp 2; the main
process resumes both checkpoints alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import parallel_run_data, short_train_config

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.jobs.dp_workers import DPRun, dp_train
from tutorial_lib.jobs.workers import run_jobs
from tutorial_lib.parallel.launch import spawn
from tutorial_lib.parallel.mesh import check_layout
from tutorial_lib.train import TrainConfig, Trainer

# 4 heads: tp 2 gives 2 heads per rank, tp 3 gives (2, 1, 1); FP8's shape rule holds at tp 2
CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_embd=32)
STEPS = 6
ALL = (0, 1, 2, 3)
# FP32: the same sums in another order; BF16 rounds activations (a different order of float32
# sums moves a loss by ~1e-5); FP8 quantizes each rank's slices with the shared amax-derived
# scales (delayed) or the slice's own (current: the per-slice scale differs from one process's).
REL = {"fp32": 1e-5, "bf16": 1e-4, "fp8": 2e-4}  # FP8 measured: 6.8e-5
NORM_REL = {"fp32": 1e-4, "bf16": 3e-3, "fp8": 2e-2}  # gradient norms; BF16 under SP: 1.4e-3


def _data() -> tuple[torch.Tensor, torch.Tensor, int, int]:
    return parallel_run_data(CFG.block_size)


def _cfg(precision: str) -> TrainConfig:
    return short_train_config(precision, STEPS)


def _single(precision: str) -> list[float]:
    return _losses(_single_history(precision))


def _single_history(precision: str) -> list[dict[str, Any]]:
    model = build_model(CFG, precision=precision, device="cpu", seed=0)
    return Trainer(model, TokenData(*_data()), _cfg(precision), device="cpu").train()


def _losses(history: list[dict[str, Any]]) -> list[float]:
    return [float(row["loss"]) for row in history]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("mesh")
    data = _data()
    jobs: dict[str, tuple[tuple[int, ...], DPRun]] = {}
    for precision in ("fp32", "bf16", "fp8"):  # the other recipes: tests/test_composition.py
        jobs[f"fsdp-{precision}"] = (ALL, DPRun(CFG, data, _cfg(precision), "fsdp", tp=2))
    jobs["ddp-fp32"] = (ALL, DPRun(CFG, data, _cfg("fp32"), "ddp", tp=2))
    split = {"sequence_parallel": True, "vocab_parallel": True}  # parallel.tp.TPGPT
    for precision in ("fp32", "bf16", "fp8"):
        jobs[f"sp-vocab-{precision}"] = (ALL, DPRun(CFG, data, _cfg(precision), tp=2, **split))
    compiled = DPRun(CFG, data, _cfg("fp8"), "fsdp", steps=3, tp=2, compile=True)
    jobs["fsdp-compile-fp8"] = (ALL, compiled)  # compiled under FSDP2 x TP
    # and under DDP (composable replicate) over 2 data-parallel ranks, without TP
    jobs["ddp-compile"] = ((0, 1), DPRun(CFG, data, _cfg("fp32"), "ddp", steps=3, compile=True))
    sp_fused = DPRun(CFG, data, _cfg("fp32"), steps=2, tp=2, fused=True, sequence_parallel=True)
    jobs["sp-fused"] = (ALL, sp_fused)  # 2 steps: Triton's interpreter is slow
    # TP shards the state: each checkpoint is a DCP directory, every rank writing its pieces
    save, save3 = str(tmp / "dp2tp2"), str(tmp / "tp3")  # tp3: saved by 3 of 4 ranks
    jobs["save"] = (ALL, DPRun(CFG, data, _cfg("fp32"), steps=3, save=save, tp=2, **split))
    jobs["same"] = (ALL, DPRun(CFG, data, _cfg("fp32"), resume=save, tp=2, seed=9, **split))
    jobs["tp3"] = (
        (0, 1, 2),
        DPRun(CFG, data, _cfg("fp32"), resume=save, tp=3, seed=9, vocab_parallel=True, save=save3),
    )
    jobs["tp2"] = ((0, 1), DPRun(CFG, data, _cfg("fp32"), "ddp", resume=save, tp=2, seed=9))
    single = tmp / "single.pt"  # a one-process file, resumed at dp 2 x tp 2
    model = build_model(CFG, device="cpu", seed=0)
    alone = Trainer(model, TokenData(*data), _cfg("fp32"), device="cpu")
    alone.train(3)
    alone.save(single)
    jobs["from-file"] = (ALL, DPRun(CFG, data, _cfg("fp32"), resume=str(single), tp=2, seed=9))
    fp8_dir = str(tmp / "fp8")  # FP8's scaling state (amax histories, scales) through DCP
    jobs["fp8-save"] = (ALL, DPRun(CFG, data, _cfg("fp8"), steps=3, save=fp8_dir, tp=2))
    jobs["fp8-same"] = (ALL, DPRun(CFG, data, _cfg("fp8"), resume=fp8_dir, seed=9, tp=2))
    ranks = spawn(run_jobs, 4, [(r, dp_train, (run,)) for r, run in jobs.values()], timeout_s=600)
    out = dict(zip(jobs, ranks[0], strict=True))
    out["checkpoint"], out["tp3-checkpoint"] = Path(save), Path(save3)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_sequence_and_vocabulary_parallel(runs: dict[str, Any], precision: str) -> None:
    """dp 2 x tp 2 with the LayerNorms and residuals on sequence slices and the embedding, head
    and loss split over the vocabulary: one process's losses."""
    history, ref = runs[f"sp-vocab-{precision}"]["history"], _single_history(precision)
    assert _losses(history) == pytest.approx(_losses(ref), rel=REL[precision])
    norms = [float(r["grad_norm"]) for r in history]  # clipping counts each shard once
    ref_norms = [float(r["grad_norm"]) for r in ref]
    assert norms == pytest.approx(ref_norms, rel=NORM_REL[precision])


def test_sequence_parallel_with_fused_kernels(runs: dict[str, Any]) -> None:
    model = build_model(CFG, fused=True, device="cpu", seed=0)
    ref = _losses(Trainer(model, TokenData(*_data()), _cfg("fp32"), device="cpu").train(2))
    assert _losses(runs["sp-fused"]["history"]) == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_dp2_tp2_reproduces_one_process(runs: dict[str, Any], precision: str) -> None:
    """4 processes, dp 2 x tp 2, FSDP2 over dp: one process's losses on the same global batch."""
    got = _losses(runs[f"fsdp-{precision}"]["history"])
    assert len(got) == STEPS
    assert got == pytest.approx(_single(precision), rel=REL[precision])


def test_ddp_and_compiled_under_tp(runs: dict[str, Any]) -> None:
    """DDP over the data-parallel dimension; torch.compile under DDP (``replicate``'s hooks around
    the compiled module) and under FSDP2 x TP in FP8 (Dynamo around the collectives and around
    FP8Linear's graph breaks); 3 steps: compiling on a CPU takes tens of seconds."""
    assert _losses(runs["ddp-fp32"]["history"]) == pytest.approx(_single("fp32"), rel=1e-5)
    assert _losses(runs["ddp-compile"]["history"]) == pytest.approx(_single("fp32")[:3], rel=1e-5)
    compiled = _losses(runs["fsdp-compile-fp8"]["history"])
    assert compiled == pytest.approx(_single("fp8")[:3], rel=REL["fp8"])


def test_a_dp2_tp2_checkpoint_resumes_at_any_layout(runs: dict[str, Any]) -> None:
    """Saved at step 3 as dp 2 x tp 2 (sequence- and vocabulary-parallel) with DCP: every rank
    wrote its own pieces of each tensor. Resumed at the same layout, steps 4 to 6 are the
    uninterrupted run's bit for bit; alone, at dp 1 x tp 3 (heads 2, 1, 1; vocabulary 86, 85,
    85) and at tp 2 (vocabulary replicated), one process's within float32's reordering; and a
    one-process checkpoint file resumes at dp 2 x tp 2."""
    path, ref = runs["checkpoint"], _single("fp32")
    assert sorted(p.name for p in path.iterdir()) == ["run.pt", "shards"]
    assert len(list((path / "shards").glob("*.distcp"))) == 4  # one file per rank
    straight = _losses(runs["sp-vocab-fp32"]["history"])
    assert _losses(runs["same"]["history"][3:]) == straight[3:]
    alone = Trainer(
        build_model(CFG, device="cpu", seed=5), TokenData(*_data()), _cfg("fp32"), device="cpu"
    )
    alone.resume(path)
    assert alone.step == 3
    assert _losses(alone.train()[3:]) == pytest.approx(ref[3:], rel=1e-5)
    alone = Trainer(  # the tp 3 run's own checkpoint, written by 3 of the 4 processes
        build_model(CFG, device="cpu", seed=5), TokenData(*_data()), _cfg("fp32"), device="cpu"
    )
    alone.resume(runs["tp3-checkpoint"])
    assert alone.step == STEPS
    assert _losses(alone.history) == pytest.approx(ref, rel=1e-5)
    for layout in ("tp3", "tp2", "from-file"):
        history = runs[layout]["history"]
        assert [int(r["step"]) for r in history[3:]] == [3, 4, 5], layout  # counted from 0
        assert _losses(history[3:]) == pytest.approx(ref[3:], rel=1e-5), layout


def test_a_sharded_fp8_checkpoint_restores_the_scaling_state(runs: dict[str, Any]) -> None:
    """FP8 with delayed scaling, dp 2 x tp 2, saved with DCP at step 3 and resumed at the same
    layout: steps 4 to 6 are the uninterrupted run's bit for bit, so the amax histories and
    scales (which decide every quantization) came back exactly."""
    straight = _losses(runs["fsdp-fp8"]["history"])
    assert _losses(runs["fp8-same"]["history"][3:]) == straight[3:]


def test_bad_layouts_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"--dp 2 --tp 2 needs 4 processes, but WORLD_SIZE is 3"):
        check_layout(2, 2, 3)
    with pytest.raises(ValueError, match=r"--tp 8 needs at least one attention head per rank"):
        check_layout(1, 8, 8, CFG)
