"""The Hopper path without a GPU: every policy's ``hopper``-preset step on a stand-in sm_90, and
every FP8 GEMM call it makes checked against the preconditions of torch's CUDA kernels.

A CPU run never takes the GPU path (it emulates every FP8 GEMM), and torch's CPU ``_scaled_mm``
accepts what CUDA refuses (a float32 bias), so neither the CPU tests nor the notebooks can see a
GPU-only failure. ``tests/hopper_fake.py`` runs the step under FakeTensorMode with the package
believing it is on an H200; ``tests/cuda_contracts.py`` holds CUDA's rules.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_contracts import (
    TORCH_VERSIONS,
    blockwise_problems,
    operand_problems,
    scaled_mm_problems,
)
from hopper_fake import TE_POLICIES, FakeStep, GemmCall, fake_hopper_step

from tutorial_lib.fp8.gemm import scaled_mm_call
from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES
from tutorial_lib.precision import available_policies

BASE_POLICIES = ("fp32", "tf32", "bf16", "fp16")
POLICIES = BASE_POLICIES + tuple(FP8_RECIPE_POLICIES)
NATIVE_ON_HOPPER = ("fp8", "fp8-current", "fp8-rowwise", "fp8-block")
GB = 1e9
GPUS = {"H100 80 GB": 80 * GB, "H200 141 GB": 141 * GB}  # HBM capacity, datasheets (hardware.SPECS)


def call_problems(call: GemmCall) -> list[str]:
    a = call.args
    if call.kind == "scaled_mm":
        return scaled_mm_problems(
            a["mat_a"],
            a["mat_b"],
            a["scale_a"],
            a["scale_b"],
            a["bias"],
            a["out_dtype"],
            a["use_fast_accum"],
        )
    return blockwise_problems(
        a["mat_a"], a["mat_b"], a["scale_a"], a["recipe_a"], a["scale_b"], a["recipe_b"],
        a["bias"], a["out_dtype"], a["use_fast_accum"],
    )  # fmt: skip


def test_every_policy_is_covered() -> None:
    """The policies below are all the package registers, less Transformer Engine's (which
    needs TE, never installed here; its contract is tests/test_te_contract.py)."""
    registered = {p for p in available_policies() if not p.endswith("-emulated")}
    assert registered - set(TE_POLICIES) == set(POLICIES)


def _memory_line(step: FakeStep, batch: int, seq: int) -> str:
    mem = step.memory
    total = sum(mem.values())
    fits = ", ".join(
        f"{'fits' if total <= cap else 'DOES NOT FIT'} {gpu}" for gpu, cap in GPUS.items()
    )
    parts = " + ".join(f"{k} {v / GB:.2f}" for k, v in mem.items() if v >= 0.005 * GB)
    return (
        f"hopper step {step.precision:>15}: {parts} = {total / GB:.1f} GB at batch {batch} x {seq} "
        f"(saved tensors, not the peak: temporaries such as the logits' gradient come on top); {fits}"
    )


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("name", POLICIES)
def test_hopper_step_meets_cuda_preconditions(name: str, bias: bool, record_property) -> None:
    from tutorial_lib.config import get_preset

    step = fake_hopper_step(name, bias=bias)
    assert step.loss_dtype == torch.float32
    problems = [f"{c.summary()}: {p}" for c in step.gemm_calls for p in call_problems(c)]
    assert not problems, f"torch {'/'.join(TORCH_VERSIONS)} on sm_90 would refuse:\n" + "\n".join(
        dict.fromkeys(problems)
    )
    if name in NATIVE_ON_HOPPER:
        assert step.precision == name
        # every FP8Linear runs its three GEMMs (fprop, dgrad, wgrad) on the tensor cores
        assert step.fp8_layers == 4 * get_preset("hopper").model_config().n_layer
        assert len(step.gemm_calls) == 3 * step.fp8_layers
        kinds = {c.kind for c in step.gemm_calls}
        assert kinds == ({"blockwise"} if name == "fp8-block" else {"scaled_mm"})
        with_bias = [c for c in step.gemm_calls if c.args["bias"] is not None]
        assert (len(with_bias) == step.fp8_layers) if bias else not with_bias
    elif name in FP8_RECIPE_POLICIES:  # MXFP8, NVFP4: Blackwell math, emulated on Hopper
        assert step.precision == f"{name}-emulated" and not step.gemm_calls
    else:
        assert step.precision == name and not step.gemm_calls and step.fp8_layers == 0
    if bias:
        run = get_preset("hopper")
        record_property("report", _memory_line(step, run.batch_size, run.model_config().block_size))


def test_the_parameter_count_is_gpt2_124m() -> None:
    step = fake_hopper_step("bf16")
    assert step.memory["parameters"] == 4 * 124_475_904  # FP32 master weights
    # AdamW: m and v per parameter, and one float32 step count per tensor: the embeddings, 12
    # per block (two LayerNorms and four Linears, weight and bias each), the final LayerNorm
    tensors = 2 + 12 * 12 + 2
    assert step.memory["optimizer"] == 2 * step.memory["parameters"] + 4 * tensors


# ---- the rules can fail: each one, broken on purpose -----------------------------------------


def _fp8(rows: int, cols: int, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    return torch.zeros(rows, cols).to(dtype)


def test_scaled_mm_call_meets_the_rules_for_every_output_dtype() -> None:
    a, w = _fp8(32, 64), _fp8(48, 64)
    one = torch.ones(())
    for out in (torch.float32, torch.bfloat16, torch.float16):
        for bias in (None, torch.zeros(48)):
            call = scaled_mm_call(a, one, w.t(), one, bias, out, use_fast_accum=True)
            args = call.__dict__
            assert not scaled_mm_problems(
                **{
                    k: args[k]
                    for k in (
                        "mat_a",
                        "mat_b",
                        "scale_a",
                        "scale_b",
                        "bias",
                        "out_dtype",
                        "use_fast_accum",
                    )
                }
            )
            # CUDA fuses a bias into 16-bit output only; a float32 result gets it afterwards
            assert (call.bias is None) == (bias is None or out == torch.float32)
    rows = scaled_mm_call(
        a, torch.ones(32, 1), w.t(), torch.ones(1, 48), torch.zeros(48), torch.float32, False
    )
    assert rows.out_dtype == torch.bfloat16 and rows.result_dtype == torch.float32
    assert rows.bias is not None and rows.bias.dtype == torch.bfloat16


def test_a_float32_bias_with_bf16_output_is_refused() -> None:
    """What fp8-current and fp8-rowwise passed before: CUDA's 'Bias must be BFloat16 or Half'."""
    a, b = _fp8(32, 64), _fp8(48, 64).t()
    one = torch.ones(())
    found = scaled_mm_problems(a, b, one, one, torch.zeros(48), torch.bfloat16, True)
    assert found == ["Bias must be BFloat16 or Half, but got torch.float32"]
    found = scaled_mm_problems(
        a, b, one, one, torch.zeros(48, dtype=torch.bfloat16), torch.float32, False
    )
    assert found == ["Bias is not supported when out_dtype is set to Float32"]
    found = scaled_mm_problems(
        a, b, one, one, torch.zeros(48, dtype=torch.float16), torch.bfloat16, False
    )
    assert found == [
        "Bias must be BFloat16 to compute torch.bfloat16 output, but got torch.float16"
    ]


