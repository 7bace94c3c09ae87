"""``FP8Linear``: an ``nn.Linear`` whose GEMMs run in FP8 inside ``autocast``, with any recipe.

Every call in FP8 goes through one autograd Function, ``linear_function.FP8LinearFunction``,
over the recipe's quantizers: under ``DelayedScaling`` the layer's own scaling state
(``delayed_state.DelayedOperands``), under the stateless recipes of ``fp8.recipes`` (current,
block, MXFP8, NVFP4, row-wise) quantizers that scale from the tensor at hand
(``linear_function.RecipeOperands``). The rest of this docstring is delayed scaling's case.

Outside an enabled ``tutorial_lib.fp8.autocast`` it *is* ``nn.Linear`` (same parameters, init
and forward). Inside, one forward + backward pass does what TE's ``Linear`` does for one GEMM
(``transformer_engine/pytorch/module/linear.py``):
    forward   x_fp8 = E4M3(x * s_x), w_fp8 = E4M3(w * s_w), with the scales of earlier steps;
              y = (x_fp8 @ w_fp8^T) * s_x^-1 * s_w^-1 + bias, in the activation dtype (bf16
              under BF16 autocast, else the input's dtype); amax(x), amax(w) -> history row 0.
    backward  g_fp8 = E5M2(dy * s_g) (under HYBRID; E4M3 under E4M3); amax(dy) -> row 0;
              dgrad = g_fp8 @ w_fp8 (activation dtype), wgrad = g_fp8^T @ x_fp8 (float32,
              reusing the forward's FP8 copies), bias grad = sum of dy in float32.
As in TE, the output's amax (column GEMM1_OUTPUT) is recorded only when the output itself is FP8
and grad_input's (GRAD_INPUT1) only when grad_input is FP8; here neither is, so those columns
stay zero and their scales stay 1.

Activation checkpointing goes through ``fp8.checkpoint`` (``recompute``): its recompute replays
each call with the scales the first forward used and records no amax.

The GEMMs run in ``linear_function.quantized_matmul``: ``torch._scaled_mm`` on FP8 GPUs (sm_89+),
an FP32 emulation (exact FP8 products, float32 sums, scales applied to the sum, so it rounds as a
float32 GEMM does) everywhere else, never ``_scaled_mm`` on a CPU. Accumulation
follows the recipe (``DelayedScaling.fp8_gemm_fprop``/``_dgrad``/``_wgrad``, TE's defaults:
fast accumulation forward, split backward); the emulation sums in float32, or as Hopper's tensor
cores do under the recipe's ``accumulation="hopper"`` (``fp8.gemm.emulated_sums``).

State: the forward/backward scaling state lives in six float32 buffers (``fp8_amax_history_fwd``
(L, 3), ``fp8_scale_fwd`` (3,), ``fp8_scale_inv_fwd`` (3,) and the ``_bwd`` ones with 2 columns),
so it is in ``state_dict()`` and checkpoints; ``fp8_state`` is an ``FP8ModuleState`` over them.

This module holds the layer (``FP8Linear``: the recipe's quantizers for a call, shape and
device checks, checkpoint replays) and TE's shape rule; ``delayed_state`` holds its
delayed-scaling state (``DelayedScalingState``), ``sr_state`` its stochastic-rounding generator.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from .autocast import FP8AutocastState, get_autocast_state, register_fp8_run
from .delayed_state import FP8_BUFFERS, DelayedOperands, DelayedScalingState
from .linear_function import FP8LinearFunction, Operands, RecipeOperands
from .native import check_recipe_device
from .recipes import Recipe
from .recompute import (
    check_not_plain_checkpoint,
    check_not_reentrant_recompute,
    record_call,
    replay_call,
)
from .sr_state import StochasticRoundingState

__all__ = ["FP8Linear", "FP8_SHAPE_RULE", "weight_problems"]

# TE's shape rule for an FP8 GEMM operand (``assert_dim_for_fp8_exec``, pytorch/utils.py).
FP8_SHAPE_RULE = (
    "FP8 GEMMs follow Transformer Engine's shape rule: for the input and the weight, the product "
    "of all dimensions but the last must be divisible by 8 and the last dimension by 16"
)

_L = TypeVar("_L", bound="FP8Linear")


# ---- the module --------------------------------------------------------------------------------
class FP8Linear(StochasticRoundingState, DelayedScalingState, nn.Linear):
    """``nn.Linear`` with FP8 GEMMs inside ``tutorial_lib.fp8.autocast`` (module docstring).

    Like nn.Linear: in_features, out_features, bias, device, dtype; parameters ``weight``
        (out, in) and ``bias`` with nn.Linear's init, so state dicts of the two interchange.
    FP8:
        amax_history_len: rows of the scaling history; it follows the recipe of the region it
            runs in (truncated or zero-padded, as TE's ``adjust_amax_history_length``).
        emulate: True allows the FP32 emulation path on CUDA GPUs without FP8 tensor cores
            (a CPU always emulates); None defers to ``autocast(emulate=...)``.
    Shapes (TE's rule, ``FP8_SHAPE_RULE``): in FP8, the input (..., in_features) and the weight
        (out_features, in_features) each need the product of their leading dimensions divisible
        by 8 and their last dimension by 16: in_features a multiple of 16, out_features and the
        token count (the input's leading dimensions multiplied) multiples of 8. Else a
        ValueError naming the layer (``fp8_name``, set by ``convert_to_fp8``) and the rule.
    Loading a state dict: a plain ``nn.Linear`` one (no FP8 entries at all) loads strictly and
        keeps the current scaling state; a partial one, or one whose history length differs,
        fails with a message saying what to do.
    Under DDP: the six buffers (``FP8_STATE_BUFFERS``) stay out of its buffer broadcast
        (``fp8.ddp.exclude_fp8_from_ddp``; ``convert_to_fp8`` calls it).
    Other recipes (``fp8.recipes``): stateless, except NVFP4's stochastic rounding, which draws
        from the layer's own generator (``sr_generator``, seeded per run and layer); its
        state is the state-dict entry ``fp8_sr_rng_state`` (``sr_state.SR_STATE_KEY``), so a
        resumed run draws the same noise as an uninterrupted one.
    """

    FP8_STATE_BUFFERS: ClassVar[tuple[str, ...]] = tuple(
        n for ns in FP8_BUFFERS.values() for n in ns
    )

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        amax_history_len: int = 1024,
        emulate: bool | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.emulate = emulate
        self.fp8_name: str | None = None
        self._init_sr_state()
        self._ran_fp8 = False  # a forward in FP8 happened (recompute checks need it)
        self._init_fp8_buffers(amax_history_len, device)

    @classmethod
    def from_linear(cls: type[_L], linear: Any, **fp8_kwargs: Any) -> _L:
        """A ``cls`` holding ``linear``'s own Parameter objects (so ties and optimizers see the
        same tensors), its shapes those of the weight (a tensor-parallel layer's local ones);
        scaling buffers on the weight's device."""
        out_features, in_features = linear.weight.shape
        new = cls(
            in_features, out_features, bias=linear.bias is not None, device="meta", **fp8_kwargs
        )
        new.weight = linear.weight
        new.bias = linear.bias
        new._init_fp8_buffers(new.fp8_state.forward.history_len, linear.weight.device)
        new.train(linear.training)
        return new

    # ---- forward ---------------------------------------------------------------------------
    # torch.compile runs this method eagerly (a graph break on each side): its scaling state is
    # Python-side and updated in place between forward and backward, which Dynamo cannot trace
    # safely. The ops around the layer (LayerNorm, GELU, residual adds) still get compiled.
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = replay_call(self)  # inside fp8.checkpoint's recompute: repeat the recorded call
        if call is not None:
            if call.fp8 is None or call.out_dtype is None:
                return F.linear(x, self.weight, self._gemm_bias())
            operands = self._operands(call.fp8, x, call.scales)
            return self._fp8_linear(x, operands, call.out_dtype, call.emulate)
        if self._ran_fp8:
            check_not_reentrant_recompute(self._layer_name())
        fp8 = get_autocast_state()
        if fp8 is None or not fp8.enabled:
            record_call(self)
            return F.linear(x, self.weight, self._gemm_bias())
        recipe = fp8.recipe
        if recipe.stateful:  # delayed scaling: the history follows the recipe's length (TE)
            self._ensure_history_len(recipe.amax_history_len)  # type: ignore[attr-defined]
        self._check_fp8_shapes(x, recipe)
        check_not_plain_checkpoint(self._layer_name())
        self._ran_fp8 = True
        flag = self.emulate if self.emulate is not None else fp8.emulate
        emulate = check_recipe_device(recipe, x.device, flag, self._layer_name())
        # the GEMM output dtype: the autocast dtype inside autocast, else the input's
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        record_call(
            self, fp8, out_dtype, emulate, self.fp8_state.forward if recipe.stateful else None
        )
        return self._fp8_linear(x, self._operands(fp8, x), out_dtype, emulate)

    def _operands(
        self,
        fp8: FP8AutocastState,
        x: torch.Tensor,
        replay: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Operands:
        """The quantizers of this call: delayed scaling's are this layer's state (the first
        module needing grad in the region updates every backward state: ``register_fp8_run``),
        a stateless recipe's draw on nothing but the layer's rounding generator."""
        recipe = fp8.recipe
        if recipe.stateful:
            needs_grad = self._needs_grad(x)
            step = None if replay is not None else register_fp8_run(self.fp8_state, fp8, needs_grad)
            return DelayedOperands(recipe, self.fp8_state, replay, step)  # type: ignore[arg-type]
        gen = self.sr_generator(x.device) if recipe.uses_stochastic_rounding else None
        return RecipeOperands(recipe, gen)

    def _fp8_linear(
        self, x: torch.Tensor, operands: Operands, out_dtype: torch.dtype, emulate: bool
    ) -> torch.Tensor:
        backward = torch.is_grad_enabled() and self._needs_grad(x)
        w, b = self.weight, self._gemm_bias()
        return FP8LinearFunction.apply(x, w, b, operands, out_dtype, emulate, backward)

    def _gemm_bias(self) -> torch.Tensor | None:
        """The bias the GEMM adds (a row-parallel subclass adds its own after the all-reduce)."""
        return self.bias

    def _needs_grad(self, x: torch.Tensor) -> bool:
        """Whether the input, weight or bias requires grad (so a backward pass will run)."""
        params = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
        return any(t.requires_grad for t in params)

    def _layer_name(self) -> str:
        return self.fp8_name or f"FP8Linear({self.in_features} -> {self.out_features})"

    def _check_fp8_shapes(self, x: torch.Tensor, recipe: Recipe) -> None:
        """TE's shape rule, then what the recipe's own GEMMs need (NVFP4's transform)."""
        tokens = math.prod(x.shape[:-1])
        problems = weight_problems(self.in_features, self.out_features)
        if tokens % 8:
            problems.append(
                f"the input's leading dimensions {tuple(x.shape[:-1])} multiply to "
                f"{tokens}, not divisible by 8"
            )
        if problems:
            raise ValueError(
                f"FP8 GEMM shape error in layer {self._layer_name()}: "
                + "; ".join(problems)
                + f". {FP8_SHAPE_RULE}: in_features a multiple of 16, out_features and the token "
                "count (batch x sequence) multiples of 8. Choose such sizes or pad."
            )
        problem = recipe.shape_problem(tokens, self.in_features, self.out_features)
        if problem and torch.is_grad_enabled() and self.weight.requires_grad:  # a wgrad GEMM
            raise ValueError(f"FP8 GEMM shape error in layer {self._layer_name()}: {problem}.")

    def extra_repr(self) -> str:
        length = self.fp8_state.forward.history_len
        return f"{super().extra_repr()}, amax_history_len={length}, emulate={self.emulate}"


def weight_problems(in_features: int, out_features: int) -> list[str]:
    """TE's rule (``FP8_SHAPE_RULE``) for the weight (out_features, in_features)."""
    return [
        f"{what} = {n} is not divisible by {k}"
        for what, n, k in (("in_features", in_features, 16), ("out_features", out_features, 8))
        if n % k
    ]
