"""Starting tensor-parallel processes: ``spawn`` from a notebook or test, ``torchrun`` for training.

- ``spawn(fn, world_size, *args)`` starts ``world_size`` CPU processes on this machine, joins
  them into one process group (gloo over 127.0.0.1) and returns ``fn(rank, world_size, *args)``
  of every rank. ``fn`` must be importable by name (it is pickled by name), so the book's
  workers live in ``jobs.workers``. Without CUDA the ranks fork from a forkserver that has
  imported torch once; with CUDA they start as fresh interpreters (``_context``).
- ``init_from_env()`` joins the process group that ``torchrun`` describes in RANK, WORLD_SIZE
  and LOCAL_RANK (NCCL on GPUs, gloo on CPUs) and returns this process's device. Its collectives
  fail after ``DEFAULT_TIMEOUT_S`` rather than torch's 30 minutes, and ``watch_ranks`` then
  names the rank that stopped responding.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "HungRankError",
    "SpawnError",
    "init_from_env",
    "spawn",
    "watch_ranks",
]


class SpawnError(RuntimeError):
    """A spawned rank raised; ``rank`` and ``traceback`` (the worker's, as text) say where."""

    def __init__(self, rank: int, tb: str, note: str = "") -> None:
        super().__init__(f"Rank {rank} failed{note}:\n{tb}")
        self.rank, self.traceback = rank, tb


def _loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), if there is one."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):  # not on every platform
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _context() -> Any:
    """How ``spawn`` starts processes. Without a CUDA GPU: forked from a *forkserver* that has
    already imported torch and this package, so a rank starts in a fraction of a second instead
    of the seconds a fresh interpreter spends importing them (on a 2-core CPU, most of a small
    job's time). The worker and its arguments travel pickled, and a rank unpickles them only
    after taking the caller's ``sys.path``, so a worker from any importable module (a test's, a
    notebook's helper module) runs so too. With CUDA: fresh interpreters (``spawn``), since a
    process forked after CUDA was touched cannot use it."""
    if torch.cuda.is_available() or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tutorial_lib.jobs.workers"])  # imports torch, the package
    return ctx


