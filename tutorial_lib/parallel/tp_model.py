"""Tensor-parallel layers and model: Megatron's column/row split, with uneven shards.

A Block has two column-parallel -> row-parallel pairs (attention: ``attn.qkv`` -> ``attn.proj``
over heads; MLP: ``mlp.fc`` -> ``mlp.proj`` over FFN columns). Per pair, in forward:

    x (replicated) --f--> [x @ W_col^T: my heads / my FFN columns] --> local attention or GELU
      --> [h_mine @ W_row^T: a partial sum] --g (all-reduce)--> y (replicated) + bias

``f`` and ``g`` are ``comm.copy_to_tp`` and ``comm.reduce_from_tp``. Two all-reduces per Block in
forward (``g``) and two in backward (``f``). Everything outside the pairs (embeddings,
LayerNorms, the row-parallel biases, the LM head) is replicated: every rank computes it
identically, and its gradients come out identical too, because ``f`` sums the partial gradients.

Which rows or columns a rank owns comes from a ``ShardMap`` (``shard.py``); the layouts from
``unit_specs`` and ``global_index``, so a shard may hold any set of heads, e.g. heads (0, 3).
Dropout is not supported under TP: it would need Megatron's per-rank RNG tracker.

What composes with it: ``fused=True`` keeps the Triton LayerNorm, residual-add-LayerNorm, GELU and
loss kernels around the parallel layers (``parallelize``; the MLP keeps ``fc``'s bias in its GEMM,
since the column-parallel layer must run its own forward); an FP8 precision swaps each parallel
layer for its FP8 variant (``to_fp8``, ``parallel.tp_fp8``) after the split; ``torch.compile``
compiles the model with the collectives inside the autograd Functions of ``comm``.
``shard_state_dict`` cuts a full state dict for a rank and ``gather_full`` joins the shards
again; checkpoints do not need either (``checkpoint``: each rank writes its pieces of the full
tensors, and a run resumes at any TP degree).

This module holds the model transform: the ``TPLayers`` factory (with its sequence-parallel
LayerNorm and its Triton variant), ``TPGPT``, ``parallelize`` and ``TPSpec``,
and ``shard_state_dict`` and ``gather_full``. The f and g operators are ``comm``'s, the column- and
row-parallel layers ``tp_linear``'s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..config import GPTConfig
from ..layers import LINEAR_ROLES, TorchLayers
from ..model import GPT
from .comm import Group, copy_to_tp, gather_from_sp, group_rank, group_size, split_to_sp
from .shard import ShardMap, global_index, param_spec, rank_units, unit_specs
from .tp_linear import ColumnParallelLinear, RowParallelLinear
from .vocab import gather_vocab, vocab_parallel_cross_entropy, vocab_parallel_embedding

__all__ = [
    "TPSpec",
    "TPLayers",
    "TPGPT",
    "SequenceParallelLayerNorm",
    "check_tp_setup",
    "shard_state_dict",
    "gather_full",
    "parallelize",
]

COLUMN_ROLES = ("attn.qkv", "mlp.fc")  # output features split: weight rows, bias


def check_tp_setup(cfg: GPTConfig, group: Group, shard_map: ShardMap) -> int:
    """Validate a TP setup and return this process's TP rank (raises ``ValueError``)."""
    shard_map.check_model(cfg)
    if cfg.dropout > 0 and shard_map.tp > 1:
        raise ValueError(
            f"dropout={cfg.dropout} under tensor parallelism is not supported: ranks would need "
            "Megatron's RNG tracker (same masks on replicated activations, different ones per "
            "head). Train with dropout=0.0."
        )
    n = group_size(group)
    if n != shard_map.tp:
        what = "is None (one rank)" if group is None else f"has {n} ranks"
        raise ValueError(
            f"The process group {what} but the shard map {shard_map.tp}; build the map for the "
            f"group's size (ShardMap.even(cfg, {n})) or pass a group with {shard_map.tp} ranks."
        )
    return group_rank(group)


class TPLayers(TorchLayers):
    """Layer factory: column-parallel ``attn.qkv``/``mlp.fc``, row-parallel ``attn.proj``/
    ``mlp.proj``, all cut by ``shard_map`` for this process's rank in ``group``; LayerNorm, GELU
    and loss as TorchLayers.

    Every Block uses the same map, so the factory needs no per-block state.
    """

    def __init__(
        self,
        cfg: GPTConfig,
        group: Group,
        shard_map: ShardMap,
        sequence_parallel: bool = False,
    ) -> None:
        self.rank = check_tp_setup(cfg, group, shard_map)
        self.cfg, self.group, self.shard_map = cfg, group, shard_map
        self.sequence_parallel = sequence_parallel
        self.specs = unit_specs(cfg)

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        spec = self.specs[f"{role}.weight"]
        units, total = rank_units(self.shard_map, spec, self.rank)
        cls = ColumnParallelLinear if role in COLUMN_ROLES else RowParallelLinear
        sp = self.sequence_parallel
        return cls(in_features, out_features, bias, self.group, spec, units, total, sp)

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        if not self.sequence_parallel:
            return super().layernorm(features, bias)
        norm = SequenceParallelLayerNorm(features, bias=bias)
        norm.group = self.group
        return norm


