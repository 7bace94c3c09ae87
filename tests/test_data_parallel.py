"""Data parallelism (``parallel.dp``): DDP and FSDP2 on 2 gloo ranks against one process.

One ``spawn`` runs every multi-rank case in turn (starting processes costs seconds): DDP and
FSDP2 in FP32, BF16 and FP8, FSDP2 with a BF16 ``MixedPrecisionPolicy``, an FSDP2 run that saves
its DCP checkpoint at step 2 and a DDP run that resumes it, and an FSDP2 run that resumes a
single-process checkpoint file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import spawn_workers
import torch
from conftest import cli_train_args, parallel_run_data, short_train_config

from tutorial_lib.__main__ import main
from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.jobs.dp_workers import DPRun, dp_train
from tutorial_lib.jobs.workers import run_jobs
from tutorial_lib.parallel.launch import spawn
from tutorial_lib.parallel.mesh import ParallelDims, local_rows
from tutorial_lib.parallel.shard import ShardMap
from tutorial_lib.parallel.tp_model import TPSpec
from tutorial_lib.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32)
STEPS = 4
# FP32: the same sums in another order (a mean of per-rank means, an all-reduce); BF16 and FP8
# round activations, so a different order of float32 sums moves a loss by a few 1e-5.
REL = {"fp32": 1e-5, "bf16": 1e-4, "fp8": 1e-4}
# Gradient norms: FP8 quantizes each rank's rows on their own (a rank's tensors, its part of the
# amaxes, the other order of sums), so the norm moves by up to a few 1e-3 there.
NORM_REL = {"fp32": 1e-4, "bf16": 1e-3, "fp8": 1e-2}


def _data() -> tuple[torch.Tensor, torch.Tensor, int, int]:
    return parallel_run_data(CFG.block_size)


def _cfg(precision: str) -> TrainConfig:
    return short_train_config(precision, STEPS)


def _single(precision: str, steps: int = STEPS, seed: int = 0) -> Trainer:
    model = build_model(CFG, precision=precision, device="cpu", seed=seed)
    trainer = Trainer(model, TokenData(*_data()), _cfg(precision), device="cpu")
    trainer.train(steps)
    return trainer


def _losses(history: list[dict[str, Any]]) -> list[float]:
    return [float(row["loss"]) for row in history]


def _spawn_runs(tmp: Path) -> dict[str, Any]:
    """Every 2-rank run, in one spawn; rank 0's results by name, plus rank 1's memory."""
    single = _single("fp32", steps=2)
    single.save(tmp / "single.pt")
    data = _data()
    cases = {
        f"{mode}-{p}": DPRun(CFG, data, _cfg(p), mode, measure=p == "fp32")
        for p in ("fp32", "bf16", "fp8")
        for mode in ("ddp", "fsdp")
    }
    cases["fsdp-param-bf16"] = DPRun(CFG, data, _cfg("fp32"), "fsdp", param_dtype=torch.bfloat16)
    # FSDP2 shards the state: a DCP directory, each rank writing its pieces; DDP reads it
    cases["fsdp-save"] = DPRun(CFG, data, _cfg("fp32"), "fsdp", steps=2, save=str(tmp / "dp"))
    cases["ddp-resume"] = DPRun(CFG, data, _cfg("fp32"), "ddp", resume=str(tmp / "dp"), seed=7)
    cases["fsdp-resume"] = DPRun(
        CFG, data, _cfg("fp32"), "fsdp", resume=str(tmp / "single.pt"), seed=7
    )
    jobs = [((0, 1), dp_train, (run,)) for run in cases.values()]
    ranks = spawn(run_jobs, 2, jobs, timeout_s=300)
    out = dict(zip(cases, ranks[0], strict=True))
    out["rank1-memory"] = {k: r["memory"] for k, r in zip(cases, ranks[1], strict=True)}
    out["rows"] = [ranks[r][0]["rows"] for r in (0, 1)]
    out["dp-checkpoint"] = tmp / "dp"
    return out


def test_data_parallel_on_two_ranks(tmp_path: Path) -> None:
    """One spawn (it costs seconds; as one test, xdist cannot start it twice), four checks."""
    runs = _spawn_runs(tmp_path)
    assert runs["rows"] == [(0, 4), (4, 8)]  # each rank trains on its half of the batch of 8
    for mode in ("ddp", "fsdp"):
        for precision in ("fp32", "bf16", "fp8"):
            _check_losses(runs, mode, precision)
    _check_memory(runs)
    _check_fsdp_bf16_parameters(runs)
    _check_checkpoints_move_between_layouts(runs)


def _check_losses(runs: dict[str, Any], mode: str, precision: str) -> None:
    """dp 2 on the same global batch of 8: the losses and gradient norms of one process."""
    ref = _single(precision).history
    got = runs[f"{mode}-{precision}"]["history"]
    where = f"{mode} {precision}"
    assert _losses(got) == pytest.approx(_losses(ref), rel=REL[precision]), where
    norms = [float(r["grad_norm"]) for r in got]
    ref_norms = [float(r["grad_norm"]) for r in ref]
    assert norms == pytest.approx(ref_norms, rel=NORM_REL[precision]), where


def _check_memory(runs: dict[str, Any]) -> None:
    """Measured from the tensors each rank holds: FSDP2 keeps half of DDP's bytes on 2 ranks
    (every parameter's dim 0 here is even), DDP a full copy on each."""
    ddp, fsdp = runs["ddp-fp32"]["memory"], runs["fsdp-fp32"]["memory"]
    n_bytes = 4 * sum(p.numel() for p in build_model(CFG, device="cpu").parameters())
    assert ddp == {"parameters": n_bytes, "gradients": n_bytes, "optimizer": 2 * n_bytes}
    assert fsdp == {k: v // 2 for k, v in ddp.items()}
    assert runs["rank1-memory"]["fsdp-fp32"] == fsdp  # both ranks hold one half


def _check_fsdp_bf16_parameters(runs: dict[str, Any]) -> None:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16): every op in BF16, float32 reductions."""
    ref = _losses(runs["fsdp-fp32"]["history"])
    got = _losses(runs["fsdp-param-bf16"]["history"])
    assert got == pytest.approx(ref, rel=2e-2) and got != ref


def _check_checkpoints_move_between_layouts(runs: dict[str, Any]) -> None:
    """dp 2 (FSDP2) saved at step 2 (a DCP directory) and resumed in one process and under DDP,
    and a single-process checkpoint file resumed under FSDP2: each continues the uninterrupted
    single-process run."""
    ref = _losses(_single("fp32").history)
    resumed = Trainer(
        build_model(CFG, device="cpu", seed=5), TokenData(*_data()), _cfg("fp32"), device="cpu"
    )
    resumed.resume(runs["dp-checkpoint"])
    assert resumed.step == 2
    assert _losses(resumed.train()[2:]) == pytest.approx(ref[2:], rel=1e-6)
    assert _losses(runs["fsdp-resume"]["history"][2:]) == pytest.approx(ref[2:], rel=1e-6)
    assert _losses(runs["ddp-resume"]["history"][2:]) == pytest.approx(ref[2:], rel=1e-6)
    assert sorted(p.name for p in (runs["dp-checkpoint"] / "shards").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]


def test_a_failed_write_and_fp8_on_a_subgroup_raise_on_every_rank() -> None:
    run = DPRun(CFG, _data(), _cfg("fp32"), "ddp")
    out = spawn(spawn_workers.dp_refusals_worker, 2, run, timeout_s=120)
    assert out[0]["write"] == "OSError: disk full (on purpose)"  # its own error
    assert (  # rank 1 raises too, instead of waiting for rank 0's file
        out[1]["write"]
        == "RuntimeError: Rank 0 failed to write the checkpoint: OSError: disk full (on purpose)"
    )
    assert "FP8 ('fp8') on 1 of the 2 processes is not supported yet" in out[0]["fp8"]
    one_rank_tp = ParallelDims(tp=TPSpec(None, ShardMap.even(CFG, 1)))
    with pytest.raises(ValueError, match="Not supported: 'fp16' under tensor parallelism"):
        build_model(CFG, precision="fp16", parallel=one_rank_tp, device="cpu")


def test_a_batch_that_does_not_split_is_refused_with_the_fix() -> None:
    assert local_rows(8, 2, 1) == slice(4, 8)
    with pytest.raises(ValueError, match=r"batch of 6 .* over 4 .* multiple of 4"):
        local_rows(6, 4, 0)
    with pytest.raises(ValueError, match="Unknown data-parallel mode 'zero'"):
        ParallelDims(dp_mode="zero")
    with pytest.raises(ValueError, match="param_dtype is FSDP2's"):
        ParallelDims(dp_mode="ddp", param_dtype=torch.bfloat16)


def test_cli_dp_errors(tmp_path: Path, text_file: Path, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([*cli_train_args(tmp_path, text_file), "--dp", "2"]) == 1
    assert "--dp 2 needs 2 processes, but WORLD_SIZE is 1" in capsys.readouterr().err
    assert main([*cli_train_args(tmp_path, text_file), "--dp", "2", "--tp", "2"]) == 1
    assert "--dp 2 --tp 2 needs 4 processes, but WORLD_SIZE is 1" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main([*cli_train_args(tmp_path, text_file), "--dp", "3"]) == 1
    assert "batch of 4 sequences does not split evenly over 3" in capsys.readouterr().err
    assert main(cli_train_args(tmp_path, text_file)) == 1  # 3 processes and no layout: dp 3
    assert "batch of 4 sequences does not split evenly over 3" in capsys.readouterr().err
    assert main([*cli_train_args(tmp_path, text_file), "--dp", "1"]) == 1
    assert "--dp 1 with 3 processes: each would train alone" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_trains_data_parallel_under_torchrun(tmp_path: Path, text_file: Path) -> None:
    """torchrun with 4 gloo ranks, --dp 2 --tp 2 (FSDP2 over dp): the losses of one process;
    every rank writes its shards of one DCP checkpoint, which a single process resumes (--resume
    at another layout, from the other form of checkpoint) and continues exactly as a single
    process resuming its own checkpoint file does."""
    env = {**os.environ, "TUTORIAL_PRESET": "ci", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    cmd += ["-m", "tutorial_lib", *cli_train_args(tmp_path / "dp", text_file)]
    cmd += ["--dp", "2", "--tp", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("wrote") == 1  # one report, from rank 0
    assert main(cli_train_args(tmp_path / "single", text_file)) == 0
    dp, single = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("dp", "single"))
    assert _losses(dp) == pytest.approx(_losses(single), rel=1e-5)
    written = sorted(p.name for p in (tmp_path / "dp" / "checkpoint" / "shards").iterdir())
    assert written == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    for d in ("dp", "single"):  # one more step each, in one process
        assert main([*cli_train_args(tmp_path / d, text_file), "--steps", "4", "--resume"]) == 0
    dp, single = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("dp", "single"))
    assert len(dp) == len(single) == 4
    assert _losses(dp) == pytest.approx(_losses(single), rel=1e-5)
