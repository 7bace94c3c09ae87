"""The one place where the GPT gets its modules: Linear, LayerNorm, GELU, the loss, MLP and Block.

The model never calls ``nn.Linear`` directly. It asks a ``LayerFactory`` for a layer and says what
the layer is for (its *role*). Later chapters pass other factories: tensor-parallel column/row
layers or our Triton kernels (Transformer Engine's modules replace the built layers afterwards:
``fp8.te_convert``). The model code does not change.

A backend that fuses across layers (chapter 7: the residual add into the LayerNorm, the ``mlp.fc``
bias into the GELU kernel) returns its own ``Block`` or ``MLP`` variant from ``block`` / ``mlp``;
the plain ones in ``model.py`` never ask what kind of layer they hold.

Roles (and how Megatron-style tensor parallelism splits them):
    ``attn.qkv``   C -> 3C, column-parallel      ``attn.proj``  C -> C, row-parallel
    ``mlp.fc``     C -> 4C, column-parallel      ``mlp.proj``   4C -> C, row-parallel
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .config import GPTConfig

__all__ = ["LINEAR_ROLES", "LayerFactory", "TorchLayers", "GELU", "CrossEntropy"]

LINEAR_ROLES = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


class LayerFactory(Protocol):
    """Builds the model's modules, from single layers up to whole blocks."""

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module: ...

    def layernorm(self, features: int, bias: bool) -> nn.Module: ...

    def gelu(self) -> nn.Module: ...

    def cross_entropy(self) -> nn.Module: ...

    def mlp(self, cfg: GPTConfig) -> nn.Module: ...

    def block(self, cfg: GPTConfig) -> nn.Module: ...


class GELU(nn.Module):
    """GELU, GPT-2's tanh approximation (``approximate="tanh"``). The exact erf form, what
    ``nn.GELU()`` and many minimal GPTs use, is a different function, not a faster or slower
    version of this one (``benchmarks/model_speed.py`` times both); GPT-2's weights expect tanh."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate="tanh")


class CrossEntropy(nn.Module):
    """Mean cross-entropy of (N, V) logits against (N,) targets, computed in float32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)


class TorchLayers:
    """Plain PyTorch: ``nn.Linear`` and ``nn.LayerNorm`` (eps 1e-5, as GPT-2), GPT-2's tanh GELU."""

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

    def mlp(self, cfg: GPTConfig) -> nn.Module:
        from .model import MLP  # model.py imports this module

        return MLP(cfg, self)

    def block(self, cfg: GPTConfig) -> nn.Module:
        from .model import Block

        return Block(cfg, self)
