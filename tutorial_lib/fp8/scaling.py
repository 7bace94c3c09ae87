"""Delayed scaling: Transformer Engine's FP8 recipe, its state, and its update rule, on any device.

A quantized tensor needs a scale that maps its largest magnitude (its *amax*) near the format's
max. Delayed scaling uses the amaxes of earlier steps: each quantize records the amax of the
unscaled tensor into row 0 of an ``(L, n)`` history (one column per tensor of a module), and
after the step ``update_amax_and_scale`` turns the history into next step's scales. Names,
defaults and every rounding follow TE 2.x (``transformer_engine/common/recipe/__init__.py``,
``transformer_engine/common/recipe/delayed_scaling.cu``, ``transformer_engine/pytorch/
quantization.py``), so a reader can move between the two without translation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch

from .formats import E4M3 as _E4M3
from .formats import E5M2 as _E5M2
from .formats import FP8Format

__all__ = [
    "Format",
    "MMParams",
    "AmaxAlgo",
    "GEMM1_INPUT",
    "GEMM1_WEIGHT",
    "GEMM1_OUTPUT",
    "GRAD_OUTPUT1",
    "GRAD_INPUT1",
    "FLT_MAX",
    "update_amax_and_scale",
    "ScalingMeta",
    "FP8ModuleState",
]

FLT_MAX = torch.finfo(torch.float32).max  # an infinite new scale becomes this (TE)
AMAX_ALGOS = ("max", "most_recent")
AmaxAlgo = str | Callable[[torch.Tensor], torch.Tensor]  # "max", "most_recent", or (L, n) -> (n,)


class ScalingRecipe(Protocol):
    """What the delayed-scaling update reads from its recipe (``recipes.DelayedScaling``)."""

    @property
    def margin(self) -> int: ...

    @property
    def amax_compute_algo(self) -> AmaxAlgo: ...

    @property
    def fp8_format(self) -> Format: ...


class Format(Enum):
    """FP8 formats of a recipe, as (forward format, backward format).

    Values:
        E4M3: every FP8 tensor in E4M3.
        HYBRID: E4M3 in the forward pass (activations, weights), E5M2 in the backward pass
            (gradients). TE's default.
        E5M2: every FP8 tensor in E5M2. Exists, but recipes reject it (as TE's do).
    """

    E4M3 = (_E4M3, _E4M3)
    HYBRID = (_E4M3, _E5M2)
    E5M2 = (_E5M2, _E5M2)

    @property
    def fwd(self) -> FP8Format:
        return self.value[0]

    @property
    def bwd(self) -> FP8Format:
        return self.value[1]

    def __repr__(self) -> str:
        return f"Format.{self.name}"


# Columns of a module's history, as TE's ``FP8FwdTensors``/``FP8BwdTensors`` (``csrc/common.h``):
# 3 forward tensors per GEMM (input, weight, output), 2 backward (grad_output, grad_input), so a
# second GEMM's input is column 3 and its grad_output column 2.
GEMM1_INPUT, GEMM1_WEIGHT, GEMM1_OUTPUT = 0, 1, 2
GRAD_OUTPUT1, GRAD_INPUT1 = 0, 1
FWD_TENSORS_PER_GEMM, BWD_TENSORS_PER_GEMM = 3, 2


@dataclass(frozen=True)
class MMParams:
    """Options of one FP8 GEMM (TE's ``MMParams``, ``transformer_engine/common/recipe``).

    use_split_accumulator: True (TE's default for the class): the tensor cores' partial sums
        are promoted into a float32 accumulator at intervals (cuBLASLt without
        ``CUBLASLT_MATMUL_DESC_FAST_ACCUM``). False: fast accumulation, the whole sum in the
        FP8 tensor cores' own accumulator, which keeps fewer bits (faster, less precise).
        ``torch._scaled_mm`` gets ``use_fast_accum = not use_split_accumulator``.
    """

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        split = self.use_split_accumulator
        if not isinstance(split, bool):
            raise TypeError(f"MMParams.use_split_accumulator must be a bool, got {split!r}.")

    @property
    def use_fast_accum(self) -> bool:
        """``torch._scaled_mm``'s flag: fast accumulation is the opposite of split."""
        return not self.use_split_accumulator


def check_amax_algo(algo: object) -> None:
    if not callable(algo) and algo not in AMAX_ALGOS:
        raise ValueError(
            f"amax_compute_algo must be 'max', 'most_recent' or a callable "
            f"(history (L, n) -> amax (n,)), got {algo!r}."
        )


# ---- the update rule -------------------------------------------------------------------------
def _check_state(amax_history: torch.Tensor, **vectors: torch.Tensor | None) -> None:
    """``amax_history`` float32 of shape (L >= 1, n); each named vector float32 of shape (n,)."""
    if amax_history.dim() != 2 or amax_history.shape[0] < 1:
        raise ValueError(
            f"amax_history must have shape (L >= 1, n), got {tuple(amax_history.shape)}."
        )
    n = amax_history.shape[1]
    for name, t in {"amax_history": amax_history, **vectors}.items():
        if t is not None and t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}.")
        if t is not None and t is not amax_history and tuple(t.shape) != (n,):
            raise ValueError(
                f"{name} must have shape ({n},) to match amax_history, got {tuple(t.shape)}."
            )


def _scaled_max(fp8_max: float, margin: int, like: torch.Tensor) -> torch.Tensor:
    """``fp8_max * 2**-margin`` as TE forms it: float32 product of float32 ``fp8_max`` and
    ``powf(2, -margin)`` (exact for integer margins), as an ``(n,)`` tensor."""
    max_f32 = torch.tensor(fp8_max, dtype=torch.float32, device=like.device)
    pow2_f32 = torch.tensor(2.0**-margin, dtype=torch.float32, device=like.device)
    product = max_f32 * pow2_f32
    return product.expand(like.shape[-1]).clone()


def _new_scale(amax: torch.Tensor, scale: torch.Tensor, scaled_max: torch.Tensor) -> torch.Tensor:
    usable = torch.isfinite(amax) & (amax > 0)
    # tensor / tensor: a true float32 division (a Python float / tensor may be off by an ulp).
    quotient = scaled_max / torch.where(usable, amax, torch.ones_like(amax))
    new = torch.where(usable, quotient, scale)
    return torch.where(torch.isinf(new), torch.full_like(new, FLT_MAX), new)


def _rolled(history: torch.Tensor, current: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(window, new history): window = rows 1..L-1 then ``current``; the new history is that
    window with its row 0 cleared for the next step's amax."""
    window = torch.cat([history[1:], current[None]])
    return window, torch.cat([torch.zeros_like(current)[None], window[1:]])


def update_amax_and_scale(
    amax_history: torch.Tensor,
    scale: torch.Tensor,
    fp8_max: float,
    margin: int,
    amax_compute_algo: AmaxAlgo,
    reduced_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One delayed-scaling update: ``(new_history (L, n), new_scale (n,))``; inputs untouched.

    For "max" and "most_recent" this is bit for bit TE's fused kernel (``kernel_bulk`` in
    ``transformer_engine/common/recipe/delayed_scaling.cu``), per column:
    Current amax:
        ``reduced_amax`` where it is given and non-zero, else row 0 (TE passes the all-reduced
        copy of row 0 as ``amax_reduction_buffer`` and tests each element).
    History:
        if current != 0 (NaN counts as non-zero, -0 as zero), row i <- row i+1, the last row
        <- current, then row 0 <- 0, ready for the next step. If current == 0 nothing changes.
    Amax:
        "max": the maximum of the window (old rows 1..L-1 and current) taken like CUDA's
        ``fmaxf`` starting from 0, so NaN entries are ignored and negatives give 0; if current
        == 0 the amax is 0 (the history is not consulted). "most_recent": the current amax.
    Scale:
        ``scaled_max / amax`` in float32, where ``scaled_max = float32(fp8_max) * powf(2,
        -margin)`` (exactly ``fp8_max * 2**-margin``), if amax is finite and > 0; else the old
        scale. An infinite result (a tiny or subnormal amax; or an inf old scale) becomes
        FLT_MAX. TE's docs write ``(fp8_max / amax) / 2**margin``, which its unfused Python path
        computes; it can differ where ``fp8_max / amax`` overflows but the kernel's quotient
        does not, and by an ulp (Python float / tensor is a reciprocal times the float).
    Callable algos follow TE's unfused path (``_amax_and_scale_update`` in ``quantization.py``):
        row 0 is set to the current amax, the callable sees that ``(L, n)`` history (a copy),
        and the history always rolls, even when the current amax is 0. The scale uses the
        kernel's arithmetic above.
    """
    _check_state(amax_history, scale=scale, reduced_amax=reduced_amax)
    check_amax_algo(amax_compute_algo)
    row0 = amax_history[0]
    current = row0 if reduced_amax is None else torch.where(reduced_amax != 0, reduced_amax, row0)
    window, rolled = _rolled(amax_history, current)
    if callable(amax_compute_algo):
        amax = _callable_amax(amax_compute_algo, torch.cat([current[None], amax_history[1:]]))
        new_history = rolled
    else:
        roll = current != 0
        new_history = torch.where(roll, rolled, amax_history)
        if amax_compute_algo == "most_recent":
            amax = current
        else:  # "max": fmaxf from 0 over the window, only when the history rolls
            window_max = torch.where(torch.isnan(window), 0.0, window).amax(dim=0).clamp(min=0.0)
            amax = torch.where(roll, window_max, torch.zeros_like(window_max))
    new_scale = _new_scale(amax, scale, _scaled_max(fp8_max, margin, amax_history))
    return new_history, new_scale


def _callable_amax(algo: Callable, history: torch.Tensor) -> torch.Tensor:
    amax, n = algo(history.clone()), history.shape[1]
    if not isinstance(amax, torch.Tensor) or tuple(amax.shape) != (n,):
        raise ValueError(f"amax_compute_algo must return a tensor of shape ({n},), got {amax!r}.")
    return amax.to(torch.float32)


# ---- state -----------------------------------------------------------------------------------
@dataclass
class ScalingMeta:
    """The delayed-scaling state of one group of n tensors (TE's ``fp8_meta["scaling_fwd"]``).

    Tensors (float32, one device):
        amax_history: (L, n); row 0 collects this step's amaxes, rows 1.. are earlier steps.
        scale: (n,) multiplies a tensor before the FP8 cast. scale_inv: (n,) = 1 / scale.
    Fresh state (``create``) has a zero history and unit scales, as in TE.
    """

    amax_history: torch.Tensor
    scale: torch.Tensor
    scale_inv: torch.Tensor

    def __post_init__(self) -> None:
        _check_state(self.amax_history, scale=self.scale, scale_inv=self.scale_inv)

    @classmethod
    def create(
        cls, num_tensors: int, history_len: int, device: torch.device | str | None = None
    ) -> ScalingMeta:
        f32 = torch.float32
        return cls(
            amax_history=torch.zeros(history_len, num_tensors, dtype=f32, device=device),
            scale=torch.ones(num_tensors, dtype=f32, device=device),
            scale_inv=torch.ones(num_tensors, dtype=f32, device=device),
        )

    @property
    def num_tensors(self) -> int:
        return self.amax_history.shape[1]

    @property
    def history_len(self) -> int:
        return self.amax_history.shape[0]

    def fold_amax(self, index: int, amax: torch.Tensor) -> None:
        """Fold a tensor's amax (unscaled, float32: ``quantizers.base.tensor_amax``, NaN elements
        skipped, inf kept) into row 0, column ``index``. As TE's cast kernels (``atomicMaxFloat``
        on the history slot, never reset before a delayed-scaling cast), a tensor quantized twice
        in one step keeps the larger amax."""
        slot = self.amax_history[0, index]
        slot.copy_(torch.maximum(slot, amax.to(slot.device)))

    def update(
        self, recipe: ScalingRecipe, fp8_max: float, reduced_amax: torch.Tensor | None = None
    ) -> None:
        """Apply ``update_amax_and_scale`` in place (views of these tensors stay valid)."""
        algo, margin = recipe.amax_compute_algo, recipe.margin
        history, scale = update_amax_and_scale(
            self.amax_history, self.scale, fp8_max, margin, algo, reduced_amax
        )
        self.amax_history.copy_(history)
        self.scale.copy_(scale)
        self.scale_inv.copy_(torch.ones_like(scale) / scale)  # tensor / tensor, as TE's 1 / scale


@dataclass
class FP8ModuleState:
    """A module's forward (input, weight, output per GEMM) and backward (grad_output,
    grad_input per GEMM) scaling state; column indices ``GEMM1_*`` and ``GRAD_*1`` for one GEMM."""

    forward: ScalingMeta
    backward: ScalingMeta

    def update(
        self, recipe: ScalingRecipe, forward: bool, reduced_amax: torch.Tensor | None = None
    ) -> None:
        """Update the forward (``fp8_format.fwd.max``) or backward (``fp8_format.bwd.max``)
        group."""
        if forward:
            self.forward.update(recipe, recipe.fp8_format.fwd.max, reduced_amax)
        else:
            self.backward.update(recipe, recipe.fp8_format.bwd.max, reduced_amax)