class SequenceParallelLayerNorm(nn.LayerNorm):
    """LayerNorm on a sequence slice. Each rank normalizes only its tokens, so its gains get
    only their part of the gradient; reading them through ``f`` (identity forward, all-reduce
    backward) sums the parts over the TP ranks inside the backward (Megatron all-reduces the
    same gradients after it)."""

    group: Group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = _through_f(self.weight, self.group), _through_f(self.bias, self.group)
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


def _through_f(p: torch.Tensor | None, group: Group) -> torch.Tensor | None:
    return None if p is None else copy_to_tp(p, group)


@functools.cache
def _fused_tp_layers() -> type[TPLayers]:
    """``TPLayers`` whose LayerNorms, blocks, GELU and loss are ``TritonLayers``' (deferred: the
    kernels import Triton). ``fold_fc_bias`` is off: ``BiasGELUMLP`` would call ``fc``'s weight
    directly and skip the column-parallel layer's forward (its ``f``)."""
    from ..kernels import fused

    class SequenceParallelTritonLayerNorm(fused.TritonLayerNorm):
        """The Triton LayerNorm on a sequence slice, gains through ``f`` (as
        ``SequenceParallelLayerNorm``)."""

        group: Group = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self._check()
            w, b = _through_f(self.weight, self.group), _through_f(self.bias, self.group)
            return fused.layer_norm(x, w, b, self.eps)

        def add_forward(
            self, x: torch.Tensor, a: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            self._check()
            w, b = _through_f(self.weight, self.group), _through_f(self.bias, self.group)
            return fused.add_layer_norm(x, a, w, b, self.eps)

    class FusedTPLayers(TPLayers, fused.TritonLayers):
        fold_fc_bias = False

        def layernorm(self, features: int, bias: bool) -> nn.Module:
            if not self.sequence_parallel:
                return fused.TritonLayers.layernorm(self, features, bias)
            norm = SequenceParallelTritonLayerNorm(features, eps=1e-5, bias=bias)
            norm.group = self.group
            return norm

    return FusedTPLayers


class TPGPT(GPT):
    """The GPT of one TP rank: its blocks from ``TPLayers``, and the two options that reach
    outside the blocks.

    sequence parallelism (``layers.sequence_parallel``): the embeddings are cut along the
        sequence (``split_to_sp``); between the parallel layers every rank holds B x T/t tokens
        (LayerNorms, residual adds: 1/t of the activations); the final LayerNorm's output is
        gathered for the LM head. T must divide by t.
    vocabulary parallelism (``shard_map.vocab``): ``tok_emb.weight`` holds this rank's rows;
        the embedding, the tied head and the loss are ``parallel.vocab``'s, and no rank ever
        holds the (B x T, V) logits while training. Without ``targets`` the logits are gathered
        (generation wants the whole distribution).
    """

    def __init__(self, cfg: GPTConfig, layers: TPLayers) -> None:
        super().__init__(cfg, layers)
        self.group, self.shard_map, self.tp_rank = layers.group, layers.shard_map, layers.rank
        self.sequence_parallel = layers.sequence_parallel
        self.vocab_start = 0
        if self.shard_map.vocab is not None:
            self.vocab_start, end = self.shard_map.vocab_range(self.tp_rank)
            self.tok_emb = nn.Embedding(end - self.vocab_start, cfg.n_embd)
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.config.block_size:
            return super().forward(idx, targets)  # its error names the fix
        vocab, sp, group = self.shard_map.vocab is not None, self.sequence_parallel, self.group
        keep = T
        if sp and targets is None and T % group_size(group):
            # generation grows T one token at a time: pad the end so the sequence splits evenly
            # (causal attention: the padding changes nothing before it; cropped below)
            idx = F.pad(idx, (0, (-T) % group_size(group)))
            T = idx.shape[1]
        last = self.config.block_size - 1  # padded positions past the block reuse the last one
        pos = self.pos_emb(torch.arange(T, device=idx.device).clamp(max=last))
        if vocab:
            tok = vocab_parallel_embedding(idx, self.tok_emb.weight, self.vocab_start, group)
        else:
            tok = self.tok_emb(idx)
        x = self.drop(tok + pos)  # (B, T, C), replicated
        if sp:
            x = split_to_sp(x, group, dim=1)  # (B, T/t, C)
        for block in self.blocks:
            x = block(x)
        h = self.ln_f(x)
        if sp:  # the head needs every token; its gradient is partial (vocab) or replicated
            h = gather_from_sp(h, group, dim=1, partial_grad=vocab)
        elif vocab:
            h = copy_to_tp(h, group)
        logits = F.linear(h, self.tok_emb.weight)  # (B, T, V) or (B, T, this rank's V)
        loss = None
        if targets is not None:
            flat, y = logits.view(B * T, -1), targets.reshape(B * T)
            if vocab:
                loss = vocab_parallel_cross_entropy(flat, y, self.vocab_start, group)
            else:
                loss = self.loss_fn(flat, y)
        elif vocab:
            sizes = [len(v) for v in self.shard_map.vocab or ()]
            logits = gather_vocab(logits, sizes, group)
        return (logits if keep == T else logits[:, :keep]), loss  # no view when unpadded


def shard_state_dict(
    full: Mapping[str, torch.Tensor], cfg: GPTConfig, shard_map: ShardMap, rank: int
) -> dict[str, torch.Tensor]:
    """This rank's slice of a full (single-process) state dict; replicated entries as they are."""
    shard_map.check_model(cfg)
    specs = unit_specs(cfg)
    out = {}
    for name, tensor in full.items():
        spec = param_spec(name, specs, shard_map)
        if spec is None:
            out[name] = tensor
        else:
            units, total = rank_units(shard_map, spec, rank)
            index = global_index(spec, units, total).to(tensor.device)
            out[name] = tensor.index_select(spec.dim, index)
    return out


def gather_full(
    tensors: Mapping[str, torch.Tensor], cfg: GPTConfig, group: Group, shard_map: ShardMap
) -> dict[str, torch.Tensor]:
    """The inverse of ``shard_state_dict``, on every rank: full tensors from each rank's shards.

    Works for parameters and for their gradients. Shards may differ in size, so instead of one
    padded all-gather, each rank in turn packs all its shards into one flat buffer and
    broadcasts it (t broadcasts in all); everyone knows every buffer's layout from the map.
    """
    rank = check_tp_setup(cfg, group, shard_map)
    specs = unit_specs(cfg)
    sharded = {
        n: (t, s) for n, t in tensors.items() if (s := param_spec(n, specs, shard_map)) is not None
    }
    out = {n: t for n, t in tensors.items() if n not in sharded}  # replicated
    if not sharded:
        return out
    full: dict[str, torch.Tensor] = {}
    for name, (t, spec) in sharded.items():
        shape = list(t.shape)
        shape[spec.dim] = spec.groups * rank_units(shard_map, spec, 0)[1] * spec.width
        full[name] = t.new_empty(shape)
    for src in range(shard_map.tp):
        pieces = []  # (name, spec, index into the full tensor, shape of src's shard)
        for name, (t, spec) in sharded.items():
            index = global_index(spec, *rank_units(shard_map, spec, src)).to(t.device)
            shape = list(t.shape)
            shape[spec.dim] = len(index)
            pieces.append((name, spec, index, shape))
        if src == rank:
            flat = torch.cat([sharded[n][0].detach().reshape(-1) for n, *_ in pieces])
        else:
            sizes = sum(math.prod(shape) for *_, shape in pieces)
            flat = next(iter(sharded.values()))[0].new_empty(sizes)
        if group is not None and shard_map.tp > 1:
            dist.broadcast(flat, src=dist.get_global_rank(group, src), group=group)
        offset = 0
        for name, spec, index, shape in pieces:
            size = math.prod(shape)
            piece = flat[offset : offset + size].view(shape)
            full[name].index_copy_(spec.dim, index, piece)
            offset += size
    out.update(full)
    return {n: out[n] for n in tensors}  # keep the input's order


def parallelize(
    model: GPT,
    group: Group,
    shard_map: ShardMap,
    fused: bool = False,
    sequence_parallel: bool = False,
) -> GPT:
    """A tensor-parallel copy of ``model`` holding this rank's shards (on the model's device), a
    ``TPGPT`` built by ``TPLayers``; ``fused``: the same parallel Linear layers among the Triton
    kernels of ``kernels.TritonLayers``; ``sequence_parallel``: the blocks' LayerNorms and
    residuals on sequence slices; a map that splits the vocabulary (``ShardMap.even(...,
    vocab_parallel=True)``) makes the embedding, head and loss vocabulary-parallel.

    Every rank must pass the same full weights (same seed, or a loaded checkpoint).
    """
    cfg = model.config
    layers = (_fused_tp_layers() if fused else TPLayers)(cfg, group, shard_map, sequence_parallel)
    tp_model = TPGPT(cfg, layers).to(model.tok_emb.weight.device)
    tp_model.load_state_dict(shard_state_dict(model.state_dict(), cfg, shard_map, layers.rank))
    return tp_model


@dataclass(frozen=True)
class TPSpec:
    """Tensor parallelism for ``build_model(..., parallel=ParallelDims(tp=TPSpec(group,
    shard_map)))``, which applies it with ``parallelize`` (its step 2)."""

    group: Group
    shard_map: ShardMap
    sequence_parallel: bool = False

    @property
    def degree(self) -> int:
        return self.shard_map.tp
