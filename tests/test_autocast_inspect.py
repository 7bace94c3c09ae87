"""Tests for tutorial_lib.autocast_inspect: what CPU autocast (torch 2.13) does to the GPT's ops."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_lib.autocast_inspect import (
    SKIPPED_OPS,
    OpRecord,
    autocast_summary,
    record_op_dtypes,
)
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.model import GPT
from tutorial_lib.train import TrainConfig, Trainer

# Matrix multiplications: the ops autocast puts in lower precision and tensor cores run.
MATMUL_OPS = frozenset(
    f"aten.{name}"
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
)


def matmul_dtype(summary: list[dict[str, Any]]) -> str:
    """The output dtypes of the matrix multiplications in an ``autocast_summary``, joined."""
    dtypes = sorted({row["output_dtype"] for row in summary if row["op"] in MATMUL_OPS})
    assert dtypes, "no matrix multiplication in this summary"
    return ", ".join(dtypes)


@pytest.fixture(scope="module")
def gpt_and_batch(tiny_cfg: GPTConfig) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(tiny_cfg.vocab_size, (2, tiny_cfg.block_size), generator=g)
    return GPT(tiny_cfg), idx, torch.roll(idx, -1, dims=1)


def rows_by_key(summary: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    return {(r["op"], r["output_dtype"]): r["count"] for r in summary}


def test_record_op_dtypes_sees_autocast_casts() -> None:
    layer = nn.Linear(8, 4)
    x = torch.randn(3, 8)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x)

    records = record_op_dtypes(run)
    assert OpRecord("aten.addmm", ("bfloat16",) * 3, "bfloat16") in records
    casts = [r for r in records if r.op == "aten._to_copy"]
    assert len(casts) == 3 and all(r.output_dtype == "bfloat16" for r in casts)  # x, W, b
    assert not any(r.op in SKIPPED_OPS for r in records)


def test_record_op_dtypes_includes_backward() -> None:
    w = torch.randn(5, 5, requires_grad=True)
    records = record_op_dtypes(lambda: (w @ w).sum().backward())
    assert sum(r.op == "aten.mm" for r in records) == 3  # forward, then two for the gradient
    assert records[-1].output_dtype == "float32"


def test_bf16_summary_of_the_gpt(gpt_and_batch: tuple[GPT, torch.Tensor, torch.Tensor]) -> None:
    model, idx, targets = gpt_and_batch
    summary = autocast_summary(model, idx, targets, "bf16")
    assert summary == sorted(summary, key=lambda r: (r["op"], r["output_dtype"]))
    counts = rows_by_key(summary)
    n = model.config.n_layer
    assert matmul_dtype(summary) == "bfloat16"
    assert counts[("aten.addmm", "bfloat16")] == 4 * n  # qkv, attn proj, fc, mlp proj
    assert counts[("aten.mm", "bfloat16")] == 1  # the tied LM head (no bias)
    assert counts[("aten._scaled_dot_product_flash_attention_for_cpu", "bfloat16")] == n
    assert counts[("aten.gelu", "bfloat16")] == n  # follows its (BF16) input
    # LayerNorm reads the FP32 residual stream; CPU autocast leaves it alone -> FP32.
    assert counts[("aten.native_layer_norm", "float32")] == 2 * n + 1
    assert counts[("aten.add", "float32")] == 2 * n + 1  # residual adds promote to FP32
    assert counts[("aten._log_softmax", "float32")] == 1  # the loss, after logits.float()
    assert counts[("aten.nll_loss_forward", "float32")] == 1
    assert counts[("aten._to_copy", "float32")] == 1  # logits.float()
    assert counts[("aten._to_copy", "bfloat16")] >= 4 * n  # autocast's casts of inputs/weights
    assert not any(op in SKIPPED_OPS for op, _ in counts)
    assert all(r["input_dtypes"] for r in summary if r["op"] != "aten.arange")


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_fp32_summary_is_all_fp32(
    gpt_and_batch: tuple[GPT, torch.Tensor, torch.Tensor], policy: str
) -> None:
    model, idx, targets = gpt_and_batch
    summary = autocast_summary(model, idx, targets, policy)
    assert {r["output_dtype"] for r in summary} == {"float32", "int64"}  # int64: positions
    assert matmul_dtype(summary) == "float32"
    assert "aten._to_copy" not in {r["op"] for r in summary}  # nothing was cast


def test_fp16_summary_rejected_on_cpu(
    gpt_and_batch: tuple[GPT, torch.Tensor, torch.Tensor],
) -> None:
    model, idx, targets = gpt_and_batch
    with pytest.raises(RuntimeError, match="fp16"):
        autocast_summary(model, idx, targets, "fp16", device="cpu")


def test_cpu_autocast_facts_the_docstring_states() -> None:
    """torch 2.13 on CPU: LayerNorm is not on the FP32 list, cross-entropy is."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nn.LayerNorm(8)(x).dtype == torch.bfloat16
        assert F.cross_entropy(x, torch.zeros(4, dtype=torch.long)).dtype == torch.float32
        assert F.gelu(x.float()).dtype == torch.float32


def test_master_weights_stay_fp32_after_bf16_step(
    tiny_cfg: GPTConfig, tiny_data: TokenData
) -> None:
    cfg = TrainConfig(steps=1, batch_size=2, eval_every=0, precision="bf16", progress=False)
    trainer = Trainer(GPT(tiny_cfg), tiny_data, cfg, device="cpu")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    params = list(trainer.model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))  # it stepped
    states = trainer.optimizer.state.values()
    assert all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
