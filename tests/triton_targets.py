"""Compile every Triton kernel of the package for a GPU, on a machine without one.

    python tests/triton_targets.py --arch 90 [--presets ci,hopper] [--json FILE]

Run as its own process (``tests/test_triton_targets.py`` does), never import it into another: it
sets ``TRITON_INTERPRET=0`` when imported, which every process started afterwards inherits. It turns the interpreter off (``TRITON_INTERPRET=0``),
points Triton at a fresh, empty cache (a cached binary would skip the front end's checks), and
installs a stand-in driver whose target is ``GPUTarget("cuda", ARCH, 32)``. Every launch then
becomes a compile-only warm-up (``JITFunction.run(..., warmup=True)``) whose tensors are
Triton's ``MockTensor`` (dtype and shape, no memory), and the compiled kernel's metadata is
recorded: shared memory, warps, stages. The bundled ``ptxas`` assembles the PTX, so what is
checked is what a GPU's first launch would do.

What is launched is what the package launches, at the shapes each preset makes:

- the fused GPT (``build_model(..., fused=True)``) forward and backward at the preset's batch and
  context, under FakeTensorMode (no memory, no arithmetic), in FP32 and under BF16 and FP16
  autocast (the dtype mix a GPU run gives each kernel), and under the ``fp8`` policy;
- flash attention forward and backward at the preset's (B, H, T, D), softmax at chapter 7's
  attention-row shape, each in FP32, BF16 and FP16;
- the chunked two-pass LayerNorm at rows wider than ``MAX_ROW_BLOCK``;
- exercise 7.1's worked solution.

The launchers' device checks are the one thing switched off (the tensors are on no GPU), and
the cross-entropy launcher's target check, which reads values that fake tensors do not have.
Prints one JSON object: ``{"arch", "triton", "compiled": [...], "errors": [...], "kernels":
[every @triton.jit function of the package], "device_functions": [those only called from
kernels]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-targets-")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said aloud

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction, MockTensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNEL_MODULES = ("attention", "bias_gelu", "cross_entropy", "layernorm", "softmax", "wide_rows")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class StandInDriver:
    """What ``JITFunction.run`` asks the active driver for, answered for a GPU that is not here."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


class Recorder:
    """Replaces ``JITFunction.run``: compile only, and note what was compiled (or why not)."""

    def __init__(self) -> None:
        self.case = ""
        self.compiled: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []
        self._run = JITFunction.run

    def __call__(self, fn: JITFunction, *args: Any, grid: Any, warmup: bool, **kw: Any) -> Any:
        mock = [
            MockTensor(a.dtype, list(a.shape)) if isinstance(a, torch.Tensor) else a for a in args
        ]
        name = fn.fn.__name__
        try:
            kernel = self._run(fn, *mock, grid=grid, warmup=True, **kw)
        except Exception as exc:  # the finding: report it and go on with the other kernels
            self.errors.append({"kernel": name, "case": self.case, "error": _short(exc)})
            return None
        meta = kernel.metadata
        dtypes = sorted(
            {str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)}
        )
        self.compiled.append(
            {
                "kernel": name,
                "case": self.case,
                "dtypes": dtypes,
                "constexprs": {k: v for k, v in kw.items() if k.isupper()},
                "shared_bytes": int(meta.shared),
                "num_warps": int(meta.num_warps),
                "num_stages": int(meta.num_stages),
            }
        )
        return kernel


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + " ..."


@contextmanager
def compile_only(arch: int) -> Iterator[Recorder]:
    """The stand-in driver, compile-only launches, and the launchers' device checks off."""
    import tutorial_lib.kernels  # noqa: F401  (imports every kernel module)

    recorder = Recorder()
    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, value: object) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def dtypes_only(*tensors: torch.Tensor | None, name: str) -> None:
        for t in tensors:
            if t is not None and t.dtype not in DTYPES.values():
                raise TypeError(f"{name}: {t.dtype} is not a kernel dtype")

    previous = driver._active  # None until a driver was needed; reset_active() would make one
    driver.set_active(StandInDriver(arch))
    patch(
        JITFunction,
        "run",
        lambda fn, *a, grid, warmup, **kw: recorder(fn, *a, grid=grid, warmup=warmup, **kw),
    )
    for mod in KERNEL_MODULES:
        module = sys.modules[f"tutorial_lib.kernels.{mod}"]
        if hasattr(module, "check_kernel_inputs"):
            patch(module, "check_kernel_inputs", dtypes_only)
    ce = sys.modules["tutorial_lib.kernels.cross_entropy"]
    patch(ce, "_check_targets", lambda targets, M, V, ignore_index: None)
    try:
        yield recorder
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        driver._active = previous


def _fake() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def _gpt_step(preset: Any, precision: str, region: Any) -> None:
    """The fused GPT under ``precision``, its forward in ``region`` (an autocast), and backward,
    at the preset's size."""
    from unittest import mock

    from tutorial_lib.build import build_model

    cfg = preset.model_config()
    with _fake():
        with mock.patch.object(torch.nn.Module, "to", lambda self, *a, **k: self):
            model = build_model(cfg, fused=True, precision=precision)  # fake: cannot move or swap
        idx = torch.zeros(preset.batch_size, cfg.block_size, dtype=torch.long)
        with region:
            _, loss = model(idx, idx)
        loss.backward()


