"""The one place where the GPT gets its modules: Linear, LayerNorm, GELU, the loss, MLP and Block.

The model never calls ``nn.Linear`` directly. It asks a ``LayerFactory`` for a layer and says what
the layer is for (its *role*). Later chapters pass other factories: tensor-parallel column/row
layers, Transformer Engine modules, or our Triton kernels. The model code does not change.

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
    """GELU: GPT-2's tanh approximation (``approximate="tanh"``, the default) or the exact erf
    form (``"none"``, what ``nn.GELU()`` and many minimal GPTs use). They are different
    functions, not two speeds of one; which is cheaper depends on the machine's kernels
    (``benchmarks/model_speed.py`` measures both). GPT-2's weights expect tanh."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"GELU approximate must be 'tanh' or 'none', got {approximate!r}.")
        self.approximate = approximate

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate=self.approximate)


class CrossEntropy(nn.Module):
    """Mean cross-entropy of (N, V) logits against (N,) targets, computed in float32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)


class TorchLayers:
    """Plain PyTorch: ``nn.Linear`` and ``nn.LayerNorm`` (eps 1e-5, as GPT-2), GPT-2's tanh GELU;
    ``TorchLayers(gelu="none")`` builds the exact (erf) GELU instead."""

    gelu_approximate = "tanh"  # a class default, so subclasses with their own __init__ keep it

    def __init__(self, gelu: str = "tanh") -> None:
        self.gelu_approximate = gelu

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        return nn.Linear(in_features, out_features, bias=bias)

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        return nn.LayerNorm(features, eps=1e-5, bias=bias)

    def gelu(self) -> nn.Module:
        return GELU(self.gelu_approximate)

    def cross_entropy(self) -> nn.Module:
        return CrossEntropy()

    def mlp(self, cfg: GPTConfig) -> nn.Module:
        from .model import MLP  # model.py imports this module

        return MLP(cfg, self)

    def block(self, cfg: GPTConfig) -> nn.Module:
        from .model import Block

        return Block(cfg, self)
