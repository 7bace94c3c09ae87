"""Delayed scaling, the stateful recipe: an ``FP8Linear``'s scaling state and its quantizers.

``DelayedScalingState`` is the layer's state: six float32 buffers (``fp8_amax_history_fwd``
(L, 3), ``fp8_scale_fwd`` (3,), ``fp8_scale_inv_fwd`` (3,) and the ``_bwd`` ones with 2 columns)
viewed as ``fp8_state``, an ``FP8ModuleState``; resizing the history; loading a state dict.

``DelayedOperands`` is what the layer's GEMMs quantize with under ``DelayedScaling``: each
operand is cast with the layer's current scale, chosen *before* the tensor was seen
(``quantizers.DelayedQuantizer``), and its amax is folded into row 0 of the history, which
``fp8.autocast`` turns into the next step's scale (``scaling.update_amax_and_scale``). One scale
per tensor, so the column-wise copy a backward GEMM needs is the row-wise copy transposed:
nothing is cast or recorded twice. The other recipes' operands are stateless
(``linear_function.RecipeOperands``); both feed the one ``FP8LinearFunction``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .autocast import BackwardStep
from .quantizers import DelayedQuantizer, QuantizedTensor
from .recipes import DelayedScaling
from .scaling import GEMM1_INPUT, GEMM1_WEIGHT, GRAD_OUTPUT1, FP8ModuleState, ScalingMeta

__all__ = ["DelayedOperands", "DelayedScalingState", "FP8_BUFFERS"]

FP8_BUFFERS = {  # the layer's buffer names per direction
    "forward": ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_scale_inv_fwd"),
    "backward": ("fp8_amax_history_bwd", "fp8_scale_bwd", "fp8_scale_inv_bwd"),
}
_COLUMNS = {"forward": 3, "backward": 2}
OPERAND_SLOTS = {  # operand: (direction, column of its scaling state)
    "input": ("forward", GEMM1_INPUT),
    "weight": ("forward", GEMM1_WEIGHT),
    "grad_output": ("backward", GRAD_OUTPUT1),
}


class DelayedScalingState(nn.Module):
    """Mixin for ``FP8Linear`` (before ``nn.Linear`` in the bases): the delayed-scaling buffers
    and ``fp8_state`` over them, and the loading of a state dict's scaling state. The layer
    calls ``_init_fp8_buffers`` in ``__init__``."""

    fp8_state: FP8ModuleState

    def _init_fp8_buffers(self, length: int, device: torch.device | str | None) -> None:
        fresh = FP8ModuleState(
            ScalingMeta.create(_COLUMNS["forward"], length, device),
            ScalingMeta.create(_COLUMNS["backward"], length, device),
        )
        for direction, names in FP8_BUFFERS.items():
            meta = getattr(fresh, direction)
            for name, key in zip(names, ("amax_history", "scale", "scale_inv"), strict=True):
                self.register_buffer(name, getattr(meta, key))
        self._bind_state()

    def _buffer(self, name: str) -> torch.Tensor:
        buf = self._buffers[name]
        if buf is None:
            raise RuntimeError(f"FP8Linear lost its scaling buffer {name!r}.")
        return buf

    def _bind_state(self) -> None:
        """(Re)build ``fp8_state`` as views of the buffers (after ``.to()``, a resize, ...)."""
        metas = [ScalingMeta(*(self._buffer(n) for n in FP8_BUFFERS[d])) for d in FP8_BUFFERS]
        self.fp8_state = FP8ModuleState(*metas)

    def _apply(self, fn: Any, recurse: bool = True) -> DelayedScalingState:
        super()._apply(fn, recurse)
        for names in FP8_BUFFERS.values():  # scaling state stays float32 under .half()/.to(bf16)
            for name in names:
                if self._buffer(name).dtype != torch.float32:
                    self._buffers[name] = self._buffer(name).float()
        self._bind_state()
        return self

    def _ensure_history_len(self, length: int) -> None:
        current = self.fp8_state.forward.history_len
        if length == current:
            return
        for names in FP8_BUFFERS.values():
            old = self._buffer(names[0])
            new = old.new_zeros(length, old.shape[1])
            keep = min(length, current)
            new[:keep] = old[:keep]
            self._buffers[names[0]] = new
        self._bind_state()

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        names = [n for ns in FP8_BUFFERS.values() for n in ns]
        present = [n for n in names if prefix + n in state_dict]
        if not present:  # a plain nn.Linear state dict: keep the current scaling state
            persistent = dict(self._buffers)
            for n in names:
                self._buffers.pop(n)
            try:
                super()._load_from_state_dict(
                    state_dict,
                    prefix,
                    local_metadata,
                    strict,
                    missing_keys,
                    unexpected_keys,
                    error_msgs,
                )
            finally:
                self._buffers.clear()
                self._buffers.update(persistent)
            return
        saved = state_dict[prefix + names[0]].shape if prefix + names[0] in state_dict else None
        ours = self.fp8_state.forward.amax_history.shape
        if saved is not None and tuple(saved) != tuple(ours):
            error_msgs.append(
                f"{prefix}{names[0]}: the checkpoint's FP8 amax history has shape "
                f"{tuple(saved)}, this layer's {tuple(ours)}. Build the FP8 layers with "
                f"amax_history_len={saved[0]} (convert_to_fp8(..., amax_history_len={saved[0]}) "
                f"and DelayedScaling(amax_history_len={saved[0]})) before loading."
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


@dataclass(eq=False)
class DelayedOperands:
    """The quantizers of one ``FP8Linear`` call under delayed scaling (module docstring).

    replay: a checkpoint recompute's recorded forward (scale, scale_inv); the forward operands
        are cast with them and nothing is recorded.
    step: the region's backward update, which this call's backward runs when it is done
        (``autocast.register_fp8_run``: the first module needing grad takes it)."""

    recipe: DelayedScaling
    state: FP8ModuleState
    replay: tuple[torch.Tensor, torch.Tensor] | None = None
    step: BackwardStep | None = None

    def rowwise(self, role: str, x: torch.Tensor) -> QuantizedTensor:
        direction, index = OPERAND_SLOTS[role]
        meta: ScalingMeta = getattr(self.state, direction)
        replay = self.replay if direction == "forward" else None
        scale, scale_inv = replay if replay is not None else (meta.scale, meta.scale_inv)
        cast = DelayedQuantizer(role=role, fp8_format=self.recipe.fp8_format, scale=scale[index])
        q = cast.quantize(x)
        if replay is None:
            meta.fold_amax(index, q.amax)
        # TE keeps the reciprocal it computed at the update; a copy, as the update rewrites it
        return dataclasses.replace(q, scale_inv=scale_inv[index].clone())

    def columnwise(
        self, role: str, x: torch.Tensor, rowwise: QuantizedTensor | None
    ) -> QuantizedTensor:
        q = rowwise if rowwise is not None else self.rowwise(role, x)
        return dataclasses.replace(q, data=q.data.t(), tile=(q.tile[1], q.tile[0]))

    def backward_done(self) -> None:
        if self.step is not None:
            self.step.update()
