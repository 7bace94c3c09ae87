"""The GPT on our Triton kernels: a layer factory, and a transform for a model already built.

``TritonLayers`` is a ``LayerFactory`` (see ``tutorial_lib.layers``): Linear layers stay
``nn.Linear`` (cuBLAS is as good as it gets for a GEMM), and the memory-bound pieces become
kernels from this package:

===================  ==========================================  ==============================
piece                eager PyTorch                               Triton backend
===================  ==========================================  ==============================
``ln1``, ``ln_f``    ``nn.LayerNorm``                            ``layer_norm``
``ln2``              ``x = x + a`` then ``nn.LayerNorm``          ``add_layer_norm`` (one pass)
``mlp.act``          ``fc`` adds its bias, then ``F.gelu``        ``bias_gelu`` (bias + GELU)
``loss_fn``          ``F.cross_entropy(logits.float(), ...)``     ``cross_entropy`` (no FP32
                                                                 copy of the logits, no
                                                                 softmax in memory)
===================  ==========================================  ==============================

Parameter names do not change, so state dicts, checkpoints and the FP8 layer swap work as before.
``use_triton_kernels(model)`` swaps these modules into a model built with another factory.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import GELU, CrossEntropy, TorchLayers
from .bias_gelu import bias_gelu
from .cross_entropy import cross_entropy
from .layernorm import add_layer_norm, layer_norm

__all__ = [
    "TritonLayerNorm",
    "TritonGELU",
    "TritonCrossEntropy",
    "TritonLayers",
    "use_triton_kernels",
]


class TritonLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters) on the Triton kernels; ``forward(x, residual=a)``
    returns ``(x + a, LayerNorm(x + a))`` from one kernel (``Block`` uses it for ``ln2``)."""

    fuses_residual = True

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if len(self.normalized_shape) != 1:
            raise ValueError("TritonLayerNorm normalises over the last dimension only.")
        if residual is None:
            return layer_norm(x, self.weight, self.bias, self.eps)
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps)


class TritonGELU(GELU):
    """GELU (tanh approximation) of ``h + bias`` in one kernel: the MLP hands it ``fc``'s bias."""

    adds_bias = True

    def forward(self, h: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # Under autocast h is BF16 and the bias an FP32 parameter: add it in h's dtype, as
        # autocast's addmm would have.
        return bias_gelu(h, None if bias is None else bias.to(h.dtype))


class TritonCrossEntropy(CrossEntropy):
    """Mean cross-entropy straight from the logits in their own dtype (math in FP32)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets)


class TritonLayers(TorchLayers):
    """A ``LayerFactory``: ``nn.Linear`` for GEMMs, Triton kernels for everything memory-bound."""

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        return TritonLayerNorm(features, eps=1e-5, bias=bias)

    def gelu(self) -> nn.Module:
        return TritonGELU()

    def cross_entropy(self) -> nn.Module:
        return TritonCrossEntropy()


def use_triton_kernels(model: nn.Module) -> nn.Module:
    """Swap a built model's ``nn.LayerNorm``, ``GELU`` and ``CrossEntropy`` modules (exact types,
    so FP8 or TE replacements are left alone) for the Triton ones, in place, sharing parameters.

    Works before or after FP8's Linear swap: ``MLP`` folds the bias into the GELU kernel only
    when ``fc`` is a plain ``nn.Linear`` (an FP8 GEMM adds its bias in the GEMM epilogue).
    Returns ``model``.
    """
    factory = TritonLayers()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                new: nn.Module = TritonLayerNorm(
                    child.normalized_shape, eps=child.eps, elementwise_affine=False, bias=False
                )
                new.weight, new.bias = child.weight, child.bias  # share, do not copy
                new.elementwise_affine = child.elementwise_affine
            elif type(child) is GELU:
                new = factory.gelu()
            elif type(child) is CrossEntropy:
                new = factory.cross_entropy()
            else:
                continue
            new.train(child.training)
            setattr(parent, name, new)
    return model
