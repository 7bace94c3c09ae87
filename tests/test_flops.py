"""One set of FLOP formulas (``tutorial_lib.flops``): the model, the cluster cost model, the
roofline and PyTorch's own counter must all agree with it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tutorial_lib import flops
from tutorial_lib.cluster.cost_terms import training_flops
from tutorial_lib.cluster.specs import ModelSpec
from tutorial_lib.cluster.tp_traffic import tp_layer_flops
from tutorial_lib.config import GPTConfig
from tutorial_lib.model import GPT, flops_breakdown
from tutorial_lib.perf import flops_by_op, model_ops, train_step_flops

# Odd sizes first: nothing a power of two (vocab 97, context 37, 5 heads of 8), then 7 heads of 3
# and a single layer, then GPT-2 124M itself.
CONFIGS = [
    GPTConfig(vocab_size=97, block_size=37, n_layer=3, n_head=5, n_embd=40),
    GPTConfig(vocab_size=61, block_size=11, n_layer=1, n_head=7, n_embd=21, bias=False),
    GPTConfig.from_name("gpt2-124m"),
]
LAYER_MATMULS = (
    "QKV projection",
    "attention scores Q K^T",
    "attention P V",
    "attention out-projection",
    "MLP fc",
    "MLP proj",
)


def _spec(cfg: GPTConfig) -> ModelSpec:
    """The cost model's spec of the book's own ``GPT`` for ``cfg``."""
    return ModelSpec(
        layers=cfg.n_layer,
        hidden=cfg.n_embd,
        heads=cfg.n_head,
        vocab=cfg.vocab_size,
        seq=cfg.block_size,
    )


def _gpt(cfg: GPTConfig) -> GPT:
    with torch.device("meta"):  # shapes only: no memory for GPT-2's weights
        return GPT(cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c.n_layer}C{c.n_embd}T{c.block_size}")
def test_model_cost_model_and_roofline_agree(cfg: GPTConfig) -> None:
    """GPT.flops_per_token == the cost model's per-token training FLOPs == 3 x the roofline's
    matmuls per token == the flops module's formula. Exact: integers far below 2^53."""
    model, spec = _gpt(cfg), _spec(cfg)
    size = (cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size)
    per_token = model.flops_per_token()
    assert per_token == flops.training_flops_per_token(*size)
    assert training_flops(spec, batch=2) == 2 * cfg.block_size * per_token

    batch = 2
    ops = {op.name: op for op in model_ops(cfg, batch=batch)}
    roofline = cfg.n_layer * sum(ops[n].flops for n in LAYER_MATMULS) + ops["LM head"].flops
    forward = model.flops_per_token(training=False)
    assert roofline == batch * cfg.block_size * forward
    assert forward == flops.forward_flops_per_token(*size)
    assert per_token == flops.TRAIN_MULTIPLIER * forward
    assert sum(flops_breakdown(cfg).values()) == forward

    # 2N + 4 L T C, with N the matmul weights the modules actually hold (tied LM head once).
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    n_matmul = linear + model.tok_emb.weight.numel()
    assert forward == 2 * n_matmul + 4 * cfg.n_layer * cfg.block_size * cfg.n_embd


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["odd", "single-layer"])
def test_a_measured_training_step_equals_the_formula(cfg: GPTConfig) -> None:
    """FlopCounterMode on a real forward + backward of a tiny GPT. Tolerance: none. The formula
    ignores LayerNorm, GELU, softmax, dropout, bias adds, the embedding lookup and the loss;
    the counter counts those as zero too (only mm/addmm/bmm/attention kernels have formulas;
    an addmm's bias add is not counted), and SDPA's math backend recomputes nothing. So the
    counted matmul FLOPs are exactly 3 x B x T x the forward formula."""
    torch.manual_seed(0)
    model = GPT(cfg)
    B, T = 2, cfg.block_size
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(cfg.vocab_size, (2, B, T), generator=g)
    size = (cfg.n_layer, cfg.n_embd, T, cfg.vocab_size)
    expected = B * T * flops.training_flops_per_token(*size)
    assert train_step_flops(model, idx, targets) == expected

    # The default (flash) kernel's backward recomputes Q K^T: hardware FLOPs, not model FLOPs;
    # the difference is exactly half the attention scores' forward, per layer and token.
    flash = sum(flops_by_op(lambda: model(idx, targets)[1].backward()).values())
    model.zero_grad(set_to_none=True)
    recomputed = cfg.n_layer * B * T * flops.attention_score_flops(T, cfg.n_embd) // 2
    assert flash == expected + recomputed


