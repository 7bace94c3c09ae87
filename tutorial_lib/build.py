"""One way to build a model: ``build_model`` applies every transform in one documented order.

A run is described by a ``ModelRecipe`` (precision, fused kernels, compile, parallel layout).
``build_model(cfg, ...)`` returns a *new* ``GPT`` built for it, in this order, as torchtitan's
``parallelize_*`` functions do:

1. **Layers.** The ``LayerFactory`` builds the model: ``TorchLayers`` (plain PyTorch), or
   ``TritonLayers`` for ``fused=True``, whose ``Block`` and ``MLP`` variants call our kernels.
2. **Tensor parallelism.** ``parallel=ParallelDims(tp=TPSpec(group, shard_map))``: this rank's
   shards of the full model (``parallel.tp_model.parallelize``), from the same seeded full
   weights on every rank; with ``fused`` the parallel layers sit among the Triton kernels.
3. **Precision backend.** The precision policy's ``prepare_model`` swaps the Linear layers
   (``fp8``: ``FP8Linear``; ``te-fp8``: Transformer Engine modules); a parallel layer becomes its
   FP8 variant (``parallel.tp_fp8``). Other policies change nothing here; they act per step
   (autocast, TF32, loss scaling) in the ``Trainer``.
4. **Device**, then 5. **compilation** (``nn.Module.compile``: the module stays a ``GPT`` with
   the same parameter names, so checkpoints do not depend on it).
6. **Data parallelism** over ``parallel.dp_group``: FSDP2 (``fully_shard`` per block, then the
   root) or DDP (``replicate``); both keep the module a ``GPT``.

Before any of it, the layout is checked once: ``parallel.compose`` says what does not compose,
and FP8 must span every process. The model remembers what was done to it (``model.recipe``,
and ``model.parallel``, the ``ParallelDims``); the ``Trainer`` reads both and only trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import GPTConfig
from .layers import LayerFactory, TorchLayers
from .model import GPT
from .parallel.compose import composition_problem
from .parallel.dp import replicate_with_ddp, shard_with_fsdp
from .parallel.mesh import ParallelDims
from .parallel.tp_model import parallelize
from .precision import PrecisionPolicy, get_policy

__all__ = ["ModelRecipe", "build_model", "check_fp8_spans_every_process", "recipe_of"]


@dataclass(frozen=True)
class ModelRecipe:
    """What ``build_model`` did to a model; the ``Trainer`` checks it against its precision."""

    precision: str = "fp32"
    fused: bool = False
    compile: bool = False
    tp: int = 1  # tensor-parallel degree
    dp: int = 1  # data-parallel degree


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
    parallel: ParallelDims | None = None,
    device: torch.device | str | None = None,
    seed: int | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> GPT:
    """A new ``GPT`` for ``cfg`` with the transforms above applied, in that order.

    ``precision`` is a registered policy's name or a ``PrecisionPolicy``. ``seed`` (if given)
    seeds torch first, so equal seeds give equal initial weights whatever the recipe.
    ``weights``: start from these instead of a fresh initialisation (a plain ``GPT``'s state
    dict: another run's model or a checkpoint's); they are loaded right after step 1.
    ``parallel``: this process's place in a parallel run (``ParallelDims``). Combinations that
    cannot work raise ``ValueError`` naming the conflict, before anything is built.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    dims = parallel or ParallelDims()
    name = precision if isinstance(precision, str) else precision.name
    problem = composition_problem(name, dims.tp is not None, dims.fsdp)
    if problem is not None:  # what no device could train
        raise ValueError(f"Not supported: {problem}")
    policy = get_policy(precision, dev)  # raises if this device cannot run the precision
    precision = policy.name
    check_fp8_spans_every_process(policy, dims)
    if seed is not None:
        torch.manual_seed(seed)
    # 1. layers. A precision that swaps the Linear layers adds their bias in its GEMM, so the
    # Triton MLP must not take the bias out of the Linear to fold it into the GELU kernel.
    layers: LayerFactory = TorchLayers()
    if fused:
        from .kernels.fused import TritonLayers

        layers = TritonLayers(fold_fc_bias=policy.prepare_model is None)
    model = GPT(cfg, layers)
    if weights is not None:
        model.load_state_dict(weights)
    # 2. tensor parallelism
    if dims.tp is not None:
        tp = dims.tp
        model = parallelize(model.to(dev), tp.group, tp.shard_map, fused, tp.sequence_parallel)
    # 3. precision backend
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
        model.compile()
    # 6. data parallelism (over one rank it would change nothing)
    if dims.dp > 1 and dims.fsdp:
        shard_with_fsdp(model, dims.dp_group, dev, dims.param_dtype)
    elif dims.dp > 1:
        replicate_with_ddp(model, dims.dp_group, dev)
    model.parallel = dims
    model.recipe = ModelRecipe(precision, fused, compile, tp=dims.tp_degree, dp=dims.dp)
    return model


def check_fp8_spans_every_process(policy: PrecisionPolicy, dims: ParallelDims) -> None:
    """A ValueError for FP8 on fewer than all processes: its amax all-reduce spans every
    process, so the others would have to join it."""
    if policy.prepare_model is not None and dist.is_initialized():
        world = dist.get_world_size()
        if dims.world != world:
            raise ValueError(
                f"FP8 ({policy.name!r}) on {dims.world} of the {world} processes is not "
                "supported yet: the FP8 amax reduction spans every process, so the others would "
                "have to join it. Train on all of them."
            )
