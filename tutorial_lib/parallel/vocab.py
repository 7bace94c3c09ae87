"""A vocabulary-parallel embedding, LM head and cross-entropy (Megatron-LM's, with uneven
splits): rank r holds the embedding rows of token ids [start_r, end_r), and the logits of
those ids only; the full (tokens, V) logits never exist on any rank.

    embedding   each rank looks up the ids it holds (zeros for the others), then ``g``
                (all-reduce): every rank has the full embedding. Backward: each rank's rows
                get the gradient of the tokens it holds.
    head        logits_r = h @ W_r^T, with ``f`` (or the sequence-parallel gather) on h: the
                tied weight's own rows, so the head needs no weight of its own.
    loss        softmax cross-entropy over the split vocabulary with two all-reduces: the max
                logit per token (MAX), then the sum of exponentials and the target's logit,
                which only its owner has (one SUM of two numbers per token). Backward is local:
                softmax_r - onehot_r, scaled by the incoming gradient / N.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .comm import Group, group_size, reduce_from_tp

__all__ = ["vocab_parallel_embedding", "vocab_parallel_cross_entropy", "gather_vocab"]


def vocab_parallel_embedding(
    idx: torch.Tensor, weight: torch.Tensor, start: int, group: Group
) -> torch.Tensor:
    """The embeddings of ``idx`` from each rank's rows ``weight`` (ids ``start`` to ``start +
    len(weight)``), summed over the group: (..., C) on every rank."""
    end = start + weight.shape[0]
    outside = (idx < start) | (idx >= end)
    local = (idx - start).clamp(0, weight.shape[0] - 1)
    e = F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(e, group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (N, V_r) logit slices against (N,) targets (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, start: int, group: Group
    ) -> torch.Tensor:
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least
        top = z.max(dim=-1).values
        if group_size(group) > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        z = z - top.unsqueeze(-1)  # every logit <= 0: exp cannot overflow
        exp = z.exp()
        total = exp.sum(dim=-1)
        end = start + z.shape[-1]
        mine = (targets >= start) & (targets < end)
        local = (targets - start).clamp(0, z.shape[-1] - 1)
        target_logit = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        if group_size(group) > 1:
            both = torch.stack([total, target_logit])
            dist.all_reduce(both, group=group)
            total, target_logit = both[0], both[1]
        ctx.save_for_backward(exp / total.unsqueeze(-1), local, mine)
        ctx.dtype = logits.dtype
        return (total.log() - target_logit).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, mine = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, local] -= mine.to(g.dtype)
        return (g * (grad / g.shape[0])).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, start: int, group: Group
) -> torch.Tensor:
    """Mean cross-entropy (as ``F.cross_entropy``) of this rank's logits for token ids
    [start, start + logits.shape[-1]), the same number on every rank."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"Expected logits (N, V_rank) and targets (N,), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}."
        )
    return VocabParallelCrossEntropy.apply(logits, targets, start, group)


def gather_vocab(logits: torch.Tensor, sizes: list[int], group: Group) -> torch.Tensor:
    """The full logits from every rank's slice (uneven ``sizes`` along the last dimension, in
    rank order): for inference and generation only, where the full distribution is wanted. Not
    differentiable (a plain all-gather)."""
    if group_size(group) == 1:
        return logits
    width = max(sizes)
    padded = F.pad(logits, (0, width - logits.shape[-1])).contiguous()
    pieces = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p[..., :n] for p, n in zip(pieces, sizes, strict=True)], dim=-1)