def test_ignored_terms_are_under_one_percent_of_gpt2() -> None:
    """What the formula leaves out (the roofline's estimate of LayerNorm, GELU, softmax and
    residual adds) is under 1% of the matmul FLOPs of GPT-2 124M at T = 1024."""
    cfg = GPTConfig.from_name("gpt2-124m")
    ops = model_ops(cfg, batch=1)
    matmuls = {*LAYER_MATMULS, "LM head"}
    ignored = cfg.n_layer * sum(op.flops for op in ops if op.name not in matmuls)
    forward = cfg.block_size * _gpt(cfg).flops_per_token(training=False)
    assert 0 < ignored / forward < 0.01


def test_recomputation_and_tensor_parallel_terms() -> None:
    h, s, f, V, L = 40, 37, 160, 97, 3
    base = flops.training_flops_per_token(L, h, s, V, f)
    full = flops.training_flops_per_token(L, h, s, V, f, "full")
    selective = flops.training_flops_per_token(L, h, s, V, f, "selective")
    assert full - base == L * flops.layer_forward_flops(h, s, f)  # one more forward per layer
    assert selective - base == L * 12 * s * h  # Korthikanti et al.'s published count
    attn, mlp = flops.layer_training_flops(h, s, f)
    assert attn + mlp == 3 * flops.layer_forward_flops(h, s, f)
    assert mlp == 3 * 4 * h * f
    # A TP rank's GEMMs: the layer's forward without the scores (24 h^2 for f = 4h), x3, / t.
    assert tp_layer_flops(2, s, h, 4) == 3 * 2 * s * 24 * h * h / 4
    assert flops.tp_layer_flops(2 * s, h, 4) == 3 * 2 * s * (attn / 3 - 4 * s * h + mlp / 3) / 4
    with pytest.raises(ValueError, match="recompute"):
        flops.layer_training_flops(h, s, f, "sometimes")


def test_gpt2_124m_is_six_n_plus_attention() -> None:
    cfg = GPTConfig.from_name("gpt2-124m")
    n = 12 * 12 * 768**2 + 50257 * 768  # the matmul weights: 12 layers of 12 h^2, the LM head
    per_token = flops.training_flops_per_token(cfg.n_layer, cfg.n_embd, 1024, cfg.vocab_size)
    assert per_token == 6 * n + 12 * 12 * 1024 * 768


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c.n_layer}C{c.n_embd}T{c.block_size}")
def test_causal_counts_only_the_scores_the_mask_keeps(cfg: GPTConfig) -> None:
    """``causal=True``: Q K^T and P V over the kept (lower-triangular) scores only, counted
    here from the mask itself; the default still counts the full T x T matrix."""
    s, h, layers = cfg.block_size, cfg.n_embd, cfg.n_layer
    kept = int(torch.ones(s, s).tril().sum())  # (query, key) pairs the mask keeps
    assert flops.attention_score_flops(s, h, causal=True) * s == 2 * 2 * h * kept
    assert flops.attention_score_flops(s, h) * s == 2 * 2 * h * s * s
    model = _gpt(cfg)
    saved = 3 * layers * (flops.attention_score_flops(s, h) - 2 * h * (s + 1))
    assert model.flops_per_token() - model.flops_per_token(causal=True) == saved
    forward_saved = layers * (4 * s * h - 2 * h * (s + 1))
    assert model.flops_per_token(False) - model.flops_per_token(False, causal=True) == forward_saved
