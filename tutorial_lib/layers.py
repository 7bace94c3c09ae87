"""The one place where the GPT gets its layers: Linear, LayerNorm, GELU and the loss.

The model never calls ``nn.Linear`` directly. It asks a ``LayerFactory`` for a layer and says what
the layer is for (its *role*). Later chapters pass other factories: FP8 Linear layers, Transformer
Engine modules, or tensor-parallel column/row layers. The model code does not change.

Besides Linear and LayerNorm, a factory supplies the two memory-bound pieces that a fused backend
(``tutorial_lib.kernels.TritonLayers``, chapter 6) replaces with its own kernels: the MLP's GELU
(which may also add the ``mlp.fc`` bias, so one pass over the activations does both) and the
cross-entropy loss. A LayerNorm module may also declare ``fuses_residual = True``: then ``Block``
calls ``ln2(x, residual=a)`` and gets back ``(x + a, LayerNorm(x + a))`` from one kernel.

Roles (and how Megatron-style tensor parallelism splits them):
    ``attn.qkv``   C -> 3C, column-parallel      ``attn.proj``  C -> C, row-parallel
    ``mlp.fc``     C -> 4C, column-parallel      ``mlp.proj``   4C -> C, row-parallel
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LINEAR_ROLES", "LayerFactory", "TorchLayers", "GELU", "CrossEntropy"]

LINEAR_ROLES = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


class LayerFactory(Protocol):
    """Builds the model's Linear and LayerNorm layers."""

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module: ...

    def layernorm(self, features: int, bias: bool) -> nn.Module: ...

    def gelu(self) -> nn.Module: ...

    def cross_entropy(self) -> nn.Module: ...


class GELU(nn.Module):
    """GPT-2's tanh-approximated GELU of ``h + bias``; ``adds_bias`` tells the MLP whether to pass
    ``mlp.fc``'s bias here instead of letting the Linear add it (False: two passes gain nothing)."""

    adds_bias = False

    def forward(self, h: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.gelu(h if bias is None else h + bias, approximate="tanh")


class CrossEntropy(nn.Module):
    """Mean cross-entropy of (N, V) logits against (N,) targets, computed in float32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)


class TorchLayers:
    """Plain PyTorch: ``nn.Linear`` and ``nn.LayerNorm`` (eps 1e-5, as GPT-2)."""

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        return nn.Linear(in_features, out_features, bias=bias)

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        return nn.LayerNorm(features, eps=1e-5, bias=bias)

    def gelu(self) -> nn.Module:
        return GELU()

    def cross_entropy(self) -> nn.Module:
        return CrossEntropy()
