"""Trace-level profiling (``perf.trace``): a real training step's Chrome trace with its phases,
and the summary's arithmetic on hand-made traces whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
import torch

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.perf import load_trace, plot_timeline, record_trace, trace_summary
from tutorial_lib.train import TrainConfig, Trainer


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def _write(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events + [{"ph": "M", "name": "meta"}]}))
    return path


def test_a_training_step_trace_has_its_phases(tmp_path: Path) -> None:
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)
    tokens = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(0))
    data = TokenData(tokens[:1800].to(torch.uint8), tokens[1800:].to(torch.uint8), 16)
    cfg_t = TrainConfig(steps=4, batch_size=2, eval_every=0, progress=False)
    trainer = Trainer(build_model(cfg, device="cpu"), data, cfg_t, device="cpu")
    path = record_trace(trainer.train_step, tmp_path / "sub" / "step.json", device="cpu")
    assert trainer.step == 2  # one warm-up step, one traced
    events = load_trace(path)
    summary = trace_summary(events)
    assert set(summary["phases"]) == {"forward", "backward", "optimizer"}
    assert summary["work"] == "operators" and summary["kernels"] > 10
    assert 0 < summary["busy_us"] <= summary["window_us"]
    assert summary["comm_us"] == 0 and summary["comm_overlap"] is None
    fig, ax = plt.subplots()
    plot_timeline(ax, events)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["operators", "phases"]
    plt.close(fig)


def test_busy_idle_and_phases_of_a_known_cpu_trace(tmp_path: Path) -> None:
    """Phases 0-100 (forward 0-40, backward 40-90, optimizer 90-100); top-level operators 5-35
    (with a child, not counted twice), 45-85 and 92-95: busy 30 + 40 + 3 = 73 of 100."""
    path = _write(tmp_path, [
        _x("forward", "user_annotation", 0, 40), _x("backward", "user_annotation", 40, 50),
        _x("optimizer", "user_annotation", 90, 10),
        _x("aten::linear", "cpu_op", 5, 30), _x("aten::addmm", "cpu_op", 6, 20),
        _x("AddmmBackward0", "cpu_op", 45, 40), _x("aten::add_", "cpu_op", 92, 3),
        _x("aten::add_", "cpu_op", 50, 5, tid=2),  # another thread's op: not the step's
    ])  # fmt: skip
    s = trace_summary(load_trace(path))
    assert s["window_us"] == 100 and s["busy_us"] == 73 and s["idle_us"] == 27
    assert s["kernels"] == 3 and s["work"] == "operators"
    assert s["phases"]["forward"] == {"us": 40, "busy_us": 30}
    assert s["phases"]["backward"] == {"us": 50, "busy_us": 40}
    assert s["phases"]["optimizer"] == {"us": 10, "busy_us": 3}


def test_collectives_overlap_only_with_work_elsewhere(tmp_path: Path) -> None:
    """GPU: an NCCL kernel 50-70 on stream 9 while compute kernels run 40-60 on stream 7:
    10 of its 20 us overlapped. CPU (gloo): an operator that waits in its all-reduce is not
    overlap, so 0."""
    gpu = _write(tmp_path, [
        _x("forward", "user_annotation", 0, 100),
        _x("gemm", "kernel", 40, 20, tid=7), _x("ncclDevKernel_AllReduce", "kernel", 50, 20, tid=9),
    ])  # fmt: skip
    s = trace_summary(load_trace(gpu))
    assert s["work"] == "kernels" and s["comm_us"] == 20 and s["comm_overlap"] == 0.5
    assert s["busy_us"] == 30  # 40-70
    cpu = _write(tmp_path, [
        _x("forward", "user_annotation", 0, 100),
        _x("_ReduceFromTP", "cpu_op", 10, 50), _x("c10d::allreduce_", "cpu_op", 30, 20),
    ])  # fmt: skip
    s = trace_summary(load_trace(cpu))
    assert s["comm_us"] == 20 and s["comm_overlap"] == 0.0


def test_unreadable_or_empty_traces_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable Chrome trace"):
        load_trace(bad)
    with pytest.raises(ValueError, match="no complete events"):
        trace_summary(load_trace(_write(tmp_path, [])))
