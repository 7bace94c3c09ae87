"""A rank that stops responding ends a distributed run within the process-group timeout
(``train --dist-timeout``, ``parallel.launch.DEFAULT_TIMEOUT_S``), with an error that names it
(``parallel.launch.watch_ranks``), instead of holding every other rank for torch's 30 minutes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tutorial_lib.__main__ import build_parser
from tutorial_lib.parallel import launch
from tutorial_lib.parallel.launch import DEFAULT_TIMEOUT_S, HungRankError, watch_ranks
from tutorial_lib.parallel.mesh import groups_2d

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3  # --dist-timeout of the two-process run: joining must fit in it too


# ---- the timeout reaches every process group ----------------------------------------------
def test_the_timeout_reaches_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: calls.append(kw))
    monkeypatch.setattr(launch.atexit, "register", lambda fn: fn)
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    launch.init_from_env("gloo")
    launch.init_from_env("gloo", timeout_s=7)
    timeouts = [kw["timeout"].total_seconds() for kw in calls]
    assert timeouts == [DEFAULT_TIMEOUT_S, 7]
    parser = build_parser()
    assert parser.parse_args(["train", "--out", "x"]).dist_timeout == DEFAULT_TIMEOUT_S
    assert parser.parse_args(["train", "--out", "x", "--dist-timeout", "2.5"]).dist_timeout == 2.5
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--out", "x", "--dist-timeout", "0"])


@pytest.fixture
def world_of_one() -> Iterator[None]:
    """A real gloo process group of one rank in this process, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_mesh_groups_get_the_timeout(world_of_one: None) -> None:
    """``dist.new_group`` takes torch's default (30 minutes on gloo), not the world's timeout."""
    groups = groups_2d(1, 1, [0], timeout=timedelta(seconds=7))
    assert groups is not None
    for group in groups:
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=7)


# ---- the diagnosis, in one process ----------------------------------------------------------
def test_a_timed_out_rank_names_the_silent_one(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world of two in which rank 1 never marks itself failed: after the timeout, rank 0's
    error names it; an error before the timeout is this rank's own and propagates as it is."""
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(HungRankError, match=r"rank 1 \(in its first step\) stopped") as info:
        with watch_ranks(0, timeout_s=0.2) as on_step:
            on_step(SimpleNamespace(step=1), {})
            time.sleep(0.25)
            raise RuntimeError("Timed out waiting 200ms for recv operation to complete")
    assert info.value.ranks == [1]
    assert "rank 0 gave up waiting in step 2 after 0 s" in str(info.value)
    with pytest.raises(ValueError, match="its own"):
        with watch_ranks(0, timeout_s=60):
            raise ValueError("its own")


# ---- two processes of the command line, one of them stopped ---------------------------------
def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (Linux: its state in /proc is T)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_a_stopped_rank_ends_the_run_with_an_error_naming_it(
    tmp_path: Path, text_file: Path
) -> None:
    """``train --dp 2`` as torchrun starts it, on gloo; rank 1 stops itself (SIGSTOP) as it
    begins its second step. Rank 0 fails within the timeout, plus as long again for the other
    ranks to report (``watch_ranks``), plus a margin, with one ``error:`` line and no
    traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TUTORIAL_PRESET": "ci", "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    loopback = [name for _, name in socket.if_nameindex() if name in ("lo", "lo0")]
    env |= {"GLOO_SOCKET_IFNAME": loopback[0]} if loopback else {}  # gloo: on 127.0.0.1 too
    args = ["train", "--preset", "ci", "--device", "cpu", "--dp", "2", "--steps", "1000"]
    args += ["--batch-size", "2", "--tokenizer", "bytes", "--no-progress", "--data", str(text_file)]
    args += ["--out", str(tmp_path / "run"), "--dist-timeout", str(TIMEOUT_S)]
    cmd = [sys.executable, str(ROOT / "tests" / "stop_rank.py"), "1", "1", "--", *args]
    logs = [(tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in range(2)]
    procs = []
    try:
        for r, (out, err) in enumerate(logs):
            with out.open("w") as o, err.open("w") as e:
                rank_env = {**env, "RANK": str(r), "LOCAL_RANK": str(r)}
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=rank_env, stdout=o, stderr=e))
        deadline, stopped_at = time.monotonic() + 120, None
        while procs[0].poll() is None and time.monotonic() < deadline:
            if stopped_at is None and _stopped(procs[1].pid):
                stopped_at = time.monotonic()
            time.sleep(0.05)
        ended_at = time.monotonic()
        stderr = logs[0][1].read_text()
        assert procs[0].returncode == 1, stderr[-3000:]
        assert stopped_at is not None, "rank 1 never stopped"
        assert ended_at - stopped_at < 2 * TIMEOUT_S + 15, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, stderr[-3000:]
        assert errors[0].startswith("error: rank 1 (after step 1) stopped responding: rank 0 ")
        assert f"--dist-timeout {TIMEOUT_S}" in errors[0]
    finally:
        for p in procs:
            p.kill()  # SIGKILL ends a stopped process too
            p.wait()
