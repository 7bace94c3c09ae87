"""The one place where the GPT gets its Linear and LayerNorm layers.

The model never calls ``nn.Linear`` directly. It asks a ``LayerFactory`` for a layer and says what
the layer is for (its *role*). Later chapters pass other factories: FP8 Linear layers, Transformer
Engine modules, or tensor-parallel column/row layers. The model code does not change.

Roles (and how Megatron-style tensor parallelism splits them):
    ``attn.qkv``   C -> 3C, column-parallel      ``attn.proj``  C -> C, row-parallel
    ``mlp.fc``     C -> 4C, column-parallel      ``mlp.proj``   4C -> C, row-parallel
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

__all__ = ["LINEAR_ROLES", "LayerFactory", "TorchLayers"]

LINEAR_ROLES = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


class LayerFactory(Protocol):
    """Builds the model's Linear and LayerNorm layers."""

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module: ...

    def layernorm(self, features: int, bias: bool) -> nn.Module: ...


class TorchLayers:
    """Plain PyTorch: ``nn.Linear`` and ``nn.LayerNorm`` (eps 1e-5, as GPT-2)."""

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        return nn.Linear(in_features, out_features, bias=bias)

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        return nn.LayerNorm(features, eps=1e-5, bias=bias)
