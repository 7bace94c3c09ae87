"""Overheads around the math: launch-bound steps, CUDA graphs and compile modes, padded shapes.

``host_and_device_ms(step, device)``: how long the host takes to *issue* a step (``step()``
returns) against how long the step takes to *finish* (synchronised). On a GPU the host only
queues kernels, so a host time close to the finished time means the GPU waits for the launches:
the step is launch-bound, and fewer launches (fusion, CUDA graphs) help more than faster
kernels. On a CPU every operator runs as it is called; the two times are the same by
construction, and a CPU step cannot be launch-bound in this sense.

``compile_mode_rows(make_step, device)``: a training step compiled with each of
``torch.compile``'s modes: ``default``; ``reduce-overhead`` (captures the compiled graphs as CUDA
graphs, one launch replays all their kernels); ``max-autotune`` (benchmarks candidate GEMM and
other kernel configurations at compile time, and uses CUDA graphs too). Compile time and step
time each; on a CPU those two get a ``skipped`` row with the reason.

``vocab_padding_rows(tokens, hidden, vocabs, ...)``: the LM head's GEMMs (forward, and the two of
the backward) at each vocabulary size, timed on the device: GPT-2's 50,257 rows against 50,304,
a multiple of 64.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..perf import benchmark, synchronize

__all__ = [
    "COMPILE_MODES",
    "NOT_ON_CPU",
    "compile_mode_rows",
    "host_and_device_ms",
    "vocab_padding_rows",
]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
NOT_ON_CPU = {
    "reduce-overhead": "CUDA graphs exist only on NVIDIA GPUs (on a CPU this mode compiles as "
    "default does)",
    "max-autotune": "compiles and benchmarks many kernel variants per GEMM, minutes on a small "
    "CPU: measured at the hopper preset",
}


def host_and_device_ms(
    step: Callable[[], object], device: torch.device | str, iters: int = 5
) -> dict[str, float]:
    """Median over ``iters`` (after one warm-up) of the time until ``step()`` returns
    (``host_ms``) and until the device has finished it (``finished_ms``)."""
    dev = torch.device(device)
    step()
    synchronize(dev)
    host, finished = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        synchronize(dev)
        finished.append(time.perf_counter() - t0)
    host.sort()
    finished.sort()
    return {
        "host_ms": 1e3 * host[len(host) // 2],
        "finished_ms": 1e3 * finished[len(finished) // 2],
    }


def compile_mode_rows(
    make_step: Callable[[str | None], Callable[[], object]],
    device: torch.device | str,
    modes: Sequence[str] = COMPILE_MODES,
    iters: int = 5,
) -> list[dict[str, Any]]:
    """``make_step(mode)`` builds a fresh model compiled with ``mode`` (None: eager) and returns
    its training step; per mode: the first call's time (``compile_s``: tracing, compiling and
    one step) and the median step after it. The eager step comes first, for reference."""
    dev = torch.device(device)
    rows: list[dict[str, Any]] = []
    for mode in (None, *modes):
        name = mode or "eager"
        if dev.type != "cuda" and mode in ("reduce-overhead", "max-autotune"):
            rows.append({"mode": name, "skipped": NOT_ON_CPU[mode]})
            continue
        torch._dynamo.reset()
        step = make_step(mode)
        t0 = time.perf_counter()
        step()
        synchronize(dev)
        first = time.perf_counter() - t0
        timing = benchmark(step, warmup=1, iters=iters, device=dev)
        rows.append({"mode": name, "compile_s": round(first, 2), "step_ms": timing.median * 1e3})
    return rows


def vocab_padding_rows(
    tokens: int,
    hidden: int,
    vocabs: Sequence[int] = (50257, 50304),
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    iters: int = 5,
) -> list[dict[str, Any]]:
    """Per vocabulary size: the LM head's forward GEMM (tokens x hidden) @ (hidden x V) and its
    backward GEMMs (dX and dW), median time of the three and TFLOP/s (6 tokens hidden V FLOPs)."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(dev, dtype).requires_grad_()
    rows = []
    for vocab in vocabs:
        w = torch.randn(vocab, hidden, generator=gen).to(dev, dtype).requires_grad_()
        grad = torch.randn(tokens, vocab, generator=gen).to(dev, dtype)

        def head(w: torch.Tensor = w, grad: torch.Tensor = grad) -> None:
            (x @ w.t()).backward(grad)

        seconds = benchmark(head, warmup=1, iters=iters, device=dev).median
        flops = 6.0 * tokens * hidden * vocab
        rows.append({
            "vocab": vocab, "multiple_of_64": vocab % 64 == 0, "time_ms": seconds * 1e3,
            "tflops": flops / seconds / 1e12,
        })  # fmt: skip
    return rows