def _model_step(preset: Any, dtype: str) -> None:
    """The fused GPT with ``dtype`` through autocast (FP32: none)."""
    _gpt_step(preset, "fp32", torch.autocast("cpu", dtype=DTYPES[dtype], enabled=dtype != "fp32"))


def _fp8_step(preset: Any, dtype: str) -> None:
    """The fused GPT under the ``fp8`` policy (the ladder's fused FP8 rung): the GELU kernel gets
    no bias there (the FP8 GEMM adds it). Its own autocast is BF16, so it runs once."""
    from tutorial_lib.precision import get_policy

    if dtype == "bf16":
        _gpt_step(preset, "fp8", get_policy("fp8").autocast("cpu"))


def _attention(preset: Any, dtype: str) -> None:
    from tutorial_lib.kernels import flash_attention

    cfg = preset.model_config()
    shape = (preset.batch_size, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head)
    with _fake():
        q, k, v = (torch.zeros(shape, dtype=DTYPES[dtype], requires_grad=True) for _ in range(3))
        flash_attention(q, k, v).sum().backward()


def _softmax(preset: Any, dtype: str) -> None:
    from tutorial_lib.kernels import softmax

    cfg = preset.model_config()
    T = cfg.block_size
    rows = preset.bench_batch_size * cfg.n_head * T  # chapter 7's attention rows
    with _fake():
        x = torch.zeros(rows, T, dtype=DTYPES[dtype], requires_grad=True)
        softmax(x).sum().backward()


def _wide_rows(preset: Any, dtype: str) -> None:
    """Rows wider than MAX_ROW_BLOCK take the two-pass chunked LayerNorm kernels."""
    from tutorial_lib.kernels import add_layer_norm, layer_norm
    from tutorial_lib.kernels.runtime import MAX_ROW_BLOCK

    width = 2 * MAX_ROW_BLOCK
    with _fake():
        x = torch.zeros(64, width, dtype=DTYPES[dtype], requires_grad=True)
        r = torch.zeros(64, width, dtype=DTYPES[dtype], requires_grad=True)
        w = torch.ones(width, requires_grad=True)
        b = torch.zeros(width, requires_grad=True)
        layer_norm(x, w, b).sum().backward()
        s, y = add_layer_norm(x, r, w, b)
        (s.sum() + y.sum()).backward()


def _exercise(preset: Any, dtype: str) -> None:
    from exercise_solutions import fused_bias_gelu

    cfg = preset.model_config()
    with _fake():
        x = torch.zeros(preset.batch_size * cfg.block_size, 4 * cfg.n_embd, dtype=DTYPES[dtype])
        fused_bias_gelu(x, torch.zeros(4 * cfg.n_embd, dtype=DTYPES[dtype]))


CASES: dict[str, Callable[[Any, str], None]] = {
    "gpt step": _model_step,
    "gpt step fp8": _fp8_step,
    "flash attention": _attention,
    "softmax": _softmax,
    "wide rows": _wide_rows,
    "exercise 7.1": _exercise,
}


def package_kernels() -> tuple[list[str], list[str]]:
    """Every ``@triton.jit`` function of the package, and those only called from other kernels
    (device functions, compiled into their callers)."""
    import exercise_solutions as solutions

    found: dict[str, JITFunction] = {}
    for module in [sys.modules[f"tutorial_lib.kernels.{m}"] for m in KERNEL_MODULES] + [solutions]:
        for value in vars(module).values():
            if isinstance(value, JITFunction) and value.fn.__module__ == module.__name__:
                found[value.fn.__name__] = value
    callees = sorted(
        name
        for name in found
        if any(f"{name}(" in other.src for o, other in found.items() if o != name)
    )
    return sorted(found), callees


def run(arch: int, presets: list[str], dtypes: list[str]) -> dict[str, Any]:
    from tutorial_lib.config import get_preset

    with compile_only(arch) as recorder:
        for preset_name in presets:
            preset = get_preset(preset_name)
            for case, fn in CASES.items():
                for dtype in dtypes:
                    recorder.case = f"{preset_name} {case} {dtype}"
                    try:
                        fn(preset, dtype)
                    except Exception as exc:  # a launcher failed before reaching Triton
                        tb = traceback.format_exc(limit=-3)
                        recorder.errors.append(
                            {"kernel": "-", "case": recorder.case, "error": _short(exc) + "\n" + tb}
                        )
        kernels, callees = package_kernels()
    return {
        "arch": arch,
        "triton": triton.__version__,
        "compiled": recorder.compiled,
        "errors": recorder.errors,
        "kernels": kernels,
        "device_functions": callees,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, required=True, help="compute capability, e.g. 90 or 80")
    p.add_argument("--presets", default="ci,hopper")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--json", type=Path, help="write the report here (default: stdout)")
    args = p.parse_args(argv)
    report = run(args.arch, args.presets.split(","), args.dtypes.split(","))
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
