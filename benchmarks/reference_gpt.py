"""A plain, single-file GPT-2-style reference model, to time ``tutorial_lib.model.GPT`` against.

    ref = ReferenceGPT(cfg, gelu="tanh")   # cfg: a tutorial_lib.GPTConfig (or anything with
    ref.load_from(ours)                    # its fields); copies our weights in
    logits, loss = ref(idx, targets)

Pre-LayerNorm blocks, learned position embeddings, causal ``F.scaled_dot_product_attention``,
a 4x MLP with GELU, and an LM head tied to the token embedding, with a mean cross-entropy loss:
the architecture ``tutorial_lib.model`` describes, written as directly as PyTorch allows and
with no hooks for other backends. It has exactly our parameter shapes, in our order.

``gelu="tanh"`` is GPT-2's tanh approximation (what our GPT uses: equal work); ``gelu="erf"`` is
the exact GELU that many minimal implementations use: a different function, and on a CPU a
cheaper one (ATen's exact GELU took a third to a half of the tanh one's time on an AVX2 EPYC;
``benchmarks/model_speed.py`` times both). Dropout modules are there, as in most minimal GPTs;
at p = 0 they return their input.

``load_from`` copies parameters by position (after checking every shape), so a reordering of
same-shaped parameters in our model would pair the wrong tensors: ``check_equivalence`` (random
weights, so every tensor matters) then fails, which is what it is for.

``check_equivalence()`` builds our GPT and this model from the same weights and raises
``EquivalenceError`` unless both give the same loss, logits and gradients on the same batch
(float32 tolerance): the proof that the speed comparison is of equal work.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ReferenceGPT", "EquivalenceError", "check_equivalence", "shapes"]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.p = heads, dropout
        self.in_proj = nn.Linear(width, 3 * width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)
        self.out_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.in_proj(x).split(C, dim=-1)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.out_drop(self.out_proj(y))


class FeedForward(nn.Module):
    def __init__(self, width: int, bias: bool, dropout: float, gelu: str) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=bias)
        self.act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        self.down = nn.Linear(4 * width, width, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(self.act(self.up(x))))


class Layer(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool, dropout: float, gelu: str) -> None:
        super().__init__()
        self.norm_a = nn.LayerNorm(width, eps=1e-5, bias=bias)
        self.attn = Attention(width, heads, bias, dropout)
        self.norm_m = nn.LayerNorm(width, eps=1e-5, bias=bias)
        self.ff = FeedForward(width, bias, dropout, gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_a(x))
        return x + self.ff(self.norm_m(x))


class ReferenceGPT(nn.Module):
    """GPT-2-style decoder; ``forward(idx, targets=None)`` returns ``(logits, loss)``."""

    def __init__(self, cfg: Any, gelu: str = "tanh") -> None:
        super().__init__()
        if gelu not in ("tanh", "erf"):
            raise ValueError(f"gelu must be 'tanh' or 'erf', got {gelu!r}")
        self.block_size, self.gelu = cfg.block_size, gelu
        C, drop = cfg.n_embd, cfg.dropout
        self.wte = nn.Embedding(cfg.vocab_size, C)
        self.wpe = nn.Embedding(cfg.block_size, C)
        self.emb_drop = nn.Dropout(drop)
        self.layers = nn.ModuleList(
            Layer(C, cfg.n_head, cfg.bias, drop, gelu) for _ in range(cfg.n_layer)
        )
        self.norm_f = nn.LayerNorm(C, eps=1e-5, bias=cfg.bias)
        for name, p in self.named_parameters():  # GPT-2 init (speed does not depend on it)
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                into_residual = name.endswith(("out_proj.weight", "down.weight"))
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if into_residual else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.emb_drop(self.wte(idx) + self.wpe(pos))
        for layer in self.layers:
            x = layer(x)
        logits = F.linear(self.norm_f(x), self.wte.weight)  # tied LM head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss

    @torch.no_grad()
    def load_from(self, ours: nn.Module) -> ReferenceGPT:
        """Copy the weights of a ``tutorial_lib.model.GPT`` of the same config into this model
        (parameter by parameter, in order); raises ``ValueError`` if any shape differs."""
        src, dst = list(ours.parameters()), list(self.parameters())
        if shapes(ours) != shapes(self):
            raise ValueError(
                f"parameter shapes differ: ours {shapes(ours)} vs reference {shapes(self)}"
            )
        for s, d in zip(src, dst, strict=True):
            d.copy_(s)
        return self


def shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The shapes of ``model.parameters()`` in order (a tied weight once)."""
    return [tuple(p.shape) for p in model.parameters()]


class EquivalenceError(AssertionError):
    """Our GPT and the reference disagree: the timing comparison would not be of equal work."""


def with_exact_gelu(model: nn.Module) -> nn.Module:
    """Our GPT ``model`` with each MLP's GELU replaced, in place, by the exact (erf) one,
    ``nn.GELU()``: like for like with ``ReferenceGPT(gelu="erf")``."""
    for block in model.blocks:
        block.mlp.act = nn.GELU()
    return model


def check_equivalence(
    cfg: Any = None,
    batch: int = 4,
    seq: int | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    gelu: str = "tanh",
    ours_gelu: str = "tanh",
) -> float:
    """Build ``tutorial_lib.model.GPT(cfg)`` (default: the ``tiny`` size), give it random weights
    of order one (GPT-2's init keeps the GELU inputs so small that tanh and erf GELU give the same
    loss to 7 digits, which would hide a different function), copy them into a ``ReferenceGPT``
    (``gelu``), and run both on the same random batch in float32. ``ours_gelu="none"`` gives
    ours the exact GELU (``with_exact_gelu``), to compare with ``gelu="erf"``.

    Raises ``EquivalenceError`` if the parameter shapes, the losses, the logits or any gradient
    differ beyond (``rtol``, ``atol``); returns our loss. ``gelu="erf"`` must raise: the exact
    GELU is a different function (a check that this check can fail).
    """
    from tutorial_lib.config import GPTConfig
    from tutorial_lib.model import GPT

    cfg = cfg if cfg is not None else GPTConfig.from_name("tiny")
    seq = seq or cfg.block_size
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    ours = GPT(cfg).float().train()
    if ours_gelu == "none":
        with_exact_gelu(ours)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            gain = name.endswith("weight") and p.dim() == 1  # LayerNorm gains around 1
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if gain else 0.0))
    ref = ReferenceGPT(cfg, gelu=gelu).float().train().load_from(ours)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    tgt = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    logits_o, loss_o = ours(idx, tgt)
    logits_r, loss_r = ref(idx, tgt)
    assert loss_o is not None and loss_r is not None
    if not torch.allclose(loss_o, loss_r, rtol=rtol, atol=atol):
        raise EquivalenceError(f"losses differ: ours {loss_o.item():.7f}, ref {loss_r.item():.7f}")
    if not torch.allclose(logits_o, logits_r, rtol=rtol, atol=atol):
        diff = (logits_o - logits_r).abs().max().item()
        raise EquivalenceError(f"logits differ by up to {diff:.3g}")
    loss_o.backward()
    loss_r.backward()
    for (name, po), pr in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert po.grad is not None and pr.grad is not None
        if not torch.allclose(po.grad, pr.grad, rtol=1e-4, atol=1e-6):
            diff = (po.grad - pr.grad).abs().max().item()
            raise EquivalenceError(f"gradient of {name} differs by up to {diff:.3g}")
    return float(loss_o.item())


if __name__ == "__main__":
    print(f"equal loss, logits and gradients: loss {check_equivalence():.6f}")
