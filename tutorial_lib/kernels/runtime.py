"""Where the kernels run: compiled for a CUDA GPU, or in Triton's interpreter on the CPU.

Triton decides how a kernel will run when ``@triton.jit`` *decorates* it, not when it is
launched. In Triton 3.x the decorator reads ``triton.knobs.runtime.interpret``; that knob reads
the ``TRITON_INTERPRET`` environment variable afresh on every access (unless someone assigned the
knob in Python). When it is true the decorator returns an ``InterpretedFunction``, which runs
every program of the grid one after another in Python, with NumPy arrays standing in for the
tiles; otherwise it returns a ``JITFunction`` that compiles to PTX on the first launch.

So the mode is chosen in two steps:

1. ``import tutorial_lib`` (which runs before this module can be imported) sets
   ``TRITON_INTERPRET=1`` if there is no CUDA device and the variable is not set (in
   ``tutorial_lib/__init__.py``, the one place that decides). An explicit ``TRITON_INTERPRET=0`` or ``=1`` is left alone, so you can also run the interpreter
   on a GPU machine to debug a kernel with ``print``. The setting is process-wide: it applies to
   every Triton kernel decorated afterwards.
2. This module, which every kernel module imports *before* defining its kernels, then imports
   Triton. If Triton had already been imported (``torch.utils.flop_counter`` imports it, or the
   user did before ``import tutorial_lib``), the variable is still enough for *our* kernels,
   because the knob reads it lazily.
3. But Triton's own library functions (``tl.sum``, ``tl.max``, ``tl.sigmoid``, ...) are
   ``@jit`` functions too, decorated when ``triton.language`` was first imported. If that was
   before the interpreter was switched on, they are compiled-mode ``JITFunction`` objects and a
   kernel that calls them fails in the interpreter with "Cannot call @triton.jit'd outside of
   the scope of a kernel". So in interpreter mode we re-execute ``triton.language.standard`` and
   ``triton.language.random`` (``importlib.reload``) and point ``triton.language``'s names at the
   re-decorated functions (:func:`_redecorate_triton_library`).

The interpreter gives the same answers as the GPU (up to rounding, see below) but is slow:
milliseconds of Python per program, whatever its size. That is why every kernel in this package
gives each program a tile of ``BLOCK_M`` rows, and why :func:`row_tile` picks bigger tiles (fewer
programs) in the interpreter.

One difference to know about: Triton 3.9's interpreter converts float32 to bfloat16 by
*truncating* the mantissa, while the GPU rounds to nearest even. bf16 outputs computed on the CPU
can therefore be one bf16 ulp (2**-7 relative) away from PyTorch's, instead of half an ulp.

If Triton is missing (or fails to import), the kernel modules still import: ``triton.jit``
becomes a decorator that returns the Python function unchanged, and every launcher calls
:func:`check_kernel_inputs`, which raises a ``RuntimeError`` saying ``pip install triton``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


class _MissingTriton:
    """Stands in for the ``triton`` module when it cannot be imported, so that kernel modules
    still import: ``@triton.jit`` leaves the function as plain (never-called) Python."""

    __version__ = "missing"

    @staticmethod
    def jit(fn: Callable[..., Any] | None = None, **_: Any) -> Any:
        return fn if fn is not None else (lambda f: f)


def _redecorate_triton_library(lang: Any) -> int:
    """Re-run ``@jit`` on ``triton.language``'s library modules so that, decorated again now that
    the interpreter is on, they become ``InterpretedFunction`` objects; rebind the names that
    ``triton.language`` re-exports. Returns how many names were rebound (0 if none needed it)."""
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(lang.standard.sum, InterpretedFunction):
        return 0  # triton.language was imported with the interpreter already on
    rebound = 0
    for module in (lang.standard, lang.random):
        old = dict(vars(module))
        importlib.reload(module)
        for name, new in vars(module).items():
            if name in old and new is not old[name] and getattr(lang, name, None) is old[name]:
                setattr(lang, name, new)
                rebound += 1
    return rebound


triton: Any
tl: Any
_TRITON_IMPORT_ERROR: str | None
try:
    # TRITON_INTERPRET is set by now: see step 1 above. Imported under other names and then
    # bound, so that ``triton`` and ``tl`` keep the ``Any`` type declared above.
    import triton as _triton
    import triton.language as _tl

    triton, tl = _triton, _tl
    _TRITON_IMPORT_ERROR = None
except Exception as exc:  # ImportError, or a broken install raising something else
    triton = _MissingTriton()
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

# The widest row a row-wise kernel (LayerNorm, softmax) holds as one tile. Wider LayerNorm rows
# are walked in chunks of this many columns, in two passes (``wide_rows.py``); softmax refuses
# them (the book's softmax rows are at most 2048 wide). Why 4096: it is the tile that
# `row_tile` aims for anyway (8 warps, 16 float32 values per thread per live tile, as at GPT-2's
# width), and every width of ``MODEL_SIZES`` (n_embd <= 4096, context <= 2048) stays one tile.
# A whole-row tile of 65536 float32 values would be 256 KB, an SM's entire register file.
MAX_ROW_BLOCK = 4096
# How many programs a launch aims for in the interpreter (where each costs milliseconds).
INTERPRETER_PROGRAMS = 16


def interpreter_mode() -> bool:
    """True when ``@triton.jit`` kernels run in Triton's CPU interpreter (TRITON_INTERPRET)."""
    if _TRITON_IMPORT_ERROR is None and hasattr(triton, "knobs"):
        return bool(triton.knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


if _TRITON_IMPORT_ERROR is None and interpreter_mode():
    try:
        _redecorate_triton_library(tl)
    except Exception as exc:  # a Triton release that lays out triton.language differently
        warnings.warn(
            f"could not re-decorate triton.language for the interpreter ({exc!r}); if kernels "
            'fail with "Cannot call @triton.jit\'d outside of the scope of a kernel", set '
            "TRITON_INTERPRET=1 in the environment before starting Python",
            RuntimeWarning,
            stacklevel=2,
        )


def triton_status() -> tuple[bool, str]:
    """``(available, reason)``: can the kernels run here, and how (compiled or interpreted)?"""
    if _TRITON_IMPORT_ERROR is not None:
        return False, f"triton is not installed ({_TRITON_IMPORT_ERROR}): pip install triton"
    version = triton.__version__
    if interpreter_mode():
        return True, (
            f"Triton {version} interpreter (TRITON_INTERPRET=1): runs on the CPU through NumPy, "
            "correct but slow"
        )
    if not torch.cuda.is_available():
        return False, (
            f"Triton {version} is installed but there is no CUDA device and TRITON_INTERPRET "
            "is off: set TRITON_INTERPRET=1 before importing tutorial_lib.kernels"
        )
    return True, f"Triton {version}, compiled for CUDA"


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_kernel_inputs(*tensors: torch.Tensor | None, name: str) -> None:
    """Raise a clear error unless the Triton kernel ``name`` can run on ``tensors``.

    ``None`` entries (an absent bias, say) are skipped. Checks, in order: Triton is usable; every
    tensor is on a device the kernel can reach (CUDA when compiled; the interpreter copies CUDA
    tensors to the CPU and back, so it takes either); all are on the same device; each dtype is
    float32, bfloat16 or float16 (the kernels compute in float32 internally).
    """
    available, reason = triton_status()
    if not available:
        raise RuntimeError(f"{name}: the Triton kernel cannot run: {reason}")
    present = [t for t in tensors if t is not None]
    interpreted = interpreter_mode()
    for t in present:
        if not interpreted and t.device.type != "cuda":
            raise ValueError(
                f"{name}: compiled Triton kernels need CUDA tensors, got one on {t.device}; "
                "move it with .cuda() (or set TRITON_INTERPRET=1 to run on the CPU)"
            )
        if t.dtype not in _KERNEL_DTYPES:
            raise TypeError(
                f"{name}: expected float32, bfloat16 or float16 tensors, got {t.dtype}; "
                "cast with .float()"
            )
    devices = {t.device for t in present}
    if len(devices) > 1:
        raise ValueError(
            f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}"
        )


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View ``x`` (..., N) as a contiguous (M, N) matrix of rows (copying only if needed)."""
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension, got a 0-d tensor")
    return x.contiguous().view(-1, x.shape[-1])


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (tile sizes in ``tl.arange`` must be powers of two)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many tiles of size ``b`` cover ``a`` elements."""
    return -(-a // b)


def row_block(n: int) -> tuple[int, bool]:
    """``(BLOCK_N, chunked)`` for a kernel that needs whole rows of ``n`` values.

    Rows of at most ``MAX_ROW_BLOCK`` values are one tile of ``next_power_of_2(n)`` columns, read
    once (``chunked`` False). Wider rows are walked in chunks of ``MAX_ROW_BLOCK`` columns, one
    pass for the row statistics and one to write the result (``chunked`` True). The cap is read
    at every call: tests lower it (to a power of two) to force chunks at small widths.
    """
    block_n = next_power_of_2(n)
    return (block_n, False) if block_n <= MAX_ROW_BLOCK else (MAX_ROW_BLOCK, True)


@dataclass(frozen=True)
class RowTile:
    """How a launch splits an (M, N) matrix: ``block_m`` rows per program, ``num_warps`` each."""

    block_m: int
    num_warps: int


def row_tile(n_rows: int, block_n: int, block_m: int | None = None) -> RowTile:
    """Choose the number of rows each program handles, for tiles of ``block_n`` columns.

    On a GPU a program should hold a few thousand values (4096 here) so that it has enough
    independent work, spread over ``num_warps`` warps (one warp per 512 values, 1 to 16). In the
    interpreter each program costs tens of milliseconds of Python whatever its size (each call
    of ``tl.sum`` alone re-patches ``triton.language``), so we aim for about 16 programs with
    tiles of up to 128K values. ``block_m`` overrides the choice (tests use it to force several
    tiles and ragged tails).
    """
    if block_m is None:
        if interpreter_mode():
            block_m = next_power_of_2(cdiv(n_rows, INTERPRETER_PROGRAMS))
            block_m = max(1, min(block_m, (1 << 17) // block_n))
        else:
            block_m = max(1, min(next_power_of_2(n_rows), 4096 // block_n))
    if block_m != next_power_of_2(block_m):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    num_warps = max(1, min(16, block_m * block_n // 512))
    return RowTile(block_m=block_m, num_warps=next_power_of_2(num_warps))
