"""The FLOP formulas of a GPT-2-style decoder, in one place (pure Python, no numpy or torch).

``GPT.flops_per_token`` and ``flops_breakdown`` (``model.py``), the cluster cost model
(``cluster.cost_terms.training_flops``, ``cluster.replica_cost``, ``cluster.tp_traffic``) and the
roofline (``perf.roofline.gemm``, hence ``model_ops``) all call these functions;
``tests/test_flops.py`` ties them together and checks them against ``FlopCounterMode``.

Symbols: h hidden width (``n_embd``, C), f MLP width (4h in GPT-2), s sequence length (T),
l layers, V vocabulary, t tensor-parallel degree. Counts are per token unless a name says
otherwise; a function returns an ``int`` when given ``int`` sizes.

Conventions:
    - A matmul of an (m, k) by a (k, n) matrix costs 2mkn FLOPs (one multiply, one add).
    - Attention scores Q K^T and the weighted sum P V are counted over the full s x s matrix,
      as PaLM's MFU does; a causal kernel may skip about half of them.
    - Backward costs twice the forward (a gradient for the input and one for the weight), so
      training is ``TRAIN_MULTIPLIER`` = 3 forwards; recomputation adds forward work on top.
    - Ignored: LayerNorm, GELU, softmax, dropout, residual and bias adds, the embedding lookup
      and the loss. They are memory-bound and together under 1% of the matmul FLOPs of
      GPT-2 124M (the roofline's ``model_ops`` estimates them); ``FlopCounterMode`` counts
      them as zero too, so it measures exactly these formulas.
"""

from __future__ import annotations

__all__ = [
    "TRAIN_MULTIPLIER",
    "RECOMPUTE_PASSES",
    "matmul_flops",
    "attention_linear_flops",
    "attention_score_flops",
    "mlp_flops",
    "layer_forward_flops",
    "lm_head_flops",
    "forward_flops_per_token",
    "selective_recompute_flops",
    "layer_training_flops",
    "training_flops_per_token",
    "tp_layer_flops",
]

# Forward + backward = 1 + 2 forwards.
TRAIN_MULTIPLIER = 3
# Forward-equivalents of a layer per training step: full recomputation runs the forward again.
# Selective recomputation adds its own term (``selective_recompute_flops``) instead.
RECOMPUTE_PASSES = {"none": 3, "selective": 3, "full": 4}


def matmul_flops(m: int, n: int, k: int) -> int:
    """(m, k) @ (k, n): 2mnk."""
    return 2 * m * n * k


def attention_linear_flops(hidden: int) -> int:
    """Forward QKV (2 x 3h^2) and output projection (2 h^2) of one layer: 8h^2."""
    return matmul_flops(1, 3 * hidden, hidden) + matmul_flops(1, hidden, hidden)


def attention_score_flops(seq: int, hidden: int, causal: bool = False) -> int:
    """Forward Q K^T (2sh) and P V (2sh) per token of one layer over the full s x s scores: 4sh
    (the default: what PaLM's and nanoGPT's MFU count, and the cost of a kernel that computes
    every score). ``causal``: only the scores the mask keeps, which a causal kernel such as
    FlashAttention computes: query i sees i + 1 keys, (s + 1)/2 on average, so 2h(s + 1)."""
    if causal:
        return 2 * hidden * (seq + 1)
    return 2 * matmul_flops(1, seq, hidden)


def mlp_flops(hidden: int, ffn: int | None = None) -> int:
    """Forward fc (2hf) and proj (2fh) of one layer: 4hf (16h^2 for f = 4h)."""
    f = 4 * hidden if ffn is None else ffn
    return matmul_flops(1, f, hidden) + matmul_flops(1, hidden, f)


def layer_forward_flops(hidden: int, seq: int, ffn: int | None = None, causal: bool = False) -> int:
    """Forward of one transformer layer: 8h^2 + 4hf + 4sh (Narayanan et al. 2021, eq. 3);
    ``causal``: 2h(s + 1) for the scores (``attention_score_flops``)."""
    scores = attention_score_flops(seq, hidden, causal)
    return attention_linear_flops(hidden) + mlp_flops(hidden, ffn) + scores


