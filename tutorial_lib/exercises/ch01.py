"""Exercise 1.1: causal self-attention by hand, checked against ``model.CausalSelfAttention``."""

from __future__ import annotations

import torch

from ..config import GPTConfig
from ..layers import TorchLayers
from ..model import CausalSelfAttention
from .base import Case, Exercise

STUB = '''\
import math

import torch


def causal_self_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of one GPT block, written by hand.

    attn: a tutorial_lib.model.CausalSelfAttention in eval mode; use
          attn.qkv and attn.proj (Linear layers) and attn.head_dim.
    x:    (B, T, C) input.
    Returns (B, T, C), what attn(x) returns, without calling attn(x)
    or F.scaled_dot_product_attention.
    """
    raise NotImplementedError
'''

TASK = (
    "Compute what `attn(x)` computes, step by step: project `x` to queries, keys and values "
    "with `attn.qkv` and split them (Q, then K, then V along the last dimension); reshape each "
    "from (B, T, C) to (B, n_head, T, head_dim); take the scores Q K^T / sqrt(head_dim); mask "
    "every key that lies after its query with -inf; softmax over the keys; weight V; merge the "
    "heads back to (B, T, C); and apply `attn.proj`."
)


def _attention(cfg: GPTConfig, seed: int) -> CausalSelfAttention:
    torch.manual_seed(seed)  # check() runs the cases inside fork_rng: the caller's RNG is kept
    return CausalSelfAttention(cfg, TorchLayers()).eval()


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(101)
    out = []
    # (n_embd, n_head, bias, B, T): odd widths and lengths, one head, one token, no bias
    for i, (c, nh, bias, b, t) in enumerate(
        [(12, 3, True, 2, 7), (20, 5, True, 1, 13), (16, 1, False, 3, 5), (18, 6, True, 2, 1)]
    ):
        cfg = GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=nh, n_embd=c, bias=bias)
        x = torch.randn(b, t, c, generator=g)
        label = f"x of shape {(b, t, c)}, {nh} heads of {c // nh}" + ("" if bias else ", no bias")
        out.append(Case(label, {"attn": _attention(cfg, 7 + i), "x": x}))
    return out


def _reference(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return attn(x)


EXERCISES = [
    Exercise(
        id="1.1",
        title="causal self-attention by hand",
        function="causal_self_attention",
        signature="causal_self_attention(attn: CausalSelfAttention, x: Tensor) -> Tensor",
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="tutorial_lib.model.CausalSelfAttention",
    )
]
