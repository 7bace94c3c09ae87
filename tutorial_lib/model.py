"""A GPT-2-shaped decoder in plain PyTorch, one short class per idea.

Pre-LayerNorm blocks, learned position embeddings, causal ``scaled_dot_product_attention``, a 4x
MLP with (tanh-approximated) GELU as in GPT-2, and an LM head tied to the token embedding.
Linear and LayerNorm layers come from a ``LayerFactory`` (see ``layers.py``).

Shapes in comments: B batch, T sequence, C = n_embd, nh = n_head, hs = C / nh, V vocab.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import flops
from .config import GPTConfig
from .layers import LayerFactory, TorchLayers

__all__ = [
    "CausalSelfAttention",
    "MLP",
    "Block",
    "GPT",
    "param_breakdown",
    "flops_breakdown",
]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layers: LayerFactory) -> None:
        super().__init__()
        self.head_dim, self.dropout = cfg.head_dim, cfg.dropout
        self.qkv = layers.linear(cfg.n_embd, 3 * cfg.n_embd, cfg.bias, role="attn.qkv")
        self.proj = layers.linear(cfg.n_embd, cfg.n_embd, cfg.bias, role="attn.proj")
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, T, 3C); the whole sequence even when x is a sequence-parallel slice
        B, T, _ = qkv.shape
        q, k, v = qkv.chunk(3, dim=2)  # 3 x (B, T, C); a TP shard has fewer columns
        # (B, T, C) -> (B, nh, T, hs): nh follows from the width, so a shard with 3 heads works
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig, layers: LayerFactory) -> None:
        super().__init__()
        self.fc = layers.linear(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, role="mlp.fc")
        self.act = layers.gelu()  # GELU (tanh approximation), as GPT-2
        self.proj = layers.linear(4 * cfg.n_embd, cfg.n_embd, cfg.bias, role="mlp.proj")
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layers: LayerFactory) -> None:
        super().__init__()
        self.ln1 = layers.layernorm(cfg.n_embd, cfg.bias)
        self.attn = CausalSelfAttention(cfg, layers)
        self.ln2 = layers.layernorm(cfg.n_embd, cfg.bias)
        self.mlp = layers.mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    recipe: Any = None  # how ``build.build_model`` built it (a ``ModelRecipe``); None by hand
    parallel: Any = None  # the layout ``build_model`` applied (a ``parallel.mesh.ParallelDims``)

    def __init__(self, cfg: GPTConfig, layers: LayerFactory | None = None) -> None:
        super().__init__()
        layers = layers or TorchLayers()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(layers.block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = layers.layernorm(cfg.n_embd, cfg.bias)
        self.loss_fn = layers.cross_entropy()
        self.apply(self._init_weights)
        # GPT-2: scale the init of projections into the residual stream by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V), and the mean cross-entropy if ``targets`` (B, T) are given."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"Sequence length {T} exceeds block_size={self.config.block_size}; crop the "
                "input to the last block_size tokens (generate() does this)."
            )
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.tok_emb.weight)  # tied LM head: (B, T, V)
        loss = None
        if targets is not None:
            loss = self.loss_fn(logits.view(B * T, -1), targets.reshape(B * T))
        return logits, loss

    # ---- anatomy -------------------------------------------------------------------------
    def num_params(self) -> int:
        """Parameter count (tied weights once: the LM head is the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(
        self, training: bool = True, seq_len: int | None = None, causal: bool = False
    ) -> float:
        """Matmul FLOPs per token for a forward (x1) or forward+backward (x3) pass.

        A matmul of an (m, k) by a (k, n) matrix costs 2mkn FLOPs. Per token and layer:
          - the four Linear layers hold 12 C^2 weights -> 2 * 12 C^2 forward FLOPs;
          - attention scores Q K^T and the weighted sum A V each cost 2 T C -> 4 T C
            (counted over the full T x T matrix, as PaLM's MFU does; a causal kernel may
            skip about half of it);
        plus the LM head, 2 V C. Backward costs twice the forward, so training is
        6 N + 12 L T C with N = 12 L C^2 + V C, the Kaplan/PaLM formula. LayerNorm, GELU,
        softmax and adds are ignored: they are memory-bound and a few percent of the FLOPs.
        ``causal=True`` counts only the scores the causal mask keeps, 2 (T + 1) C per layer
        instead of 4 T C: the useful work, what a causal FlashAttention kernel computes. The
        default keeps the full count, so MFU compares with nanoGPT's and PaLM's figures.
        The formulas live in ``tutorial_lib.flops``, shared with the cluster cost model.
        """
        c = self.config
        size = (c.n_layer, c.n_embd, seq_len or c.block_size, c.vocab_size)
        if training:
            return flops.training_flops_per_token(*size, causal=causal)
        return float(flops.forward_flops_per_token(*size, causal=causal))

    # ---- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (B, T); returns (B, T + new)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                context = idx[:, -self.config.block_size :]
                logits = self(context)[0][:, -1, :].float() / temperature  # (B, V)
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
                idx = torch.cat([idx, nxt], dim=1)
        finally:
            self.train(was_training)
        return idx


def param_breakdown(model: GPT) -> dict[str, int]:
    """Parameters per component: embeddings, attention, MLP, LayerNorms (tied head counted once)."""
    groups = {
        "token embedding": 0,
        "position embedding": 0,
        "attention": 0,
        "MLP": 0,
        "LayerNorm": 0,
    }
    for name, p in model.named_parameters():
        if name.startswith("tok_emb"):
            key = "token embedding"
        elif name.startswith("pos_emb"):
            key = "position embedding"
        elif ".attn." in name:
            key = "attention"
        elif ".mlp." in name:
            key = "MLP"
        else:
            key = "LayerNorm"
        groups[key] += p.numel()
    return groups


def flops_breakdown(cfg: GPTConfig, seq_len: int | None = None) -> dict[str, float]:
    """Forward matmul FLOPs per token by component; the values sum to
    ``GPT.flops_per_token(training=False)`` (multiply by 3 for forward + backward)."""
    T, C, L = seq_len or cfg.block_size, cfg.n_embd, cfg.n_layer
    return {
        "attention projections (QKV, out)": float(L * flops.attention_linear_flops(C)),
        "attention scores + weighted sum": float(L * flops.attention_score_flops(T, C)),
        "MLP": float(L * flops.mlp_flops(C)),
        "LM head": float(flops.lm_head_flops(C, cfg.vocab_size)),
    }
