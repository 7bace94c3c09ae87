"""``FP8Linear`` under ``DelayedScaling``: its scaling state and its GEMMs.

``DelayedScalingState`` is the layer's state: six float32 buffers (``fp8_amax_history_fwd``
(L, 3), ``fp8_scale_fwd`` (3,), ``fp8_scale_inv_fwd`` (3,) and the ``_bwd`` ones with 2 columns)
viewed as ``fp8_state``, an ``FP8ModuleState``; quantizing with the current scale and recording
amax (``_quantize``); resizing the history; loading a state dict. ``_FP8LinearFunction`` is the
autograd Function of the three FP8 GEMMs (forward, dgrad, wgrad). ``fp8.linear`` holds the layer
itself; ``recipe_linear`` its GEMMs under the other recipes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .autocast import FP8AutocastState, _BackwardStep
from .formats import quantize
from .gemm import scaled_gemm
from .scaling import (
    GEMM1_INPUT,
    GEMM1_WEIGHT,
    GRAD_OUTPUT1,
    DelayedScaling,
    FP8ModuleState,
    ScalingMeta,
)
from .stats import QuantStats, quant_stats

if TYPE_CHECKING:
    from .linear import FP8Linear

__all__ = ["DelayedScalingState"]

_BUFFERS = {
    "forward": ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_scale_inv_fwd"),
    "backward": ("fp8_amax_history_bwd", "fp8_scale_bwd", "fp8_scale_inv_bwd"),
}
_COLUMNS = {"forward": 3, "backward": 2}
_STAT_SLOTS = {
    "input": ("forward", GEMM1_INPUT),
    "weight": ("forward", GEMM1_WEIGHT),
    "grad_output": ("backward", GRAD_OUTPUT1),
}


class DelayedScalingState(nn.Module):
    """Mixin for ``FP8Linear`` (before ``nn.Linear`` in the bases): the delayed-scaling buffers
    and ``fp8_state`` over them. The layer calls ``_init_fp8_buffers`` in ``__init__``,
    ``_load_fp8_state_dict`` from ``_load_from_state_dict``, and sets ``_last_stats`` and
    ``_stats_recipe``, which ``_quantize`` fills when it records statistics."""

    fp8_state: FP8ModuleState
    _last_stats: dict[str, QuantStats]
    _stats_recipe: str

    def _init_fp8_buffers(self, length: int, device: torch.device | str | None) -> None:
        fresh = FP8ModuleState(
            ScalingMeta.create(_COLUMNS["forward"], length, device),
            ScalingMeta.create(_COLUMNS["backward"], length, device),
        )
        for direction, names in _BUFFERS.items():
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
        metas = [ScalingMeta(*(self._buffer(n) for n in _BUFFERS[d])) for d in _BUFFERS]
        self.fp8_state = FP8ModuleState(*metas)

    def _apply(self, fn: Any, recurse: bool = True) -> DelayedScalingState:
        super()._apply(fn, recurse)
        for names in _BUFFERS.values():  # scaling state stays float32 under .half()/.to(bf16)
            for name in names:
                if self._buffer(name).dtype != torch.float32:
                    self._buffers[name] = self._buffer(name).float()
        self._bind_state()
        return self

    def _ensure_history_len(self, length: int) -> None:
        current = self.fp8_state.forward.history_len
        if length == current:
            return
        for names in _BUFFERS.values():
            old = self._buffer(names[0])
            new = old.new_zeros(length, old.shape[1])
            keep = min(length, current)
            new[:keep] = old[:keep]
            self._buffers[names[0]] = new
        self._bind_state()

    def _quantize(
        self,
        name: str,
        x: torch.Tensor,
        fmt: Any,
        collect_stats: bool,
        replay: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize with the current scale, record amax into row 0; (fp8 tensor, scale_inv).
        ``replay`` (a checkpoint recompute): the recorded forward scales; nothing recorded."""
        direction, index = _STAT_SLOTS[name]
        meta: ScalingMeta = getattr(self.fp8_state, direction)
        if replay is not None:
            return quantize(x, fmt, replay[0][index]), replay[1][index].clone()
        scale = meta.scale[index]
        q = quantize(x, fmt, scale)
        meta.record_amax(index, x)
        if collect_stats:
            self._last_stats[name] = quant_stats(x, fmt, scale)
            self._stats_recipe = "delayed"
        return q, meta.scale_inv[index].clone()  # a copy: the update at exit rewrites the buffer

    def _load_fp8_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        names = [n for ns in _BUFFERS.values() for n in ns]
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


class _FP8LinearFunction(torch.autograd.Function):
    """FP8 GEMMs forward (E4M3 x E4M3) and backward (grad format x E4M3), delayed scaling."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        module: FP8Linear,
        fp8: FP8AutocastState,
        out_dtype: torch.dtype,
        emulate: bool,
        step: _BackwardStep | None,
        replay: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        recipe = fp8.recipe
        assert isinstance(recipe, DelayedScaling)  # the other recipes run in recipe_linear
        fmt = recipe.fwd_format
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, x.shape[-1])
            x_fp8, x_inv = module._quantize("input", x2, fmt, fp8.collect_stats, replay)
            w_fp8, w_inv = module._quantize("weight", weight, fmt, fp8.collect_stats, replay)
            b = None if bias is None else bias.to(out_dtype)
            fast = fp8.recipe.fp8_gemm_fprop.use_fast_accum  # TE: fast accumulation in fprop
            out = scaled_gemm(
                x_fp8, x_inv, w_fp8.t(), w_inv, b, out_dtype, emulate, use_fast_accum=fast
            )
        ctx.save_for_backward(x_fp8, w_fp8, x_inv, w_inv)
        ctx.module, ctx.fp8, ctx.step, ctx.emulate = module, fp8, step, emulate
        ctx.x_shape, ctx.x_dtype, ctx.out_dtype = x.shape, x.dtype, out_dtype
        ctx.w_dtype, ctx.b_dtype = weight.dtype, None if bias is None else bias.dtype
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_fp8, w_fp8, x_inv, w_inv = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad = wgrad = bgrad = None
        with torch.autocast(grad_out.device.type, enabled=False):
            g = grad_out.reshape(-1, grad_out.shape[-1])
            fmt, stats = ctx.fp8.recipe.bwd_format, ctx.fp8.collect_stats
            emulate = ctx.emulate
            g_fp8, g_inv = ctx.module._quantize("grad_output", g, fmt, stats)
            recipe = ctx.fp8.recipe  # TE: split accumulation for dgrad and wgrad
            if need_x:
                fast = recipe.fp8_gemm_dgrad.use_fast_accum
                dgrad = scaled_gemm(
                    g_fp8, g_inv, w_fp8, w_inv, None, ctx.out_dtype, emulate, use_fast_accum=fast
                )
                dgrad = dgrad.reshape(ctx.x_shape).to(ctx.x_dtype)
            if need_w:
                fast, f32 = recipe.fp8_gemm_wgrad.use_fast_accum, torch.float32
                wgrad = scaled_gemm(
                    g_fp8.t(), g_inv, x_fp8, x_inv, None, f32, emulate, use_fast_accum=fast
                )
                wgrad = wgrad.to(ctx.w_dtype)
            if need_b and ctx.b_dtype is not None:
                bgrad = g.float().sum(0).to(ctx.b_dtype)
        if ctx.step is not None:  # the region's first FP8 module needing grad: backward runs last
            ctx.step.update()
        return dgrad, wgrad, bgrad, None, None, None, None, None, None