def _run_rank(
    job: bytes,
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    timeout_s: float,
    env: dict[str, str],
    cwd: str,
    path: list[str],
) -> None:
    """One spawned process: join the group, run the pickled ``(fn, args)`` of ``job``, write the
    result (or the traceback). ``env``, ``cwd`` and ``path`` (``sys.path``): the caller's, taken
    first (a forked rank starts with the forkserver's)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = path
    torch.set_num_threads(1)  # a few cores shared by all ranks: no intra-op threads
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback  # gloo's connections stay on 127.0.0.1 too
    failed_at = time.time()
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            fn, args = pickle.loads(job)  # here, with the caller's sys.path
            payload = {"ok": True, "result": fn(rank, world_size, *args)}
        except BaseException:
            failed_at = time.time()  # before leaving the group makes the other ranks fail too
            raise
        finally:
            dist.destroy_process_group()
    except BaseException:
        payload = {"ok": False, "error": traceback.format_exc(), "time": failed_at}
    result = Path(out_dir) / f"rank{rank}.pt"
    tmp = result.with_suffix(".tmp")
    try:
        torch.save(payload, tmp)
    except Exception:  # an unpicklable result
        torch.save({"ok": False, "error": traceback.format_exc(), "time": time.time()}, tmp)
    os.replace(tmp, result)


def _pickled_job(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """``(fn, args)`` pickled, ``fn`` by name: it must be importable from a module."""
    name = getattr(fn, "__qualname__", repr(fn))
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in name:
        raise ValueError(
            f"spawn() needs a worker a fresh process can import; {name} is defined in "
            "__main__ or inside a function (a notebook, a test). Put it in a module, as the "
            "book's workers are in tutorial_lib.jobs.workers."
        )
    return pickle.dumps((fn, args))


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; their results by rank
    (started as ``_context`` says: forked from a warm forkserver on a machine without CUDA).

        Each process joins one gloo process group (over a free port on 127.0.0.1) with one
        intra-op thread, and always leaves it. If a rank raises, the others are stopped and
        ``SpawnError`` carries that rank and its traceback; past ``timeout_s`` (start-up included)
        every rank is stopped and ``TimeoutError`` names the ranks that had not finished.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}.")
    job = _pickled_job(fn, args)
    ctx = _context()
    caller = (dict(os.environ), os.getcwd(), list(sys.path))
    with tempfile.TemporaryDirectory(prefix="tutorial_lib_spawn_") as tmp:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # free now: the OS picks
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        procs = [
            ctx.Process(
                target=_run_rank,
                name=f"rank{r}",
                daemon=True,
                args=(job, r, world_size, port, tmp, timeout_s, *caller),
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            unfinished = _wait(procs, Path(tmp), timeout_s)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return _collect(procs, Path(tmp), unfinished, timeout_s)


def _failed(proc: Any, path: Path) -> bool:
    """Whether an exited rank failed: a crash, or a result file that holds a traceback."""
    return proc.exitcode != 0 or not path.exists() or not torch.load(path, weights_only=False)["ok"]


def _wait(procs: list[Any], out: Path, timeout_s: float) -> list[int]:
    """Wait until every rank has exited, or one failed, or the time is up; the ranks still
    running then."""
    deadline = time.monotonic() + timeout_s
    checked: set[int] = set()
    while time.monotonic() < deadline:
        running = [r for r, p in enumerate(procs) if p.is_alive()]
        if not running:
            return []
        for r in sorted(set(range(len(procs))) - set(running) - checked):
            if _failed(procs[r], out / f"rank{r}.pt"):
                time.sleep(0.5)  # let ranks that fail on their own report it themselves
                return [r for r, p in enumerate(procs) if p.is_alive()]
            checked.add(r)
        time.sleep(0.05)
    return [r for r, p in enumerate(procs) if p.is_alive()]


def _collect(procs: list[Any], out: Path, unfinished: list[int], timeout_s: float) -> list[Any]:
    payloads: dict[int, dict[str, Any]] = {}
    for r, p in enumerate(procs):
        path = out / f"rank{r}.pt"
        if path.exists():
            payloads[r] = torch.load(path, weights_only=False)
        elif r not in unfinished:
            payloads[r] = {
                "ok": False,
                "error": f"exited with code {p.exitcode}, no result\n",
                "time": float("inf"),
            }
    # The first rank to fail is the cause; the others usually failed because it left.
    errors = sorted((pl["time"], r) for r, pl in payloads.items() if not pl["ok"])
    if errors:
        first = errors[0][1]
        others = [r for _, r in errors[1:]]
        note = (f" first; later failures on ranks {others}" if others else "") + (
            f"; stopped ranks {unfinished}" if unfinished else ""
        )
        raise SpawnError(first, payloads[first]["error"], note)
    if unfinished:
        raise TimeoutError(
            f"Ranks {unfinished} did not finish within {timeout_s} s (a rank waiting for a "
            "collective that another rank never called hangs until the timeout)."
        )
    return [payloads[r]["result"] for r in range(len(procs))]


# ---- torchrun -------------------------------------------------------------------------------
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a collective waits for the other ranks before it fails (``train --dist-timeout``).
torch's own default, 30 minutes on gloo and 10 on NCCL, keeps a job that one stopped process has
already lost waiting that long; a few minutes is still far more than a step's communication
takes. (Each group needs it: ``dist.new_group`` takes torch's default, not the world's.)"""


