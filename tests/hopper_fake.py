"""One training step of the ``hopper`` preset's model as an sm_90 GPU would run it, on a CPU.

``fake_hopper_step(precision)`` builds GPT-2 124M (50,304 vocabulary rows) under
``FakeTensorMode`` (shapes and dtypes, no memory, no arithmetic) and runs one step: the forward
under the policy's autocast, the backward, and a fused AdamW step, as the ``Trainer`` does. It
pretends to be on a Hopper GPU where the package decides by device: ``cuda_capability`` answers
sm_90, torch is taken to be built with CUDA 13.0 (the lent H200's), and the FP8 GEMMs take their
GPU path (``fp8.gemm.scaled_mm_call``, ``fp8.tiled_gemm.block_scaled_mm_call``). The real
``torch._scaled_mm`` and blockwise ``scaled_mm`` are replaced by recorders that keep every call
and return a fake result of the right shape and dtype: ``tests/cuda_contracts.py`` checks each
against CUDA's preconditions. Recipes Hopper cannot run natively (MXFP8, NVFP4) run their
emulation there, as the book runs them (``runnable_fp8_precision``).

CPU autocast stands in for CUDA's (the same BF16/FP16 casts of the Linear layers); the tensors
stay fake CPU tensors. It also counts the step's memory: parameters, gradients, optimizer state,
buffers, and the tensors saved for the backward (activations, and FP8 copies of weights).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

GPU_NAME = "NVIDIA H200 (stand-in)"
SM90 = (9, 0)
CUDA = (13, 0)  # the CUDA the lent H200's torch 2.11 is built with

# What Hopper runs for each policy that needs a GPU or a library this machine lacks.
TE_POLICIES = ("te-fp8", "te-fp8-fused")


@dataclass
class GemmCall:
    kind: str  # "scaled_mm" or "blockwise"
    args: dict[str, Any]

    def summary(self) -> str:
        a, b = self.args["mat_a"], self.args["mat_b"]
        dt = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
        bias = self.args.get("bias")
        return (
            f"{self.kind} {tuple(a.shape)}{dt(a)} x {tuple(b.shape)}{dt(b)} -> "
            f"{str(self.args['out_dtype']).removeprefix('torch.')}"
            f"{'' if bias is None else ' + bias ' + dt(bias)}"
            f"{' fast' if self.args['use_fast_accum'] else ' split'}"
        )


@dataclass
class FakeStep:
    """What one fake step did: its GEMM calls and its memory (bytes)."""

    precision: str  # the policy that ran (``<name>-emulated`` where Hopper lacks the recipe)
    loss_dtype: torch.dtype
    gemm_calls: list[GemmCall] = field(default_factory=list)
    fp8_layers: int = 0
    memory: dict[str, int] = field(default_factory=dict)


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@contextlib.contextmanager
def stand_in_hopper(calls: list[GemmCall]) -> Iterator[None]:
    """Where the package asks which device it is on, answer "an sm_90 GPU"; record the FP8
    GEMM calls instead of running them."""
    import tutorial_lib.fp8.gemm as gemm
    import tutorial_lib.fp8.native as native
    import tutorial_lib.precision as precision

    def gpu(device: torch.device | str) -> tuple[str, tuple[int, int]]:
        return GPU_NAME, SM90

    # The recorders bind each call to the real function's signature (torch's schema for
    # _scaled_mm, the Python signature of F.scaled_mm): a renamed or misplaced argument fails
    # here as it would on the GPU.
    schema = [a.name for a in torch.ops.aten._scaled_mm.default._schema.arguments]
    blockwise_signature = inspect.signature(torch.nn.functional.scaled_mm)

    def scaled_mm(*args: Any, **kwargs: Any) -> torch.Tensor:
        unknown = set(kwargs) - set(schema)
        assert not unknown and len(args) <= len(schema), f"_scaled_mm has no {unknown or args}"
        bound = {**dict(zip(schema, args, strict=False)), **kwargs}
        a = {k: bound.get(v) for k, v in (("mat_a", "self"), ("mat_b", "mat2"), ("scale_a", "scale_a"),
             ("scale_b", "scale_b"), ("bias", "bias"), ("out_dtype", "out_dtype"))}  # fmt: skip
        a["use_fast_accum"] = bool(bound.get("use_fast_accum", False))
        calls.append(GemmCall("scaled_mm", a))
        return torch.empty(
            a["mat_a"].shape[0], a["mat_b"].shape[1], dtype=a["out_dtype"] or a["mat_a"].dtype
        )

    def blockwise(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = blockwise_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        b = bound.arguments
        a = {k: b[k] for k in ("mat_a", "mat_b", "scale_a", "scale_b", "bias", "use_fast_accum")}
        a.update(recipe_a=b["scale_recipe_a"].name, recipe_b=b["scale_recipe_b"].name)
        a["out_dtype"] = b["output_dtype"]
        calls.append(GemmCall("blockwise", a))
        return torch.empty(a["mat_a"].shape[0], a["mat_b"].shape[1], dtype=a["out_dtype"])

    with contextlib.ExitStack() as stack:
        for module in (native, precision):
            stack.enter_context(mock.patch.object(module, "cuda_capability", gpu))
        stack.enter_context(mock.patch.object(native, "_torch_cuda", lambda: CUDA))
        # the "-emulated" policies registered for Hopper stay out of the other tests' registry
        stack.enter_context(mock.patch.dict(precision.POLICIES))
        stack.enter_context(mock.patch.object(gemm, "_is_cuda", lambda t: True))
        stack.enter_context(mock.patch.object(torch, "_scaled_mm", scaled_mm))
        stack.enter_context(mock.patch.object(torch.nn.functional, "scaled_mm", blockwise))
        # fake parameters can be neither moved nor swapped: they are made where they stay
        stack.enter_context(mock.patch.object(torch.nn.Module, "to", lambda self, *a, **k: self))
        yield


def hopper_precision(name: str) -> str:
    """The policy the book runs on an H200 for ``name`` (an ``-emulated`` one for recipes that
    Hopper lacks). Call inside ``stand_in_hopper``."""
    from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES, runnable_fp8_precision

    if name in FP8_RECIPE_POLICIES:
        return runnable_fp8_precision(name, "cuda")
    return name


def fake_hopper_step(name: str, preset: str = "hopper", bias: bool = True) -> FakeStep:
    """One step of ``preset``'s model under policy ``name`` on a stand-in sm_90 GPU."""
    from tutorial_lib.build import build_model
    from tutorial_lib.config import get_preset
    from tutorial_lib.fp8.linear import FP8Linear
    from tutorial_lib.precision import get_policy

    run = get_preset(preset)
    cfg = replace(run.model_config(), bias=bias)
    calls: list[GemmCall] = []
    with stand_in_hopper(calls), FakeTensorMode():
        precision = hopper_precision(name)
        policy = get_policy(precision, "cuda")  # the policy's own check, on an sm_90
        with mock.patch.object(type(policy), "validate", lambda self, device: None):
            model = build_model(cfg, precision=precision, device="cpu")  # CPU autocast below
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the Trainer's
        idx = torch.zeros(run.batch_size, cfg.block_size, dtype=torch.long)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            saved[storage._cdata] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with policy.matmul_settings(), policy.autocast("cpu"):
                _, loss = model(idx, idx)
        params = list(model.parameters())
        param_storages = {p.untyped_storage()._cdata for p in params}
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        opt.step()
        state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        memory = {
            "parameters": _nbytes(params),
            "gradients": _nbytes(grads),
            "optimizer": _nbytes(state),
            "buffers": _nbytes(model.buffers()),
            "saved for backward": sum(n for k, n in saved.items() if k not in param_storages),
        }
        fp8_layers = sum(isinstance(m, FP8Linear) for m in model.modules())
        return FakeStep(precision, loss.dtype, calls, fp8_layers, memory)
