"""Tensor parallelism on torch.distributed (gloo, CPU processes): operators, layers, the GPT.

Starting processes costs seconds (each imports torch), so one module-scoped spawn of 4 ranks
runs every distributed check (``workers.run_jobs``, on groups of 2, 3 and 4 ranks) and the
tests below assert on its results. The reference is always the single-process model in float32.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import spawn_workers
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import cli_train_args
from filelock import FileLock
from torch import nn

from tutorial_lib.__main__ import main
from tutorial_lib.build import build_model
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData, make_data
from tutorial_lib.jobs import workers
from tutorial_lib.model import GPT
from tutorial_lib.parallel.comm import copy_to_tp, reduce_from_tp
from tutorial_lib.parallel.launch import SpawnError, init_from_env, spawn
from tutorial_lib.parallel.mesh import ParallelDims
from tutorial_lib.parallel.shard import ShardMap, UnitSpec, unit_specs
from tutorial_lib.parallel.tp_linear import ColumnParallelLinear, RowParallelLinear
from tutorial_lib.parallel.tp_model import TPSpec, gather_full, parallelize, shard_state_dict
from tutorial_lib.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=6, n_embd=48)  # hs 8, FFN 192
TOL = {"rtol": 1e-5, "atol": 1e-5}

# Shard maps: even, uneven (6 heads on 4 ranks: 2, 2, 1, 1), non-contiguous, and both at once.
ROUND_ROBIN_3 = ShardMap.from_units(
    CFG, [(0, 3), (1, 4), (2, 5)], [tuple(range(r, 192, 3)) for r in range(3)]
)
_perm = torch.randperm(192, generator=torch.Generator().manual_seed(0)).tolist()
SCATTERED_4 = ShardMap.from_units(
    CFG, [(5,), (0, 2), (4, 1), (3,)], [_perm[:100], _perm[100:150], _perm[150:180], _perm[180:]]
)
UNEVEN_2 = ShardMap.from_units(CFG, [(0, 1, 2, 3), (4, 5)], [range(150), range(150, 192)])
NO_BIAS = dataclasses.replace(CFG, bias=False)
GPT_CASES = {  # name: (global ranks of the TP group, model config, shard map)
    "tp2-even": ((0, 1), CFG, ShardMap.even(CFG, 2)),
    "tp2-no-bias": ((2, 3), NO_BIAS, UNEVEN_2),
    "tp3-round-robin": ((1, 2, 3), CFG, ROUND_ROBIN_3),  # a group that does not start at rank 0
    "tp4-even-2211": ((0, 1, 2, 3), CFG, ShardMap.even(CFG, 4)),
    "tp4-scattered": ((0, 1, 2, 3), CFG, SCATTERED_4),
}
OP_SHAPE = (2, 8, 3)  # (B, T, C); T splits evenly over 4 ranks
QKV_SPEC, QKV_UNITS = UnitSpec("heads", 0, 3, 4), ((0, 2), (1,))  # 3 heads of width 4, uneven
ROW_SPEC, ROW_UNITS = UnitSpec("ffn", 1, 1, 1), ((0, 2, 4), (1, 3))  # 5 columns, interleaved


def _model_and_batch(
    seed: int = 0, cfg: GPTConfig = CFG
) -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    x, y = (torch.randint(CFG.vocab_size, (3, CFG.block_size), generator=g) for _ in range(2))
    return model, (x, y)


def _reference(model: GPT, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    model.zero_grad()
    logits, loss = model(*batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def _linear_inputs(kind: str) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    full = nn.Linear(10, 36) if kind == "column" else nn.Linear(5, 7)
    nn.init.normal_(full.bias)
    x, dy = torch.randn(2, 3, full.in_features), torch.randn(2, 3, full.out_features)
    return full, x, dy


def _train_data(corpus: bytes) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    tokens = torch.frombuffer(bytearray(corpus[:60_000]), dtype=torch.uint8) % CFG.vocab_size
    return tokens[:50_000], tokens[50_000:], CFG.block_size, 0


TRAIN_CFG = TrainConfig(
    steps=3,
    batch_size=4,
    lr=1e-2,
    warmup_steps=1,
    grad_clip=0.3,
    eval_every=3,
    eval_iters=2,
    progress=False,
)


@pytest.fixture(scope="session")
def dist_results(
    corpus: bytes, tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> dict[str, Any]:
    """Every distributed check, in one spawn of 4 gloo ranks; results per job and rank.

    Under pytest-xdist the first worker that needs them runs the spawn and saves the results
    where the other workers look (xdist's recipe for a once-per-run fixture), so two workers
    do not each start 4 processes on the same few cores.
    """
    if worker_id == "master":
        return _run_dist_checks(corpus)
    path = tmp_path_factory.getbasetemp().parent / "tp_dist_results.pt"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            torch.save(_run_dist_checks(corpus), path)
        return torch.load(path, weights_only=False)


def _run_dist_checks(corpus: bytes) -> dict[str, Any]:
    model, batch = _model_and_batch()
    sd = model.state_dict()
    jobs: dict[str, workers.WorkerJob] = {
        "ops4": ((0, 1, 2, 3), workers.operators_check, (OP_SHAPE,)),
        "ops3": ((1, 2, 3), workers.operators_check, ((2, 6, 3),)),
        "reduce_scatter": ((0, 1, 2, 3), spawn_workers.reduce_scatter_paths, (OP_SHAPE,)),
        "column": (
            (2, 3),
            spawn_workers.parallel_linear_check,
            ("column", QKV_SPEC, QKV_UNITS, *_linear_inputs("column")),
        ),
        "row": (
            (2, 3),
            spawn_workers.parallel_linear_check,
            ("row", ROW_SPEC, ROW_UNITS, *_linear_inputs("row")),
        ),
        "train": (
            (0, 1),
            spawn_workers.tp_train_steps,
            (CFG, UNEVEN_2, sd, _train_data(corpus), TRAIN_CFG, torch.float64),
        ),
    }
    from tutorial_lib.parallel.dtensor_tp import compare_with_megatron

    jobs["vocab"] = ((1, 2, 3), spawn_workers.vocab_and_region_check, (VOCAB_TOKENS, VOCAB_SIZE))
    jobs["sp_generate"] = ((1, 2, 3), spawn_workers.sp_generation_check, (SP_CFG, (1, 5, 8)))
    jobs["dtensor"] = ((0, 1), compare_with_megatron, (DT_CFG, 3))
    jobs["dtensor_sp"] = ((2, 3), compare_with_megatron, (DT_CFG, 3, True))
    jobs["dtensor2d"] = ((0, 1, 2, 3), spawn_workers.dtensor_fsdp_losses, (DT_CFG, 3))  # dp 2 tp 2
    for name, (ranks, cfg, shard_map) in GPT_CASES.items():
        model, batch = _model_and_batch(cfg=cfg)
        jobs[name] = (
            ranks,
            workers.tp_forward_backward,
            (cfg, shard_map, batch, model.state_dict()),
        )
    results = spawn(workers.run_jobs, 4, list(jobs.values()), timeout_s=180)
    return {
        name: [per_rank[i] for per_rank in results if per_rank[i] is not None]
        for i, name in enumerate(jobs)
    }


# ---- operators --------------------------------------------------------------------------------
@pytest.mark.parametrize("job", ["ops4", "ops3"])
def test_operators_forward_backward(dist_results: dict[str, Any], job: str) -> None:
    out = dist_results[job]
    n = len(out)
    xs = [o["copy"]["x"] for o in out]
    total_x = sum(xs)
    for r, o in enumerate(out):
        # f: identity forward, all-reduce backward
        assert torch.equal(o["copy"]["y"], xs[r])
        assert torch.allclose(o["copy"]["dx"], sum(p["copy"]["dy"] for p in out))
        # g: all-reduce forward, identity backward
        assert torch.allclose(o["reduce"]["y"], total_x)
        assert torch.equal(o["reduce"]["dx"], o["reduce"]["dy"])
        # sequence parallel: all-gather forward / reduce-scatter backward, and the converse
        assert torch.equal(o["gather"]["y"], torch.cat(xs, dim=1))
        dy_sum = sum(p["gather"]["dy"] for p in out)
        assert torch.allclose(o["gather"]["dx"], dy_sum.chunk(n, dim=1)[r])
        assert torch.allclose(o["scatter"]["y"], total_x.chunk(n, dim=1)[r])
        assert torch.equal(o["scatter"]["dx"], torch.cat([p["scatter"]["dy"] for p in out], 1))
        assert "even splits" in o["uneven_error"] and f"which {n} ranks" in o["uneven_error"]


def test_both_reduce_scatter_paths_give_the_sum_slice(dist_results: dict[str, Any]) -> None:
    """``dist.reduce_scatter`` and the all-reduce + slice fallback (gloo builds without the
    first) both give rank r the r-th slice of the sum over ranks of ``x * (rank + 1)``."""
    out = dist_results["reduce_scatter"]
    n = len(out)
    base = torch.arange(torch.Size(OP_SHAPE).numel(), dtype=torch.float64).reshape(OP_SHAPE)
    total = base * (n * (n + 1) // 2)
    for r, o in enumerate(out):
        assert torch.equal(o["reduce_scatter"], total.chunk(n, dim=1)[r])
        assert torch.equal(o["by_all_reduce"], o["reduce_scatter"])


def test_operators_are_identities_without_group() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    for op in (copy_to_tp, reduce_from_tp):
        y = op(x, None)
        y.sum().backward()
        assert torch.equal(y, x) and torch.equal(x.grad, torch.ones_like(x))
        x.grad = None


# ---- layers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["column", "row"])
def test_parallel_linear_matches_nn_linear(dist_results: dict[str, Any], kind: str) -> None:
    full, x, dy = _linear_inputs(kind)
    xr = x.clone().requires_grad_()
    y = full(xr)
    y.backward(dy)
    out = dist_results[kind]
    if kind == "column":  # each rank: its output columns, weight rows and bias; dx summed by f
        for o in out:
            assert torch.allclose(o["y"], y.detach().index_select(-1, o["index"]), **TOL)
            assert torch.allclose(o["dW"], full.weight.grad.index_select(0, o["index"]), **TOL)
            assert torch.allclose(o["db"], full.bias.grad.index_select(0, o["index"]), **TOL)
            assert torch.allclose(o["dx"], xr.grad, **TOL)
    else:  # each rank: the full output (g), its weight columns and dx slice; bias replicated
        for o in out:
            assert torch.allclose(o["y"], y.detach(), **TOL)
            assert torch.allclose(o["dW"], full.weight.grad.index_select(1, o["index"]), **TOL)
            assert torch.allclose(o["db"], full.bias.grad, **TOL)
            assert torch.allclose(o["dx"], xr.grad.index_select(-1, o["index"]), **TOL)


def test_parallel_linear_shapes_follow_the_unit_spec() -> None:
    col = ColumnParallelLinear(10, 36, True, None, QKV_SPEC, (0, 2), 3)
    row = RowParallelLinear(5, 7, True, None, ROW_SPEC, (1, 3), 5)
    assert col.weight.shape == (3 * 2 * 4, 10) and col.bias.shape == (24,)
    assert row.weight.shape == (7, 2) and row.bias.shape == (7,)
    assert col.shard_index().tolist()[:8] == [0, 1, 2, 3, 8, 9, 10, 11]  # Q of heads 0 and 2
    with pytest.raises(ValueError, match="does not match the unit layout"):
        ColumnParallelLinear(10, 35, True, None, QKV_SPEC, (0, 2), 3)


# ---- the GPT ----------------------------------------------------------------------------------
def _assert_matches_reference(result: dict[str, Any], ref: dict[str, Any], sd: dict) -> None:
    assert torch.allclose(result["logits"], ref["logits"], **TOL)
    assert torch.allclose(result["loss"], ref["loss"], **TOL)
    assert result["grads"].keys() == ref["grads"].keys()
    for name, g in ref["grads"].items():
        assert torch.allclose(result["grads"][name], g, **TOL), name
    for name, p in sd.items():  # gather_full(shard(...)) is the identity
        assert torch.equal(result["state_dict"][name], p), name


@pytest.mark.parametrize("case", list(GPT_CASES))
def test_tp_gpt_matches_single_process(dist_results: dict[str, Any], case: str) -> None:
    ranks, cfg, shard_map = GPT_CASES[case]
    model, batch = _model_and_batch(cfg=cfg)
    ref = _reference(model, batch)
    out = dist_results[case]
    assert [o["rank"] for o in out] == list(range(len(ranks)))
    specs = unit_specs(cfg)
    for r, o in enumerate(out):  # every rank holds the same full results
        _assert_matches_reference(o, ref, model.state_dict())
        qkv = o["local_shapes"]["blocks.0.attn.qkv.weight"]
        fc = o["local_shapes"]["blocks.1.mlp.fc.weight"]
        assert qkv == (3 * len(shard_map.heads[r]) * specs["attn.qkv.weight"].width, 48)
        assert fc == (len(shard_map.ffn[r]), 48)


def test_tp1_in_process_is_the_model() -> None:
    model, batch = _model_and_batch()
    ref = _reference(model, batch)
    tp_model = parallelize(model, None, ShardMap.even(CFG, 1))
    res = _reference(tp_model, batch)
    assert torch.equal(res["logits"], ref["logits"]) and torch.equal(res["loss"], ref["loss"])
    for name, g in ref["grads"].items():
        assert torch.equal(res["grads"][name], g), name
    full = gather_full(tp_model.state_dict(), CFG, None, ShardMap.even(CFG, 1))
    assert all(torch.equal(full[k], v) for k, v in model.state_dict().items())


def test_shard_state_dict_slices_by_units() -> None:
    model, _ = _model_and_batch()
    sd = model.state_dict()
    shard = shard_state_dict(sd, CFG, ROUND_ROBIN_3, rank=1)  # heads (1, 4)
    w = shard["blocks.0.attn.qkv.weight"].view(3, 2, 8, 48)  # (Q/K/V, my heads, hs, C)
    full = sd["blocks.0.attn.qkv.weight"].view(3, 6, 8, 48)
    assert torch.equal(w, full[:, [1, 4]])
    assert torch.equal(shard["blocks.0.mlp.proj.weight"], sd["blocks.0.mlp.proj.weight"][:, 1::3])
    assert shard["blocks.0.mlp.proj.bias"] is sd["blocks.0.mlp.proj.bias"]  # replicated


# ---- training ---------------------------------------------------------------------------------
def test_tp_trainer_matches_trainer(dist_results: dict[str, Any], corpus: bytes) -> None:
    """Three AdamW steps with the gradient clipped (so the norm must span both ranks' shards).

    In float64: AdamW divides by the root of the second moment, so for a weight whose gradient
    is near zero it turns float32 rounding (which differs between CPUs' kernels, and between a
    sharded and an unsharded matmul) into an update of order lr. In float64 that rounding is
    ~1e-16 of the gradient, far below AdamW's eps (1e-8), where the update stops being a sign;
    so the comparison is tight on every CPU (checked with torch's lower-ISA kernels too).
    """
    model, _ = _model_and_batch()
    model = model.double()
    ref = Trainer(model, TokenData(*_train_data(corpus)), TRAIN_CFG, device="cpu")
    ref_history = ref.train()
    assert all(row["grad_norm"] > TRAIN_CFG.grad_clip for row in ref_history)  # clipping on
    for o in dist_results["train"]:
        for got, want in zip(o["history"], ref_history, strict=True):
            for key in ("loss", "grad_norm", "val_loss"):
                if want[key] is None:
                    assert got[key] is None, key
                else:
                    assert got[key] == pytest.approx(want[key], rel=1e-10, abs=1e-12), key
        for name, p in ref.model.state_dict().items():
            assert o["state_dict"][name].dtype == torch.float64, name
            assert torch.allclose(o["state_dict"][name], p, rtol=1e-9, atol=1e-12), name


def test_a_tp_models_checkpoint_resumes(tmp_path: Path, corpus: bytes) -> None:
    """A TP 1 model's checkpoint is a file a plain GPT loads; the TP trainer resumes it
    (sharded layouts, DCP directories: test_parallel_2d)."""
    dims = ParallelDims(tp=TPSpec(None, ShardMap.even(CFG, 1)))
    cfg = TrainConfig(steps=2, batch_size=2, eval_every=0, progress=False)

    def tp_trainer(seed: int) -> Trainer:
        model = build_model(CFG, parallel=dims, device="cpu", seed=seed)
        data = TokenData(*_train_data(corpus))
        return Trainer(model, data, cfg, device="cpu", out_dir=tmp_path)

    trainer = tp_trainer(0)
    trainer.train(1)
    trainer.save(tmp_path / "step1.pt")
    state = load_checkpoint(tmp_path / "step1.pt")
    GPT(CFG).load_state_dict(state["model"])  # a plain GPT loads it
    assert len(state["optimizer"]["state"]) > 0
    ref = trainer.train()[-1]["loss"]  # step 2 of the uninterrupted run
    resumed = tp_trainer(1)
    resumed.resume(tmp_path / "step1.pt")
    assert resumed.step == 1
    assert resumed.train()[-1]["loss"] == pytest.approx(ref, rel=1e-6)


# ---- errors -----------------------------------------------------------------------------------
@pytest.fixture
def world_of_one() -> Any:
    """A real gloo process group of one rank in this process (no spawn), destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_errors_name_the_problem(world_of_one: Any) -> None:
    model, _ = _model_and_batch()
    with pytest.raises(ValueError, match="process group has 1 ranks but the shard map 2"):
        parallelize(model, world_of_one, ShardMap.even(CFG, 2))
    with pytest.raises(ValueError, match="process group is None .* but the shard map 3"):
        parallelize(model, None, ShardMap.even(CFG, 3))
    other = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=48)
    with pytest.raises(ValueError, match="splits 4 heads .* the model has 6 heads"):
        parallelize(model, None, ShardMap.even(other, 1))
    with pytest.raises(ValueError, match="dropout=0.1 under tensor parallelism"):
        parallelize(GPT(dataclasses.replace(CFG, dropout=0.1)), None, ShardMap.even(CFG, 2))
    with pytest.raises(ValueError, match="TP degree 7 needs 1 <= tp <= n_head=6"):
        ShardMap.even(CFG, 7)
    parallelize(model, world_of_one, ShardMap.even(CFG, 1))  # a group of one rank works
    x = torch.randn(2, 3)
    assert torch.equal(copy_to_tp(x, world_of_one), x)


def test_spawn_reports_the_failing_rank() -> None:
    with pytest.raises(SpawnError, match="Rank 1 failed") as info:
        spawn(spawn_workers.raise_on_rank, 2, 1, timeout_s=60)
    assert info.value.rank == 1 and "fails on purpose" in info.value.traceback
    with pytest.raises(ValueError, match="needs a worker a fresh process can import"):
        spawn(lambda rank, world: rank, 2)


def test_init_from_env_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="start the processes with torchrun"):
        init_from_env()


# ---- the command line under torchrun ------------------------------------------------------
def test_cli_tp_without_torchrun(
    tmp_path: Path, text_file: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([*cli_train_args(tmp_path, text_file), "--tp", "2"]) == 1
    assert "--tp 2 needs 2 processes, but WORLD_SIZE is 1" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_trains_tensor_parallel_under_torchrun(tmp_path: Path, text_file: Path) -> None:
    """torchrun with 2 gloo ranks: same losses as one process; every rank writes its pieces of
    one DCP checkpoint, which one process loads: the single process's weights."""
    env = {**os.environ, "TUTORIAL_PRESET": "ci", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "tutorial_lib",
        *cli_train_args(tmp_path / "tp", text_file),
        "--tp",
        "2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("wrote") == 1  # one report, from rank 0
    assert main(cli_train_args(tmp_path / "single", text_file)) == 0
    tp, single = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("tp", "single"))
    for a, b in zip(tp, single, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    ref = load_checkpoint(tmp_path / "single" / "checkpoint.pt")
    model_cfg = GPTConfig(**ref["model_config"])
    alone = Trainer(
        build_model(model_cfg, seed=1), make_data(model_cfg.block_size, path=text_file),
        TrainConfig(**ref["train_config"]), device="cpu",
    )  # fmt: skip
    alone.resume(tmp_path / "tp" / "checkpoint")
    assert alone.step == ref["step"]
    state = alone.model.state_dict()
    for name, p in ref["model"].items():
        assert torch.allclose(state[name], p, rtol=1e-3, atol=1e-4), name


# ---- vocabulary parallelism and the ends of the sequence-parallel region ----------------------
VOCAB_TOKENS, VOCAB_SIZE = 13, 257
SP_CFG = GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=3, n_embd=12)
DT_CFG = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32)


def test_vocab_parallel_loss_embedding_and_region_operators(dist_results: dict[str, Any]) -> None:
    """3 ranks, a vocabulary of 257 (rows 86, 86, 85) and 13 tokens: the loss and its gradient
    are F.cross_entropy's in float64, the embedding is F.embedding's, each rank's weight
    gradient its rows of the full one; split keeps a slice and gathers the gradients, the
    replicated-gradient gather keeps this rank's slice of the gradient."""
    n_tokens, vocab = VOCAB_TOKENS, VOCAB_SIZE
    ranks = dist_results["vocab"]  # on global ranks 1, 2, 3
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(n_tokens, vocab, dtype=torch.float64, generator=gen) * 3).requires_grad_()
    targets = torch.randint(0, vocab, (n_tokens,), generator=gen)
    weight = torch.randn(vocab, 8, dtype=torch.float64, generator=gen).requires_grad_()
    idx = torch.randint(0, vocab, (3, n_tokens), generator=gen)
    ref = F.cross_entropy(logits, targets)
    ref.backward()
    emb = F.embedding(idx, weight)
    emb.backward(torch.ones_like(emb))
    assert [r["range"] for r in ranks] == [(0, 86), (86, 172), (172, 257)]
    for r in ranks:
        start, end = r["range"]
        torch.testing.assert_close(r["loss"], ref.detach(), rtol=1e-12, atol=0)
        torch.testing.assert_close(r["dlogits"], logits.grad[:, start:end], rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(r["embedding"], emb.detach(), rtol=0, atol=0)
        torch.testing.assert_close(r["dweight"], weight.grad[start:end], rtol=0, atol=0)
    x = torch.arange(2 * 6 * 4, dtype=torch.float64).reshape(2, 6, 4)
    for rank, r in enumerate(ranks):
        torch.testing.assert_close(r["split"], x[:, 2 * rank : 2 * rank + 2])
        want = torch.cat(
            [torch.full((2, 2, 4), float(k + 1), dtype=torch.float64) for k in range(3)], 1
        )
        torch.testing.assert_close(r["dsplit"], want)  # every rank's slice gradient, gathered
        z = torch.cat(
            [torch.arange(16, dtype=torch.float64).reshape(2, 2, 4) + 10.0 * k for k in range(3)], 1
        )
        torch.testing.assert_close(r["gathered"], z)
        dfull = torch.arange(z.numel(), dtype=torch.float64).reshape(z.shape)
        torch.testing.assert_close(r["dgathered"], dfull[:, 2 * rank : 2 * rank + 2])  # no sum


# ---- PyTorch's DTensor tensor parallelism against ours ----------------------------------------
def test_dtensor_parallelize_module_matches_our_megatron_layers(
    dist_results: dict[str, Any],
) -> None:
    """2 ranks, an even split: DTensor's ColwiseParallel/RowwiseParallel and our layers give the
    same losses and the same local gradients, step after step."""
    for got in dist_results["dtensor"]:
        assert got["dtensor"] == pytest.approx(got["ours"], rel=1e-6)
        assert max(got["grad_diff"]) < 1e-6
        assert got["ours"][0] != got["ours"][-1]  # the steps changed the model


def test_dtensor_sequence_parallel_matches_ours(dist_results: dict[str, Any]) -> None:
    """Both sequence-parallel (DTensor's SequenceParallel, PrepareModuleInput and RowwiseParallel
    to Shard(1); our TPGPT with sequence_parallel=True): the same losses and local gradients."""
    for got in dist_results["dtensor_sp"]:
        assert got["dtensor"] == pytest.approx(got["ours"], rel=1e-6)
        assert max(got["grad_diff"]) < 1e-6
        assert got["ours"][0] != got["ours"][-1]


def test_dtensor_tp_under_fsdp2_on_a_2d_mesh_reproduces_one_process(
    dist_results: dict[str, Any],
) -> None:
    """4 ranks, dp 2 x tp 2 as torchtitan composes them: DTensor's TP over the mesh's tp
    dimension, FSDP2 over its dp dimension; three SGD steps give one process's losses."""
    ref = spawn_workers.sgd_losses(DT_CFG, 3)
    assert ref[0] != ref[-1]  # the steps changed the model
    assert len(dist_results["dtensor2d"]) == 4
    for got in dist_results["dtensor2d"]:
        assert got == pytest.approx(ref, rel=1e-5)


def test_regroup_qkv_puts_each_ranks_heads_together() -> None:
    """Every row of the regrouped weight is checked: it is a reordering of the plain one."""
    from tutorial_lib.parallel.dtensor_tp import regroup_qkv
    from tutorial_lib.parallel.shard import global_index

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=6, n_embd=24)
    w = torch.randn(3 * cfg.n_embd, cfg.n_embd)
    grouped = regroup_qkv(w, cfg.n_head, 3)
    spec = unit_specs(cfg)["attn.qkv.weight"]
    shard_map = ShardMap.even(cfg, 3)
    for r, block in enumerate(grouped.chunk(3)):  # Shard(0)'s block r == our rank r's shard
        want = w.index_select(0, global_index(spec, shard_map.heads[r], cfg.n_head))
        torch.testing.assert_close(block, want, rtol=0, atol=0)


def test_sequence_parallel_generation_and_vocab_map_rules(dist_results: dict[str, Any]) -> None:
    """Without targets a sequence-parallel model pads a sequence that does not split (generation
    grows it one token at a time) and returns the full model's logits; a vocabulary split must
    be contiguous ranges in rank order."""
    for diffs in dist_results["sp_generate"]:
        assert max(diffs) < 1e-6, diffs
    shard_map = ShardMap.even(SP_CFG, 3)
    with pytest.raises(ValueError, match="contiguous range of token ids, in rank order"):
        vocab = (tuple(range(17, 34)), tuple(range(17)), tuple(range(34, 50)))  # not in order
        ShardMap(shard_map.heads, shard_map.ffn, 3, 48, vocab=vocab, vocab_size=50)