def lm_head_flops(hidden: int, vocab: int) -> int:
    """Forward logit layer (h -> V, once per model): 2hV."""
    return matmul_flops(1, vocab, hidden)


def forward_flops_per_token(
    layers: int, hidden: int, seq: int, vocab: int, ffn: int | None = None, causal: bool = False
) -> int:
    """Forward matmul FLOPs per token: l (8h^2 + 4hf + 4sh) + 2hV, i.e. 2N + 4lsh with
    N = l (4h^2 + 2hf) + Vh the weights that take part in a matmul, the (tied) LM head once
    (the Kaplan/PaLM count); ``causal``: the masked scores left out."""
    return layers * layer_forward_flops(hidden, seq, ffn, causal) + lm_head_flops(hidden, vocab)


def selective_recompute_flops(seq: int, hidden: int) -> int:
    """Per layer and token, what Korthikanti et al. 2022 (sec. 6) count for selective
    recomputation: 12sh (their hardware-FLOPs formula 72 B s l h^2 (1 + s/(3h) + V/(12hl))
    less the no-recompute one). A direct count of the recomputed Q K^T and P V is 4sh
    (``attention_score_flops``); 12sh is used so HFU figures match theirs."""
    return 3 * attention_score_flops(seq, hidden)


def layer_training_flops(
    hidden: int, seq: int, ffn: int | None = None, recompute: str = "none", causal: bool = False
) -> tuple[int, int]:
    """Training FLOPs per token of one layer, split as (attention side, MLP side): the attention
    side (QKV, projection, Q K^T, P V, and selective recomputation) shards by heads under
    tensor parallelism, the MLP (4hf) by its f columns. Each is ``RECOMPUTE_PASSES`` forwards."""
    if recompute not in RECOMPUTE_PASSES:
        raise ValueError(f"recompute must be one of {tuple(RECOMPUTE_PASSES)}, got {recompute!r}.")
    passes = RECOMPUTE_PASSES[recompute]
    scores = attention_score_flops(seq, hidden, causal)
    attention = passes * (attention_linear_flops(hidden) + scores)
    if recompute == "selective":
        attention += selective_recompute_flops(seq, hidden)
    return attention, passes * mlp_flops(hidden, ffn)


def training_flops_per_token(
    layers: int,
    hidden: int,
    seq: int,
    vocab: int,
    ffn: int | None = None,
    recompute: str = "none",
    causal: bool = False,
) -> float:
    """Forward + backward matmul FLOPs per token (Narayanan et al. 2021, eq. 3 and appendix):
    l x ``layer_training_flops`` + 3 x 2hV (the logit layer is never recomputed). ``causal``
    counts only the scores the causal mask keeps (``attention_score_flops``): 6N + 6l(s + 1)h
    without recomputation, instead of 6N + 12lsh.

    - ``none``: 3 (l (8h^2 + 4hf + 4sh) + 2hV) = 6N + 12lsh, i.e. 72 s l h^2 (1 + s/(6h) +
      V/(12hl)) per sequence for f = 4h.
    - ``full``: one more forward of every layer, 96 s l h^2 (1 + s/(6h) + V/(16lh)).
    - ``selective``: + 12sh per layer (``selective_recompute_flops``)."""
    attention, mlp = layer_training_flops(hidden, seq, ffn, recompute, causal)
    return float(layers * (attention + mlp) + TRAIN_MULTIPLIER * lm_head_flops(hidden, vocab))


def tp_layer_flops(
    tokens: int, hidden: int, tp: int, backward: bool = True, ffn: int | None = None
) -> float:
    """GEMM FLOPs one of ``tp`` tensor-parallel ranks does in one layer for ``tokens`` tokens,
    without the attention scores: (8h^2 + 4hf) = 24h^2 per token forward for f = 4h, x3 with
    the backward, divided by t (Megatron shards every GEMM of a layer evenly)."""
    forward = tokens * (attention_linear_flops(hidden) + mlp_flops(hidden, ffn))
    return (TRAIN_MULTIPLIER if backward else 1) * forward / tp
