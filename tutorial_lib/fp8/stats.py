"""What FP8 does to real tensors: capture a GPT's GEMM operands, and measure quantization error.

``capture_gemm_tensors`` runs one forward and backward pass of a model and keeps, for every
Linear layer, the three tensors an FP8 GEMM quantizes: its input activation, its weight, and the
gradient arriving at its output. ``quant_stats`` then says what ``quantize`` does to a tensor at
a given scale: how many values saturate at the format's max, how many non-zero values flush to
zero, and the error that remains. Chapter 4 plots both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..formats import FloatFormat
from .formats import dequantize, get_fp8_format, quantize

__all__ = [
    "QuantStats",
    "quant_stats",
    "scale_for",
    "capture_gemm_tensors",
    "ScaleTrace",
]


@dataclass(frozen=True)
class QuantStats:
    """Effect of ``quantize(x, fmt, scale)`` on one tensor.

    amax: max |x| of the unscaled tensor; scale: the scale used.
    saturated: fraction of values with |x * scale| > fmt.max (clipped to +-max).
    flushed: fraction of the *non-zero* values that quantize to zero (underflow).
    rel_rmse: ||dequant(quant(x)) - x|| / ||x|| over all values (0 for an all-zero tensor).
    """

    amax: float
    scale: float
    saturated: float
    flushed: float
    rel_rmse: float


def scale_for(amax: float, fmt: FloatFormat | str, margin: int = 0) -> float:
    """The scale that maps ``amax`` onto the format's max, ``fmt.max * 2^-margin / amax``."""
    fp8 = get_fp8_format(fmt)
    if not amax > 0 or not math.isfinite(amax):
        return 1.0
    return fp8.max * 2.0**-margin / amax


def quant_stats(x: torch.Tensor, fmt: FloatFormat | str, scale: float | torch.Tensor) -> QuantStats:
    """Saturation, underflow and error of quantizing ``x`` to ``fmt`` at ``scale``."""
    fp8 = get_fp8_format(fmt)
    x = x.detach().float()
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    q = quantize(x, fp8, s)
    back = dequantize(q, torch.ones_like(s) / s)
    scaled = (x * s).abs()
    nonzero = x != 0
    n_nonzero = int(nonzero.sum())
    norm = x.norm().item()
    return QuantStats(
        amax=x.abs().max().item() if x.numel() else 0.0,
        scale=float(s),
        saturated=(scaled > fp8.max).float().mean().item() if x.numel() else 0.0,
        flushed=((q.float() == 0) & nonzero).sum().item() / n_nonzero if n_nonzero else 0.0,
        rel_rmse=(back - x).norm().item() / norm if norm > 0 else 0.0,
    )


def capture_gemm_tensors(
    model: nn.Module,
    idx: torch.Tensor,
    targets: torch.Tensor,
    names: Sequence[str] | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """One forward + backward; per ``nn.Linear`` name: {"input", "weight", "grad_output"}.

    ``names`` restricts the capture to those layers (at real sizes every layer's activations
    and gradients take many GiB). Tensors are detached float32 copies on the CPU; the model's
    gradients are cleared afterwards.
    """
    captured: dict[str, dict[str, torch.Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or (names is not None and name not in names):
            continue
        slot = captured.setdefault(name, {"weight": module.weight.detach().float().cpu()})

        def fwd_hook(
            _m: nn.Module,
            args: tuple[torch.Tensor, ...],
            _out: object,
            slot: dict[str, torch.Tensor] = slot,
        ) -> None:
            slot["input"] = args[0].detach().float().cpu()

        def bwd_hook(
            _m: nn.Module,
            _gin: object,
            gout: tuple[torch.Tensor, ...],
            slot: dict[str, torch.Tensor] = slot,
        ) -> None:
            slot["grad_output"] = gout[0].detach().float().cpu()

        handles += [
            module.register_forward_hook(fwd_hook),
            module.register_full_backward_hook(bwd_hook),
        ]
    try:
        _, loss = model(idx, targets)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    return captured


@dataclass
class ScaleTrace:
    """Record one FP8 layer's scaling state after every training step.

    Pass it to ``Trainer.train(on_step=...)`` (or ``run_training``). Each call appends a row:
    ``scale_fwd`` (one scale per forward tensor: input, weight), ``scale_bwd`` (grad_output), and
    ``amax_fwd``, the max over the amax history's window (rows 1 and up: row 0 is the slot the
    next step fills), the value the next scale update reads under the ``max`` algorithm.
    """

    layer: str = "blocks.0.mlp.fc"
    rows: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def __call__(self, trainer: Any, row: object = None) -> None:
        modules = dict(trainer.model.named_modules())
        if self.layer not in modules or not hasattr(modules[self.layer], "fp8_state"):
            fp8_layers = [n for n, m in modules.items() if hasattr(m, "fp8_state")]
            raise ValueError(
                f"ScaleTrace: {self.layer!r} is not an FP8 layer of this model; build it with "
                f"precision='fp8'. FP8 layers: {fp8_layers[:4]}{'...' if len(fp8_layers) > 4 else ''}"
            )
        st = modules[self.layer].fp8_state
        self.rows.append(
            {
                "amax_fwd": st.forward.amax_history[1:].max(0).values.clone(),
                "scale_fwd": st.forward.scale.clone(),
                "scale_bwd": st.backward.scale.clone(),
            }
        )

    def series(self, key: str, index: int = 0) -> list[float]:
        """One value per step: ``key`` (``scale_fwd``, ``scale_bwd``, ``amax_fwd``) at ``index``."""
        return [float(r[key][index]) for r in self.rows]