def init_from_env(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> torch.device:
    """Join the process group described by torchrun's RANK, WORLD_SIZE and LOCAL_RANK; return
    this process's device.

    The backend defaults to NCCL when CUDA is available (and each process then uses GPU
    LOCAL_RANK), else gloo. Joining, and every collective of the group, fails after
    ``timeout_s``. The group is destroyed at interpreter exit.
    """
    missing = [k for k in _TORCHRUN_VARS if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not set: start the processes with torchrun, e.g. "
            "python -m torch.distributed.run --nproc-per-node 2 -m tutorial_lib train --tp 2 ..."
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} needs GPU {local_rank}, but {torch.cuda.device_count()} "
                "are visible: start at most one process per GPU, or train on CPUs (gloo)."
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    return device


class HungRankError(RuntimeError):
    """Training failed because ``ranks`` stopped responding (``watch_ranks``)."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


@contextlib.contextmanager
def watch_ranks(step: int, timeout_s: float) -> Iterator[Callable[[Any, Any], None]]:
    """Name the rank that stalls a run, where a timed-out collective only says that it waited.

    ``with watch_ranks(trainer.step, timeout_s) as on_step: trainer.train(on_step=on_step)``,
    ``timeout_s`` being the process group's. Each rank keeps the number of steps it has finished
    in the group's store (the key-value server every rank joined through): ``on_step`` writes it,
    once a step (a ``set`` waits for no answer). When training raises on a rank, it marks itself
    failed there. If it had waited ``timeout_s`` (a collective's timeout, not an error of its
    own), it then waits up to ``min(timeout_s, 10 s)`` for the other ranks to do the same, as
    every rank still running does when a collective times out. A rank that never does is
    stopped (SIGSTOP, a debugger), hung, killed or overloaded: ``HungRankError`` names it, with
    its progress. Otherwise (every rank failed, or no timeout) the error propagates unchanged."""
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"steps/{rank}", str(step))
    since = time.monotonic()

    def on_step(trainer: Any, row: Any) -> None:
        nonlocal step, since
        step, since = trainer.step, time.monotonic()
        store.set(f"steps/{rank}", str(step))

    try:
        yield on_step
    except Exception as exc:
        waited = time.monotonic() - since
        with contextlib.suppress(RuntimeError):  # (DistError: the store is gone)
            store.set(f"failed/{rank}", "1")  # so that no other rank names this one
        if waited < timeout_s:
            raise  # this rank's own error, not a collective's timeout
        silent = _silent_ranks(store, world, min(timeout_s, 10.0))
        if silent == {}:
            raise
        waiting = (
            f"rank {rank} gave up waiting in step {step + 1} after {waited:.0f} s (the "
            f"process-group timeout, --dist-timeout {timeout_s:g})"
        )
        if silent is None:
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            raise HungRankError(
                f"{waiting}, and the store at {where} did not answer either: the process "
                "that holds it (rank 0, or torchrun's agent) is stopped, hung, killed or "
                "overloaded.",
                [],
            ) from exc
        who = ", ".join(f"rank {r} ({got})" for r, got in silent.items())
        raise HungRankError(
            f"{who} stopped responding: {waiting}. A stopped (SIGSTOP, a debugger), hung, killed "
            "or overloaded process: look at it and its machine; --resume continues from the "
            "last checkpoint.",
            list(silent),
        ) from exc


def _silent_ranks(store: dist.Store, world: int, wait_s: float) -> dict[int, str] | None:
    """The ranks that have not marked themselves failed in ``store`` within ``wait_s``, with
    how far each got; None if the store did not answer. (A thread asks it: a store whose host
    is stopped never answers, whatever its timeout.)"""
    found: list[dict[int, str]] = []

    def ask() -> None:
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(RuntimeError):  # (DistError: the store is gone)
            while silent := [r for r in range(world) if not store.check([f"failed/{r}"])]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            steps = {
                r: int(store.get(f"steps/{r}")) if store.check([f"steps/{r}"]) else 0
                for r in silent
            }
            found.append(
                {r: f"after step {n}" if n else "in its first step" for r, n in steps.items()}
            )

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(wait_s + 5.0)
    return found[0] if found else None
