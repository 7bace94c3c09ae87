"""One way to build a model: ``build_model`` applies every transform in one documented order.

A run is described by a ``ModelRecipe`` (precision, fused kernels, compile, tensor parallelism).
``build_model(cfg, ...)`` returns a *new* ``GPT`` built for it, in this order, as torchtitan's
``parallelize_*`` functions do:

1. **Layers.** The ``LayerFactory`` builds the model: ``TorchLayers`` (plain PyTorch), or
   ``TritonLayers`` for ``fused=True``, whose ``Block`` and ``MLP`` variants call our kernels.
2. **Precision backend.** The precision policy's ``prepare_model`` swaps the Linear layers
   (``fp8``: ``FP8Linear``; ``te-fp8``: Transformer Engine modules). Other policies change
   nothing here; they act per step (autocast, TF32, loss scaling) in the ``Trainer``.
3. **Parallelism.** ``tp=parallel.TPSpec(group, shard_map)``: this rank's shards of the full
   model (``TPSpec.apply``, i.e. ``parallel.tp.parallelize``), from the same seeded full weights
   on every rank. Under TP this step comes *before* step 2: the precision's layer swap then
   meets the parallel layers, and each knows its FP8 variant (``parallel.tp_fp8``); with
   ``fused`` the parallel layers sit among the Triton kernels (``parallel.tp.tp_layers``).
4. **Device**, then 5. **compilation** (``nn.Module.compile``: the module stays a ``GPT`` with
   the same parameter names, so checkpoints do not depend on it).

The model remembers its recipe (``model.recipe``); the ``Trainer`` reads it and only trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .config import GPTConfig
from .layers import LayerFactory, TorchLayers
from .model import GPT
from .precision import PrecisionPolicy, get_policy

if TYPE_CHECKING:  # for annotations only: build_model calls tp.apply, never imports parallel/
    from .parallel.tp_model import TPSpec

__all__ = ["ModelRecipe", "build_model", "recipe_of"]


@dataclass(frozen=True)
class ModelRecipe:
    """What ``build_model`` did to a model; the ``Trainer`` checks it against its precision."""

    precision: str = "fp32"
    fused: bool = False
    compile: bool = False
    tp: int = 1  # tensor-parallel degree


def recipe_of(model: torch.nn.Module) -> ModelRecipe | None:
    """The recipe ``build_model`` attached to ``model``; None for a model built by hand."""
    recipe = getattr(model, "recipe", None)
    return recipe if isinstance(recipe, ModelRecipe) else None


def build_model(
    cfg: GPTConfig,
    *,
    precision: str | PrecisionPolicy = "fp32",
    fused: bool = False,
    compile: bool = False,
    tp: TPSpec | None = None,
    device: torch.device | str | None = None,
    seed: int | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
    layers: LayerFactory | None = None,
) -> GPT:
    """A new ``GPT`` for ``cfg`` with the transforms above applied, in that order.

    ``precision`` is a registered policy's name or a ``PrecisionPolicy``. ``seed`` (if given)
    seeds torch first, so equal seeds give equal initial weights whatever the recipe.
    ``weights``: start from these instead of a fresh initialisation (a plain ``GPT``'s state
    dict: another run's model, a checkpoint's, or ``hf_to_tutorial_state_dict``'s); they are
    loaded right after step 1. ``layers`` replaces step 1's factory (not with ``fused``).
    Combinations that cannot work raise ``ValueError`` naming the conflict.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    policy = get_policy(precision, dev)  # raises if this device cannot run the precision
    precision = policy.name
    if layers is not None and fused:
        raise ValueError("Pass either layers= (your own factory) or fused=True, not both.")
    if seed is not None:
        torch.manual_seed(seed)
    # 1. layers. A precision that swaps the Linear layers adds their bias in its GEMM, so the
    # Triton MLP must not take the bias out of the Linear to fold it into the GELU kernel.
    if fused:
        from .kernels.fused import TritonLayers

        layers = TritonLayers(fold_fc_bias=policy.prepare_model is None)
    model = GPT(cfg, layers or TorchLayers())
    if weights is not None:
        model.load_state_dict(weights)
    # 3 before 2 under TP (module docstring)
    degree = 1
    if tp is not None:
        model = tp.apply(model.to(dev), fused=fused, precision=precision)  # may refuse
        degree = tp.degree
    # 2. precision backend
    if policy.prepare_model is not None:
        prepared = policy.prepare_model(model)  # swaps layers in place and returns the model
        if not isinstance(prepared, GPT):
            raise TypeError(
                f"Precision {precision!r}: prepare_model returned a "
                f"{type(prepared).__name__}, not the GPT it was given."
            )
        model = prepared
    # 4. device, 5. compilation
    model = model.to(dev)
    if compile:
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile; use torch>=2.6.")
        model.compile()
    model.recipe = ModelRecipe(precision=precision, fused=fused, compile=compile, tp=degree)
    return model
