"""Data parallelism: every rank trains on its share of each global batch, with DDP or FSDP2.

    ddp    ``replicate`` (torch's composable DistributedDataParallel): every rank holds the
           whole model, gradients, and optimizer state; the backward pass all-reduces (averages)
           the gradients in buckets while it runs, so every rank takes the same optimizer step.
    fsdp   FSDP2, ``torch.distributed.fsdp.fully_shard`` on each transformer block and then on
           the whole model: every rank keeps 1/dp of each parameter (a ``DTensor`` sharded on
           dim 0), of its gradient and of its optimizer state. A block's parameters are
           all-gathered just before its forward (and again before its backward, since
           ``fully_shard`` frees them after the forward by default), and its gradients are
           reduce-scattered (averaged) as soon as its backward is done.

Both keep the module a ``GPT`` with the same parameter names, so ``build_model`` applies them
as its last step (``build_model(parallel=ParallelDims(dp_group, dp_mode))``) and the ``Trainer``
trains the result like any other model. ``cfg.batch_size`` is the *global* batch; every rank
draws the same global batch (the data generator is seeded alike everywhere) and takes rows
``[r * B/dp, (r + 1) * B/dp)`` (``mesh.local_rows``), so a dp run sees exactly the batches of
one process with the same seed, and its mean loss and gradients are the single process's, up to
float rounding (tested: ``tests/test_data_parallel.py``), as long as the model has no dropout
(every rank draws the same dropout masks, on different rows). The logged loss is averaged over
the ranks.

``param_dtype`` (FSDP2 only): FSDP2's ``MixedPrecisionPolicy`` casts the gathered parameters to
this dtype (for example BF16: half the all-gather bytes) and reduces the gradients in float32.
Unlike BF16 autocast, every op of the block then runs in that dtype, LayerNorm included.

``memory_per_rank`` counts the bytes each rank holds for parameters, gradients and optimizer
state, read from the tensors themselves (a DTensor's local shard).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..model import GPT
from .comm import Group

__all__ = [
    "memory_per_rank",
    "replicate_with_ddp",
    "shard_with_fsdp",
    "zero_bytes_per_rank",
]


def shard_with_fsdp(
    model: GPT, group: Group, device: torch.device, param_dtype: torch.dtype | None = None
) -> GPT:
    """FSDP2 on ``model`` in place: each block, then the root (embeddings, final LayerNorm,
    head), over a one-dimensional mesh of ``group``'s ranks."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def replicate_with_ddp(model: GPT, group: Group, device: torch.device) -> GPT:
    """DDP on ``model`` in place (``replicate``, the composable form of
    ``DistributedDataParallel``: the module stays a ``GPT``), over ``group``'s ranks."""
    from torch.distributed._composable.replicate import replicate

    replicate(model, process_group=group, device_id=device)
    return model


ZERO_STAGES = (0, 1, 2, 3)


def zero_bytes_per_rank(
    n_params: int,
    dp: int,
    stage: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optim_bytes: int = 8,
) -> tuple[float, float, float]:
    """ZeRO's model (Rajbhandari et al., 2020) of the bytes one of ``dp`` ranks holds for
    (parameters, gradients, optimizer state) of a model with ``n_params`` parameters: stage 0
    (DDP) replicates all three; stage 1 shards the optimizer state over the ranks; stage 2 the
    gradients too; stage 3 (FSDP) the parameters too. Defaults: FP32 parameters and gradients,
    AdamW's two FP32 moments. Activations and temporary buffers (DDP's gradient buckets, FSDP's
    gathered block) are not in it."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}.")
    if dp < 1 or n_params < 0:
        raise ValueError(f"Need dp >= 1 and n_params >= 0, got dp={dp}, n_params={n_params}.")
    full = (n_params * param_bytes, n_params * grad_bytes, n_params * optim_bytes)
    sharded = (stage >= 3, stage >= 2, stage >= 1)
    return tuple(b / dp if s else float(b) for b, s in zip(full, sharded, strict=True))  # type: ignore[return-value]


def memory_per_rank(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (a DTensor counts
    its local shard), read from the tensors themselves; with a GPU, also the allocator's peak."""

    def nbytes(t: torch.Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    params = list(model.parameters())
    optim = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {
        "parameters": sum(nbytes(p) for p in params),
        "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(nbytes(v) for v in optim if v.dim() > 0),  # not the step counters
    }
    device = params[0].device
    if device.type == "cuda":
        out["peak_allocated"] = int(torch.cuda.max_memory_allocated(device))
    return out
