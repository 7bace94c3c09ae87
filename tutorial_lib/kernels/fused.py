"""The GPT on our Triton kernels: a layer factory whose modules call them.

``TritonLayers`` is a ``LayerFactory`` (see ``tutorial_lib.layers``): Linear layers stay
``nn.Linear`` (cuBLAS is as good as it gets for a GEMM), and the memory-bound pieces become
kernels from this package:

===================  ==========================================  ==============================
piece                eager PyTorch                               Triton backend
===================  ==========================================  ==============================
``ln1``, ``ln_f``    ``nn.LayerNorm``                            ``layer_norm``
``ln2``              ``x = x + a`` then ``nn.LayerNorm``          ``add_layer_norm`` (one pass,
                                                                 ``AddNormBlock``)
``mlp``              ``fc`` adds its bias, then ``F.gelu``        ``bias_gelu`` (bias + GELU,
                                                                 ``BiasGELUMLP``)
``loss_fn``          ``F.cross_entropy(logits.float(), ...)``     ``cross_entropy`` (no FP32
                                                                 copy of the logits, no
                                                                 softmax in memory)
===================  ==========================================  ==============================

Parameter names do not change, so state dicts and checkpoints move between the two freely.
``build_model(cfg, fused=True)`` builds with this factory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import GELU, CrossEntropy, TorchLayers
from ..model import MLP, Block
from .bias_gelu import bias_gelu
from .cross_entropy import cross_entropy
from .layernorm import add_layer_norm, layer_norm
from .runtime import interpreter_mode

if TYPE_CHECKING:
    from ..config import GPTConfig

__all__ = [
    "TritonLayerNorm",
    "TritonGELU",
    "TritonCrossEntropy",
    "BiasGELUMLP",
    "AddNormBlock",
    "TritonLayers",
]


if interpreter_mode():
    # On a CPU the kernels run in Triton's interpreter: Python code that Dynamo would try to
    # trace (and fail on). torch.compile then runs each kernel call eagerly, a graph break on
    # each side; on a GPU it puts the compiled kernels into its graph.
    layer_norm, add_layer_norm = (
        torch.compiler.disable(layer_norm),
        torch.compiler.disable(add_layer_norm),
    )
    bias_gelu, cross_entropy = (
        torch.compiler.disable(bias_gelu),
        torch.compiler.disable(cross_entropy),
    )


class TritonLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters) on the Triton kernel; ``add_forward(x, a)`` returns
    ``(x + a, LayerNorm(x + a))`` from one kernel (``AddNormBlock`` uses it for ``ln2``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check()
        return layer_norm(x, self.weight, self.bias, self.eps)

    def add_forward(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._check()
        return add_layer_norm(x, a, self.weight, self.bias, self.eps)

    def _check(self) -> None:
        if len(self.normalized_shape) != 1:
            raise ValueError("TritonLayerNorm normalises over the last dimension only.")


class TritonGELU(GELU):
    """GELU (tanh approximation) in one kernel; ``forward(h, bias)`` adds a bias first."""

    def forward(self, h: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # Under autocast h is BF16 and the bias an FP32 parameter: add it in h's dtype, as
        # autocast's addmm would have.
        return bias_gelu(h, None if bias is None else bias.to(h.dtype))


class TritonCrossEntropy(CrossEntropy):
    """Mean cross-entropy straight from the logits in their own dtype (math in FP32)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets)


class BiasGELUMLP(MLP):
    """The MLP with ``fc``'s bias added in the GELU kernel: the (B, T, 4C) activations are
    written once by the GEMM and read once, instead of a bias pass and then a GELU pass."""

    fc: nn.Linear  # built by TritonLayers.linear, i.e. TorchLayers': always an nn.Linear
    act: TritonGELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(F.linear(x, self.fc.weight), self.fc.bias)
        return self.drop(self.proj(h))


class AddNormBlock(Block):
    """The block with the residual add and ``ln2`` in one kernel."""

    ln2: TritonLayerNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h = self.ln2.add_forward(x, self.attn(self.ln1(x)))  # x + a, LayerNorm(x + a)
        return x + self.mlp(h)


class TritonLayers(TorchLayers):
    """A ``LayerFactory``: ``nn.Linear`` for GEMMs, Triton kernels for everything memory-bound.

    ``fold_fc_bias=False`` keeps ``fc``'s bias in the Linear layer (plain ``MLP``, GELU kernel
    only): for a precision that swaps the Linear layers afterwards (FP8, Transformer Engine),
    whose GEMM adds the bias in its epilogue.
    """

    def __init__(self, fold_fc_bias: bool = True) -> None:
        self.fold_fc_bias = fold_fc_bias

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        return TritonLayerNorm(features, eps=1e-5, bias=bias)

    def gelu(self) -> nn.Module:
        return TritonGELU()

    def cross_entropy(self) -> nn.Module:
        return TritonCrossEntropy()

    def mlp(self, cfg: GPTConfig) -> nn.Module:
        if self.fold_fc_bias and cfg.bias:
            return BiasGELUMLP(cfg, self)
        return MLP(cfg, self)

    def block(self, cfg: GPTConfig) -> nn.Module:
        return AddNormBlock(cfg, self)
