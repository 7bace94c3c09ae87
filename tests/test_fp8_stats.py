"""Quantization statistics and GEMM-operand capture (tutorial_lib.fp8.stats)."""

from __future__ import annotations

import math

import pytest
import torch

from tutorial_lib.config import GPTConfig
from tutorial_lib.fp8.formats import E4M3, E5M2
from tutorial_lib.fp8.stats import capture_gemm_tensors, quant_stats, scale_for
from tutorial_lib.model import GPT


def test_scale_for_maps_amax_to_max() -> None:
    assert scale_for(2.0, E4M3) == 448.0 / 2.0
    assert scale_for(2.0, E5M2, margin=1) == 57344.0 / 2.0 / 2.0
    assert scale_for(0.0, E4M3) == 1.0 and scale_for(math.inf, E4M3) == 1.0


def test_saturation_and_flush_fractions_are_counted() -> None:
    # E4M3: max 448, smallest subnormal 2^-9. At scale 1: 1000 and -500 saturate, 1e-4 flushes.
    x = torch.tensor([1000.0, -500.0, 1.0, 1e-4, 0.0, 3.0, 2.0, 0.5])
    st = quant_stats(x, E4M3, 1.0)
    assert st.amax == 1000.0 and st.scale == 1.0
    assert st.saturated == pytest.approx(2 / 8)
    assert st.flushed == pytest.approx(1 / 7)  # of the 7 non-zero values
    assert st.rel_rmse > 0.3  # 1000 -> 448 dominates the error


def test_scaled_to_amax_nothing_saturates_and_error_is_small() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 53, generator=g) * 3.7
    st = quant_stats(x, E4M3, scale_for(x.abs().max().item(), E4M3))
    assert st.saturated == 0.0 and st.flushed == 0.0
    # 3 mantissa bits: relative rounding error at most 2^-4 per value, RMS well below that.
    assert 0.005 < st.rel_rmse < 2.0**-4


def test_error_against_scale_has_a_sweet_spot() -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    amax_scale = scale_for(x.abs().max().item(), E4M3)
    stats = [quant_stats(x, E4M3, amax_scale * 2.0**k) for k in (-30, 0, 8)]
    too_small, right, too_big = (s.rel_rmse for s in stats)
    assert right < too_small and right < too_big
    assert stats[0].flushed > 0.5 and stats[2].saturated > 0.5


def test_capture_gemm_tensors_shapes_and_no_leftover_grads(tiny_cfg: GPTConfig) -> None:
    TINY = tiny_cfg
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(TINY.vocab_size, (3, TINY.block_size))
    got = capture_gemm_tensors(model, idx, idx)
    assert len(got) == 4 * TINY.n_layer
    qkv = got["blocks.0.attn.qkv"]
    assert qkv["input"].shape == (3, TINY.block_size, TINY.n_embd)
    assert qkv["weight"].shape == (3 * TINY.n_embd, TINY.n_embd)
    assert qkv["grad_output"].shape == (3, TINY.block_size, 3 * TINY.n_embd)
    assert qkv["grad_output"].abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())


def test_capture_only_named_layers(tiny_cfg: GPTConfig) -> None:
    torch.manual_seed(0)
    model = GPT(tiny_cfg)
    idx = torch.randint(tiny_cfg.vocab_size, (2, tiny_cfg.block_size))
    got = capture_gemm_tensors(model, idx, idx, names=["blocks.1.mlp.proj"])
    assert list(got) == ["blocks.1.mlp.proj"] and set(got["blocks.1.mlp.proj"]) == {
        "input",
        "weight",
        "grad_output",
    }
