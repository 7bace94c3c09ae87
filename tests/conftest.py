"""Shared fixtures: a tiny GPT configuration, a small corpus and fresh samplers over it."""

from __future__ import annotations

import importlib.util
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData, load_corpus
from tutorial_lib.train import TrainConfig

# Tests use tiny tensors, where intra-op threads only add synchronisation; with pytest-xdist's
# workers sharing a couple of busy cores, OpenMP spin-waiting made CPU steps ~20x slower.
torch.set_num_threads(1)

# Small enough that a CPU step takes milliseconds; block 29 and width 36 (3 heads of 12) are not
# powers of two, so a shape mix-up cannot hide behind a coincidence.
TINY = GPTConfig(vocab_size=256, block_size=29, n_layer=2, n_head=3, n_embd=36)


class CPUScaledMMError(AssertionError):
    """A CPU code path called ``torch._scaled_mm``."""


_REAL_SCALED_MM = torch._scaled_mm


def _scaled_mm_guard(*args: object, **kwargs: object) -> torch.Tensor:
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if any(t.device.type == "cpu" for t in tensors):
        raise CPUScaledMMError(
            "torch._scaled_mm was called on CPU tensors. Its CPU kernel is ~1000x slower than an "
            "FP32 matmul on some CPUs (AMX Xeons); CPU paths must use fp8.emulated_gemm. A test "
            "that compares against it on purpose is marked @pytest.mark.cpu_scaled_mm."
        )
    return _REAL_SCALED_MM(*args, **kwargs)


@pytest.fixture(autouse=True)
def no_cpu_scaled_mm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test fails if anything calls ``torch._scaled_mm`` on the CPU, so the slow kernel
    cannot come back on the CPU kind where it costs minutes, unless the test is marked
    ``cpu_scaled_mm`` (a small reference comparison)."""
    if request.node.get_closest_marker("cpu_scaled_mm") is None:
        monkeypatch.setattr(torch, "_scaled_mm", _scaled_mm_guard)


@pytest.fixture(scope="session")
def corpus() -> bytes:
    """200 KB of the standard library's sources (the default corpus, truncated)."""
    return load_corpus(max_bytes=200_000)


@pytest.fixture(scope="session")
def tiny_cfg() -> GPTConfig:
    return TINY


@pytest.fixture(scope="session")
def data_factory(corpus: bytes) -> Callable[..., TokenData]:
    """``data_factory(seed=0, block_size=29)``: a fresh sampler (its own RNG) over the corpus."""
    tokens = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)
    n_val = len(tokens) // 10

    def make(seed: int = 0, block_size: int = TINY.block_size) -> TokenData:
        return TokenData(tokens[:-n_val], tokens[-n_val:], block_size=block_size, seed=seed)

    return make


def _short_run(
    model: Any, data: TokenData, precision: str, steps: int, out: Path | None = None
) -> Any:
    """A Trainer for a short parity run of a built copy of ``model`` in ``precision`` (batch 8,
    lr 3e-3, 2 warm-up steps, no evaluation, seed 0) on the CPU."""
    from tutorial_lib.build import build_model
    from tutorial_lib.train import TrainConfig, Trainer

    cfg = TrainConfig(
        steps=steps,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        eval_every=0,
        precision=precision,
        progress=False,
        seed=0,
    )
    built = build_model(model.config, precision=precision, weights=model.state_dict())
    return Trainer(built, data, cfg, device="cpu", out_dir=out)


@pytest.fixture(scope="session")
def short_run() -> Callable[..., Any]:
    """``short_run(model, data, precision, steps, out=None)``: a Trainer (``_short_run``)."""
    return _short_run


@pytest.fixture
def tiny_data(data_factory: Callable[..., TokenData]) -> TokenData:
    return data_factory()


def parallel_run_data(block_size: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The multi-process tests' corpus: 5000 seeded random bytes, as ``TokenData`` arguments
    (train tokens, validation tokens, block size, seed)."""
    tokens = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(torch.uint8)
    return tokens[:4500], tokens[4500:], block_size, 0


def short_train_config(precision: str, steps: int) -> TrainConfig:
    """A short test run: (global) batch 8, lr 3e-3, 2 warm-up steps, no evaluation, seed 0."""
    return TrainConfig(
        steps=steps,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        eval_every=0,
        precision=precision,
        seed=0,
        progress=False,
    )


def cli_train_args(out: Path, data: Path) -> list[str]:
    """``train`` on the CLI at the ci preset: 3 steps, batch 4, ``data`` as the corpus, on the
    CPU, no progress bar (the multi-process CLI tests compare such runs with one process)."""
    return [
        "train",
        "--preset",
        "ci",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--data",
        str(data),
        "--out",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
    ]


@pytest.fixture
def text_file(tmp_path: Path, corpus: bytes) -> Path:
    """A ~50 KB text file for the CLI's ``--data``."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(corpus[:50_000])
    return path


class FakeStream:
    """A simulated asynchronous device: ``launch`` queues work and returns at once, like a CUDA
    kernel launch; a worker thread runs the queue in order; ``synchronize`` waits for it."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[float | None] = queue.Queue()
        self.worker = threading.Thread(target=self._run, daemon=True)
        self.worker.start()

    def _run(self) -> None:
        while (seconds := self.jobs.get()) is not None:
            time.sleep(seconds)
            self.jobs.task_done()

    def launch(self, seconds: float) -> None:
        self.jobs.put(seconds)

    def synchronize(self, device: object = None) -> None:
        self.jobs.join()

    def close(self) -> None:
        self.jobs.put(None)
        self.worker.join(timeout=5)


@pytest.fixture
def stream() -> Iterator[FakeStream]:
    s = FakeStream()
    yield s
    s.synchronize()
    s.close()


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """Import ``benchmarks/<file>`` (a script, not a package) as module ``bench_<stem>``."""

    def load(filename: str) -> ModuleType:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / filename
        name = f"bench_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load


TE_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "te"
TE_VERSIONS = ("2.9.0", "2.20.2")  # the versions scripts/fetch_te_source.py caches


@pytest.fixture(scope="session")
def te_source() -> Callable[[str, str], str]:
    """``te_source(version, path)``: a file of Transformer Engine's cached pure-Python source.

    The policy of ``tests/test_te_contract.py``: a missing file fails the test (``make setup``
    fetches the source), unless ``TUTORIAL_OFFLINE=1`` says there is no network to fetch it."""

    def read(version: str, path: str) -> str:
        file = TE_CACHE / version / "transformer_engine" / path
        if not file.is_file():
            message = f"no cached TE {version} source at {file}: run scripts/fetch_te_source.py"
            if os.environ.get("TUTORIAL_OFFLINE") == "1":
                pytest.skip(message)
            pytest.fail(message)
        return file.read_text(encoding="utf-8")

    return read


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what tests reported with ``record_property("report", text)`` (results a reader
    wants to see, such as the cost model's held-out error); works under xdist too."""
    lines = [
        value
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", [])
        if name == "report"
    ]
    if lines:
        terminalreporter.section("reported results")
        for line in lines:
            terminalreporter.write_line(str(line))
