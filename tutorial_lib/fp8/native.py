"""Where each FP8 recipe runs natively, and whether a call on a device must be emulated.

Our ``FP8Linear`` calls ``torch._scaled_mm`` for the per-tensor and row-wise recipes on FP8 GPUs,
and torch's blockwise kernel (``fp8.tiled_gemm``) for the block recipe on Hopper; MXFP8 and NVFP4
it always emulates, since their native kernels here are Transformer Engine's (the ``te-fp8``
policy). On a GPU that cannot run a recipe natively, ``check_recipe_device`` raises an error
naming the GPU the recipe needs, unless emulation is asked for (``emulate=True``). A CPU always
emulates. Which kernel a GEMM then runs is ``linear_function.quantized_matmul``'s choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hardware import cuda_capability
from .recipes import recipe_name
from .scaling import Format

__all__ = ["NATIVE", "NativeSupport", "check_recipe_device"]


@dataclass(frozen=True)
class NativeSupport:
    """Where a recipe's GEMMs run natively.

    min_cc: the oldest GPU architecture with the math (compute capability); gpus: its names.
    ours: True when ``FP8Linear`` itself calls the native kernel there (``torch._scaled_mm``,
        ``torch.nn.functional.scaled_mm``); False when only Transformer Engine has it (``te-fp8``
        policy), so ours emulates.
    ours_below: the first architecture where our kernel no longer runs (None: none);
        torch's blockwise kernel is Hopper's only.
    min_cuda: the CUDA version torch must be built with for our kernel (None: any).
    note: what else it needs.
    """

    min_cc: tuple[int, int]
    gpus: str
    ours: bool
    note: str = ""
    ours_below: tuple[int, int] | None = None
    min_cuda: tuple[int, int] | None = None

    def runs_ours(self, cc: tuple[int, int]) -> bool:
        """Whether ``FP8Linear`` runs the recipe natively on a GPU of compute capability ``cc``."""
        below = self.ours_below is None or cc < self.ours_below
        return self.ours and self.min_cc <= cc and below


# From TE's support checks (pytorch/quantization.py: check_fp8_support, check_mxfp8_support,
# check_fp8_block_scaling_support, check_nvfp4_support) and torch's scaled-GEMM requirements
# (aten/src/ATen/native/cuda/ScaledBlas.cpp: the blockwise 1x128/128x128 kernel is sm_90 with
# cuBLAS 12.9+ only, E4M3 operands only).
NATIVE: dict[str, NativeSupport] = {
    "delayed": NativeSupport((8, 9), "Ada (sm_89), Hopper (sm_90) and later", True),
    "current": NativeSupport((8, 9), "Ada (sm_89), Hopper (sm_90) and later", True),
    "rowwise": NativeSupport(
        (8, 9), "Ada (sm_89), Hopper (sm_90) and later", True, "torch._scaled_mm row-wise scales"
    ),
    "block": NativeSupport(
        (9, 0),
        "Hopper (sm_90) and later",
        True,
        "CUDA 12.9+; our kernel (torch's blockwise GEMM) is Hopper's only",
        ours_below=(10, 0),
        min_cuda=(12, 9),
    ),
    "mxfp8": NativeSupport((10, 0), "Blackwell (sm_100)", False, "TE's MXFP8 GEMM"),
    "nvfp4": NativeSupport((10, 0), "Blackwell (sm_100)", False, "TE's NVFP4 GEMM"),
}


def _torch_cuda() -> tuple[int, int] | None:
    """The CUDA version this torch was built with, as (major, minor); None for a CPU build."""
    version = torch.version.cuda
    return None if not version else tuple(int(p) for p in version.split(".")[:2])  # type: ignore[return-value]


def check_recipe_device(
    recipe: object, device: torch.device | str, emulate: bool | None, who: str = "FP8Linear"
) -> bool:
    """Whether ``recipe``'s GEMMs are emulated on ``device``: True on a CPU or when ``emulate``
    is set; False where ``FP8Linear`` runs them natively. Else a RuntimeError naming the GPU
    the recipe needs and how to ask for the emulation."""
    gpu = cuda_capability(device)
    if gpu is None or emulate:
        return True
    name, cc = gpu
    key = recipe_name(recipe)
    native = NATIVE[key]
    problem = _native_problem(recipe, native) if native.runs_ours(cc) else None
    if native.runs_ours(cc) and problem is None:
        return False
    if problem is not None:
        where = f"{name} (sm_{cc[0]}{cc[1]}) runs it natively, but {problem}"
    elif cc >= native.min_cc:  # the GPU has the math; this package has no kernel for it here
        where = (
            f"{name} (sm_{cc[0]}{cc[1]}) has the math for it, but this package's FP8Linear "
            "runs it only as an emulation there: its native GEMMs are Transformer Engine's"
            + (f" ({native.note})" if native.note else "")
        )
    else:
        where = (
            f"natively it needs {native.gpus}"
            + (f" and {native.note}" if native.note else "")
            + ("" if native.ours else ", and this package runs it only as an emulation")
            + f"; {name} is sm_{cc[0]}{cc[1]}"
        )
    # Transformer Engine may run it where our kernel cannot
    te_hint = problem is not None or not native.ours or cc >= native.min_cc
    raise RuntimeError(
        f"{who}: the {key!r} FP8 recipe cannot run natively here: {where}. Ask for the "
        "emulation (exact FP8/FP4 values, float32 math, no "
        "speed-up): FP8Linear(..., emulate=True), tutorial_lib.fp8.autocast(emulate=True) or "
        "make_fp8_policy(..., emulate=True)"
        + (
            f"; or run it with Transformer Engine on such a GPU (te-fp8, recipe {key!r})"
            if te_hint
            else ""
        )
        + ". Or train with 'bf16'."
    )


def _native_problem(recipe: object, native: NativeSupport) -> str | None:
    """Why our native kernel cannot run this recipe's settings (None: it can)."""
    cuda = _torch_cuda()
    if native.min_cuda is not None and not hasattr(torch.nn.functional, "scaled_mm"):
        return (
            f"this torch ({torch.__version__}) has no torch.nn.functional.scaled_mm, which "
            "the blockwise kernel is called through (torch 2.10 and later)"
        )
    if native.min_cuda is not None and (cuda is None or cuda < native.min_cuda):
        need = ".".join(map(str, native.min_cuda))
        return f"this torch is built with CUDA {torch.version.cuda}, and the kernel needs {need}+"
    fmt = getattr(recipe, "fp8_format", None)
    if recipe_name(recipe) == "block" and fmt is not None and fmt != Format.E4M3:
        return (
            f"torch's blockwise kernel takes E4M3 operands only, and fp8_format={fmt.name} "
            "quantizes gradients to E5M2 (use the default Format.E4M3)"
        )
    return None
