"""``torch.compile`` with its costs and its output in view.

``torch.compile`` traces Python into FX graphs (TorchDynamo), differentiates them ahead of time
(AOTAutograd) and hands them to Inductor, which fuses pointwise and reduction ops into generated
kernels: Triton on a GPU, C++/OpenMP on the CPU. Matmuls and attention stay library calls
(``extern_kernels.mm``, ``addmm``, SDPA). This module reports what that cost and produced:

- ``measure_compile``: time of the first call (tracing + compiling + running) apart from the
  steady-state call time, the number of graphs, graph breaks (with their reasons) and generated
  kernels, from torch's own counters (``torch._dynamo.utils.counters`` and
  ``torch._inductor.metrics``);
- ``count_graph_breaks``: the graphs and graph breaks of whatever compiles inside a ``with``
  block (a whole training run), with short reasons and the lines of code where Dynamo broke;
- ``generated_code`` / ``count_kernels``: the code Inductor wrote, and how many kernels it launches;
- ``count_eager_ops``: how many ATen operators eager PyTorch dispatches for the same work, each one
  a kernel that reads its inputs from and writes its output to memory.

These counters are private torch APIs (stable in practice since torch 2.1); each read is guarded,
so a future rename gives ``None`` instead of an exception.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..autocast_inspect import SKIPPED_OPS
from ..checks import check_positive_int

__all__ = [
    "CompileReport",
    "GraphBreaks",
    "compile_model",
    "measure_compile",
    "count_graph_breaks",
    "short_break_reason",
    "generated_code",
    "count_kernels",
    "kernel_names",
    "kernel_excerpt",
    "count_eager_ops",
]


def compile_model(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """``torch.compile(model, **kwargs)``; compilation itself happens lazily at the first call.

    The returned wrapper shares parameters with ``model``; save and load ``model.state_dict()``
    (the wrapper's keys carry an ``_orig_mod.`` prefix).
    """
    if not hasattr(torch, "compile"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.compile; install torch>=2.1.")
    compiled = torch.compile(model, **kwargs)
    # torch.compile is typed as returning a plain callable; for a module it returns a module.
    if not isinstance(compiled, torch.nn.Module):
        raise TypeError(f"torch.compile returned {type(compiled).__name__}, not an nn.Module.")
    return compiled


@dataclass
class CompileReport:
    """What one compilation cost and produced.

    first_call_s: wall time of the first call (trace + compile + one run).
    steady_s: median wall time of the calls after it; ``compile_s`` is the difference.
    graphs: FX graphs Dynamo captured (1 means the whole function became one graph).
    graph_breaks: how many times Dynamo fell back to Python; ``break_reasons`` says why.
    generated_kernels: Inductor's own counter of kernels it generated (Triton on GPU; on CPU it
        counts C++ loop nests, more than the C++ functions ``count_kernels`` finds); None if
        the counter is unavailable.
    """

    first_call_s: float
    steady_s: float
    graphs: int | None
    graph_breaks: int | None
    generated_kernels: int | None
    break_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def compile_s(self) -> float:
        return max(0.0, self.first_call_s - self.steady_s)

    def summary(self) -> str:
        kernels = "?" if self.generated_kernels is None else self.generated_kernels
        return (
            f"compile {self.compile_s:.1f} s (first call {self.first_call_s:.1f} s, then "
            f"{1e3 * self.steady_s:.1f} ms per call); {self.graphs} graph(s), "
            f"{self.graph_breaks} graph break(s), {kernels} generated kernel(s)"
        )


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_counters() -> None:
    try:
        from torch._dynamo.utils import counters

        counters.clear()
    except ImportError:  # pragma: no cover - torch without dynamo
        pass
    try:
        from torch._inductor import metrics

        metrics.reset()
    except ImportError:  # pragma: no cover
        pass


def _read_counters() -> tuple[int | None, int | None, int | None, dict[str, int]]:
    graphs = breaks = kernels = None
    reasons: dict[str, int] = {}
    try:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"].get("unique_graphs", 0))
        reasons = {str(k): int(v) for k, v in counters["graph_break"].items()}
        breaks = sum(reasons.values())
    except (ImportError, KeyError, AttributeError):  # pragma: no cover
        pass
    try:
        from torch._inductor import metrics

        kernels = int(metrics.generated_kernel_count)
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return graphs, breaks, kernels, reasons


def measure_compile(
    fn: Callable[[], Any], steady_iters: int = 3, reset: Callable[[], None] | None = None
) -> tuple[Any, CompileReport]:
    """Call ``fn`` (which calls a compiled model) once cold and ``steady_iters`` times warm.

    Dynamo and Inductor counters are cleared first, so the report counts this compilation only
    (run it before compiling anything else; the FX graph cache on disk can make a repeated
    compilation of the same code faster than a first one). ``reset`` runs before every call
    (e.g. ``optimizer.zero_grad``). Returns the first call's result and the report.
    """
    check_positive_int(steady_iters, "steady_iters")
    _reset_counters()
    _sync()
    t0 = time.perf_counter()
    if reset is not None:
        reset()
    result = fn()
    _sync()
    first = time.perf_counter() - t0
    graphs, breaks, kernels, reasons = _read_counters()
    times = []
    for _ in range(steady_iters):
        if reset is not None:
            reset()
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    steady = sorted(times)[len(times) // 2]
    return result, CompileReport(first, steady, graphs, breaks, kernels, reasons)


@dataclass
class GraphBreaks:
    """What Dynamo compiled while a ``count_graph_breaks()`` block ran.

    graphs: FX graphs captured.
    breaks: graph breaks. Dynamo counts one each time it stops tracing while it *compiles* a
        frame, not each time the compiled code hands back to Python at run time: identical
        layers share one compiled frame, so a break inside a block counts once, not per layer.
    reasons: ``short_break_reason`` -> count, for those breaks.
    skipped_frames: frames Dynamo gave up on and ran eagerly (e.g. a graph break inside a loop);
        ``skip_reasons`` says why.
    sites: ``"file.py:line  source"`` -> count, each place Dynamo reported a break (the one that
        made it skip a frame included); empty when its graph-break log is unavailable.
    """

    graphs: int | None = None
    breaks: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    skipped_frames: int | None = None
    skip_reasons: dict[str, int] = field(default_factory=dict)
    sites: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"{self.breaks} graph break(s) in {self.graphs} graph(s), "
            f"{self.skipped_frames} frame(s) run eagerly"
        )


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_NESTED = "*** While handling this graph break, another graph break occurred: ***"


def short_break_reason(text: str) -> str:
    """Dynamo's multi-line reason as one line: the heading and the explanation of each break
    (nested ones joined by ``" -> "``), without memory addresses, so that runs compare."""
    parts = []
    for part in text.split(_NESTED):
        lines = [line.strip() for line in part.strip().splitlines() if line.strip()]
        if not lines:
            continue
        why = next((ln for ln in lines if ln.startswith("Explanation:")), "")
        why = why.removeprefix("Explanation:").strip()
        parts.append(f"{lines[0]}: {why}" if why else lines[0])
    return _ADDRESS.sub("", " -> ".join(parts))


_SITE = re.compile(r"in user code at (.+):(\d+)")
_BREAK_LOG = "torch._dynamo.symbolic_convert.__graph_breaks"  # torch's artifact logger


class _SiteHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.sites: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        match = _SITE.search(record.getMessage())
        if match:
            path, line = match.group(1), int(match.group(2))
            code = linecache.getline(path, line).strip()
            self.sites[f"{Path(path).name}:{line}  {code}".rstrip()] += 1


def _snapshot() -> dict[str, Counter[str]]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - torch without dynamo
        return {}
    keys = ("graph_break", "unimplemented", "stats", "frames")
    return {k: Counter({str(m): int(n) for m, n in counters[k].items()}) for k in keys}


def _short_counts(counts: Counter[str]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for text, n in counts.items():
        out[short_break_reason(text)] += n
    return dict(out.most_common())


def _fill(result: GraphBreaks, before: dict[str, Counter[str]], sites: Counter[str]) -> None:
    after = _snapshot()
    if not after:  # pragma: no cover - torch without dynamo
        return
    delta = {k: after[k] - before[k] for k in after}
    result.graphs = delta["stats"]["unique_graphs"]
    result.breaks = sum(delta["graph_break"].values())
    result.reasons = _short_counts(delta["graph_break"])
    result.skipped_frames = delta["frames"]["total"] - delta["frames"]["ok"]
    # An error Dynamo could not turn into a graph break stays in "unimplemented"; a nested one
    # ("A -> graph break in loop") is counted again on its own ("A"): keep the longer form.
    skips = _short_counts(delta["unimplemented"])
    result.skip_reasons = {
        r: n for r, n in skips.items() if not any(o.startswith(r + " -> ") for o in skips)
    }
    result.sites = dict(sites.most_common())


@contextlib.contextmanager
def count_graph_breaks() -> Iterator[GraphBreaks]:
    """Count what Dynamo compiles inside the block; the yielded ``GraphBreaks`` is filled in
    when the block exits. Reads the difference of torch's counters (nothing is cleared) and
    listens to Dynamo's graph-break log for the sites. Code that is already compiled, with
    guards that still hold, compiles nothing and counts nothing: call ``torch._dynamo.reset()``
    first to count a model's breaks from scratch."""
    result = GraphBreaks()
    before = _snapshot()
    logger = logging.getLogger(_BREAK_LOG)
    handler, saved = _SiteHandler(), (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # keep the log out of the notebook; we only read the sites
    try:
        yield result
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        _fill(result, before, handler.sites)


def generated_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """The source Inductor generated while running ``fn(*args)`` (``fn`` should call a
    ``torch.compile``d function). One string per compiled graph (forward and backward apart)."""
    from torch._inductor.utils import run_and_get_code

    _, code = run_and_get_code(fn, *args, **kwargs)
    return list(code)


# Inductor defines each generated kernel once (``cpp_fused_gelu_0 = async_compile.cpp_pybinding(
# ...)``, ``triton_poi_fused_gelu_0 = async_compile.triton(...)``) and launches it from the graph's
# ``call`` function, once per use (``cpp_fused_gelu_0(buf0, buf1)``,
# ``triton_poi_fused_gelu_0.run(...)``); library kernels are calls to ``extern_kernels.mm(...)``
# or ``torch.ops.aten.<op>(...)``. Only statements that *start* with a call count, so op names
# quoted in ``assert_size_stride(..., 'torch.ops.aten.mm.default')`` do not.
_KERNEL_DEF = re.compile(r"^\s*(triton_\w+|cpp_fused_\w+)\s*=\s*async_compile\.", re.M)
_KERNEL_LAUNCH = re.compile(r"^\s*(triton_\w+|cpp_fused_\w+)(?:\.run)?\(", re.M)
_LIBRARY_CALL = re.compile(
    r"^\s*(?:[\w, ]+=\s*)?(?:extern_kernels\.\w+|torch\.ops\.aten\.[\w.]+)\(", re.M
)


def count_kernels(code: str | list[str]) -> dict[str, int]:
    """Kernels in Inductor's generated code: ``generated`` (distinct fused kernels it wrote),
    ``launches`` (how often they are launched: a kernel shared by identical layers counts once
    per layer) and ``library`` (calls to library kernels: matmuls, attention, ...).

    ``launches + library`` is comparable to ``count_eager_ops``' total for the same work."""
    text = code if isinstance(code, str) else "\n".join(code)
    generated = {m.group(1) for m in _KERNEL_DEF.finditer(text)}
    launches = sum(1 for m in _KERNEL_LAUNCH.finditer(text) if m.group(1) in generated)
    library = sum(1 for _ in _LIBRARY_CALL.finditer(text))
    return {"generated": len(generated), "launches": launches, "library": library}


def kernel_names(code: str) -> list[str]:
    """The generated kernels defined in one graph's code, in order of definition."""
    return [m.group(1) for m in _KERNEL_DEF.finditer(code)]


def kernel_excerpt(code: str, name_contains: str = "gelu", max_lines: int = 32) -> str:
    """A readable slice of one graph's generated code: the body of the first generated kernel
    whose name contains ``name_contains`` (else the first kernel), up to ``max_lines`` lines,
    then every kernel launch and library call of the graph's ``call`` function."""
    lines = code.splitlines()
    defs = [i for i, line in enumerate(lines) if _KERNEL_DEF.match(line)]
    if not defs:
        raise ValueError("No generated kernel in this code (was it produced by Inductor?).")
    start = next((i for i in defs if name_contains in lines[i]), defs[0]) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("'''")), len(lines))
    body = [line for line in lines[start:end] if line.strip()]
    first = next((i for i, line in enumerate(body) if line.startswith(("def ", 'extern "C"'))), 0)
    calls = [
        line.strip() for line in lines if _KERNEL_LAUNCH.match(line) or _LIBRARY_CALL.match(line)
    ]
    return "\n".join(body[first : first + max_lines] + ["...", "", "# launches in call():"] + calls)


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = f"{func.namespace}.{func._schema.name.split('::')[-1]}"
        if name not in SKIPPED_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count_eager_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Counter[str]:
    """ATen operators (views and detaches excluded) that eager ``fn(*args)`` dispatches, by name.

    Each is one kernel launch (on the CPU, one pass of a library routine) that reads its inputs
    and writes its output: the round trips fusion removes. Includes backward ops if ``fn`` calls
    ``backward()``; zero the gradients first (``set_to_none``), or the count includes the
    ``aten.add_`` calls that accumulate into existing ``.grad`` tensors.
    """
    counter = _OpCounter()
    with counter:
        fn(*args, **kwargs)
    return counter.ops