def test_operand_rules() -> None:
    a, w = _fp8(32, 64), _fp8(48, 64)
    assert not operand_problems(a, w.t())
    assert "row-major and column-major" in operand_problems(a, w.t().contiguous())[0]  # b row-major
    assert "row-major and column-major" in operand_problems(a.t().contiguous().t(), w.t())[0]
    assert operand_problems(
        _fp8(32, 64, torch.float8_e5m2), _fp8(48, 64, torch.float8_e5m2).t()
    ) == ["Multiplication of two Float8_e5m2 matrices is not supported"]
    assert "divisible by 16" in operand_problems(_fp8(32, 40), _fp8(48, 40).t())[0]
    assert "must be divisible by 16" in operand_problems(a, _fp8(40, 64).t())[0]
    assert "to be Float8" in operand_problems(torch.zeros(32, 64), w.t())[0]
    one = torch.ones(())
    assert scaled_mm_problems(a, w.t(), one.double(), one, None, torch.bfloat16, False) == [
        "scale_a must be float32 (got torch.float64)"
    ]
    assert (
        "Invalid scaling configuration"
        in scaled_mm_problems(
            a, w.t(), torch.ones(32, 1), torch.ones(48, 1), None, torch.bfloat16, False
        )[0]
    )


def test_blockwise_rules() -> None:
    from tutorial_lib.fp8.quantizers import get_quantizer
    from tutorial_lib.fp8.tiled_gemm import block_scaled_mm_call

    x = get_quantizer("block", "input").quantize(torch.randn(256, 384))
    w = get_quantizer("block", "weight").quantize(torch.randn(128, 384))
    call = block_scaled_mm_call(x, w, torch.bfloat16, False, torch.zeros(128))
    args = {k: v for k, v in call.__dict__.items() if k != "bias_after"}
    assert not blockwise_problems(**args)
    assert math.ceil(384 / 128) == 3 and call.scale_b.shape == (4, 1)  # K tiles padded to 4
    fast = {**args, "use_fast_accum": True}
    assert blockwise_problems(**fast) == [
        "scaled_gemm doesn't support fast accum with 128x128 blockwise scaling"
    ]
    unpadded = {**args, "scale_b": call.scale_b[:3]}
    assert "must have shape 4 x 1" in blockwise_problems(**unpadded)[0]
    both_2d = {**args, "recipe_a": "BlockWise128x128"}
    assert any("Invalid scaling configuration" in p for p in blockwise_problems(**both_2d))
