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
loss kernels around the parallel layers (``tp_layers``; the MLP keeps ``fc``'s bias in its GEMM,
since the column-parallel layer must run its own forward); an FP8 precision swaps each parallel
layer for its FP8 variant (``to_fp8``, ``parallel.tp_fp8``) after the split; ``torch.compile``
compiles the model with the collectives inside the autograd Functions of ``comm``.
Checkpoints: ``gather_full`` and ``gather_full_optimizer`` turn the shards of the model and of
AdamW's moments into the single-process format; ``shard_state_dict`` and ``shard_optimizer_state``
cut them again for any other map, so a run resumes at any TP degree.

Where each part lives (this module re-exports their public names): ``tp_linear``, the column- and
row-parallel Linear layers; ``tp_model``, the ``TPLayers`` factory, ``TPGPT``, ``parallelize``,
``TPSpec``, ``shard_state_dict`` and ``tp_clip_grad_norm_``; ``tp_checkpoint``, the full state
dicts, AdamW's moments and checkpoints gathered from the shards and cut again.
"""

from __future__ import annotations

from .tp_checkpoint import (
    gather_checkpoint,
    gather_full,
    gather_full_optimizer,
    gather_full_state_dict,
    shard_checkpoint,
    shard_optimizer_state,
)
from .tp_linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    column_input,
    row_bias,
    row_output,
)
from .tp_model import (
    TPGPT,
    SequenceParallelLayerNorm,
    TPLayers,
    TPSpec,
    check_tp_setup,
    parallelize,
    shard_state_dict,
    tp_clip_grad_norm_,
    tp_layers,
)

__all__ = [
    "TPSpec",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TPLayers",
    "TPGPT",
    "SequenceParallelLayerNorm",
    "column_input",
    "row_output",
    "row_bias",
    "check_tp_setup",
    "shard_state_dict",
    "parallelize",
    "gather_full",
    "gather_full_state_dict",
    "gather_full_optimizer",
    "shard_optimizer_state",
    "gather_checkpoint",
    "shard_checkpoint",
    "tp_layers",
    "tp_clip_grad_norm_",
]
