"""Where a run's processes sit: data parallelism (DDP or FSDP2) over one dimension of a device
mesh, tensor parallelism over the other, as torchtitan and Megatron lay them out.

    rank = d * tp + t        d: the data-parallel index (which replica), t: the TP index

TP is the inner dimension: the t ranks of one replica are neighbours (on a GPU node, the GPUs an
NVLink switch joins), because TP talks at every layer and DP once per step. ``groups_2d`` makes
the mesh's process groups with ``dist.new_group``, over every process (torchrun) or some of them
(the tests run several layouts in one spawn), and returns this rank's data-parallel and
tensor-parallel groups and a group of the whole job.

``ParallelDims`` is the layout one process takes part in: ``build_model(parallel=...)`` applies
it (TP, then FSDP2 or DDP) and the ``Trainer`` reads from it the three things a step needs to
know: which rows of the global batch are this rank's, over which ranks the loss is averaged and
the gradient norm is taken (``clip_grad_norm_``), and which rank writes files.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..config import GPTConfig
from .comm import Group, group_rank, group_size
from .shard import param_spec, unit_specs
from .tp_model import TPSpec

__all__ = [
    "DP_MODES",
    "ParallelDims",
    "check_layout",
    "clip_grad_norm_",
    "groups_2d",
    "local_rows",
    "parallel_of",
]

DP_MODES = ("ddp", "fsdp")


@dataclass(frozen=True)
class ParallelDims:
    """The layout of one process: its data-parallel group (``dp_group``; None: one replica) and
    how the replicas keep their copies (``dp_mode``: DDP replicates, FSDP2 shards), its
    tensor-parallel ``tp`` (a ``TPSpec``; None: no TP), and ``job_group``, every process of the
    run (default: ``dp_group`` without TP, all processes with it; a job on some of the processes
    of a spawn passes its own). ``param_dtype``: FSDP2's ``MixedPrecisionPolicy`` casts the
    gathered parameters to it (half the all-gather bytes in BF16) and reduces in float32."""

    dp_group: Group = None
    dp_mode: str = "fsdp"
    tp: TPSpec | None = None
    job_group: Group = None
    param_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.dp_mode not in DP_MODES:
            raise ValueError(
                f"Unknown data-parallel mode {self.dp_mode!r}; choose one of {DP_MODES}."
            )
        if self.param_dtype is not None and self.dp_mode != "fsdp":
            raise ValueError("param_dtype is FSDP2's MixedPrecisionPolicy: use dp_mode='fsdp'.")

    @property
    def dp(self) -> int:
        return group_size(self.dp_group)

    @property
    def dp_rank(self) -> int:
        return group_rank(self.dp_group)

    @property
    def tp_degree(self) -> int:
        return self.tp.degree if self.tp is not None else 1

    @property
    def tp_rank(self) -> int:
        return 0 if self.tp is None else group_rank(self.tp.group)

    @property
    def world(self) -> int:
        """The processes that train this model together: dp x tp."""
        return self.dp * self.tp_degree

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 shards the model (over one rank it would change nothing)."""
        return self.dp > 1 and self.dp_mode == "fsdp"

    @property
    def sharded(self) -> bool:
        """Whether the model's state is split over ranks (FSDP2 or TP): then its checkpoint is a
        DCP directory, each rank writing its pieces; otherwise one rank holds all of it."""
        return self.fsdp or self.tp_degree > 1

    @property
    def is_rank0(self) -> bool:
        """The process that shows progress and writes files."""
        return self.dp_rank == 0 and self.tp_rank == 0

    def mean_over_dp(self, value: torch.Tensor) -> torch.Tensor:
        """A per-rank value (a loss) averaged over the data-parallel ranks; the TP ranks of a
        replica hold the same loss already."""
        if self.dp == 1:
            return value
        total = value.detach().clone()
        dist.all_reduce(total, group=self.dp_group)
        return total / self.dp

    @property
    def job(self) -> Group:
        """Every process of the run (None without a process group)."""
        if not dist.is_initialized() or self.world == 1:
            return self.job_group
        if self.job_group is not None:
            return self.job_group
        return self.dp_group if self.tp is None else dist.group.WORLD


def parallel_of(model: torch.nn.Module) -> ParallelDims:
    """The layout ``build_model`` applied to ``model`` (one process for a model built without)."""
    dims = getattr(model, "parallel", None)
    return dims if isinstance(dims, ParallelDims) else ParallelDims()


def local_rows(global_batch: int, dp: int, rank: int) -> slice:
    """The rows of a global batch that data-parallel ``rank`` of ``dp`` trains on."""
    if global_batch % dp:
        raise ValueError(
            f"The global batch of {global_batch} sequences does not split evenly over {dp} "
            f"data-parallel ranks: choose --batch-size as a multiple of {dp} (e.g. "
            f"{dp * max(1, global_batch // dp)})."
        )
    local = global_batch // dp
    return slice(rank * local, (rank + 1) * local)


@torch.no_grad()
def clip_grad_norm_(model: torch.nn.Module, max_norm: float, dims: ParallelDims) -> torch.Tensor:
    """Clip the gradients to ``max_norm``; return the norm of the *full* gradient before
    clipping, the same on every rank, so every rank clips by the same factor.

    Without TP, torch's ``clip_grad_norm_`` (under FSDP2 its DTensor gradients make it a
    collective over the data-parallel ranks). Under TP: each rank's sum of squares of its
    TP-sharded gradients is all-reduced over the TP group, and the replicated ones are counted
    once; under FSDP2 as well, both sums are first all-reduced over the data-parallel ranks,
    each of which squared only its rows (a DTensor's local shard).
    """
    from torch.distributed.tensor import DTensor

    if dims.tp is None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    local = [
        (n, p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)  # a view: writes it
        for n, p in model.named_parameters()
        if p.grad is not None
    ]
    specs = unit_specs(model.config)  # type: ignore[arg-type]
    # at least float32 (bf16/fp16 grads), float64 for float64 grads, as clip_grad_norm_ does
    dtype = functools.reduce(torch.promote_types, (g.dtype for _, g in local), torch.float32)
    sq = torch.zeros(2, device=local[0][1].device, dtype=dtype)  # [TP-sharded, replicated]
    for name, g in local:
        spec = param_spec(name, specs, dims.tp.shard_map)
        sq[int(spec is None)] += torch.linalg.vector_norm(g.to(dtype)) ** 2
    if dims.fsdp:
        dist.all_reduce(sq, group=dims.dp_group)
    sq_sharded, sq_replicated = sq[0].clone(), sq[1]
    if dims.tp_degree > 1:
        dist.all_reduce(sq_sharded, group=dims.tp.group)
    total = (sq_sharded + sq_replicated).sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for _, g in local:
        g.mul_(coef.to(g.dtype))
    return total


def check_layout(dp: int, tp: int, world: int, cfg: GPTConfig | None = None) -> None:
    """A ValueError naming the fix unless ``dp`` x ``tp`` processes fill ``world`` and ``tp``
    gives every TP rank at least one head."""
    if dp < 1 or tp < 1:
        raise ValueError(f"--dp and --tp must be at least 1, got --dp {dp} --tp {tp}.")
    if dp * tp != world:
        layout = " ".join(f"--{k} {v}" for k, v in (("dp", dp), ("tp", tp)) if v > 1) or "--dp 1"
        raise ValueError(
            f"{layout} needs {dp * tp} processes, but WORLD_SIZE is {world}: run python -m "
            f"torch.distributed.run --nproc-per-node {dp * tp} -m tutorial_lib train {layout} "
            f"..., or choose --dp and --tp whose product is {world}."
        )
    if cfg is not None and tp > cfg.n_head:
        raise ValueError(
            f"--tp {tp} needs at least one attention head per rank, but the model has "
            f"{cfg.n_head}: choose --tp <= {cfg.n_head}."
        )


def groups_2d(
    dp: int, tp: int, ranks: Sequence[int], timeout: timedelta | None = None
) -> tuple[Group, Group, Group] | None:
    """This rank's (data-parallel, tensor-parallel, whole-job) groups of a dp x tp job on
    ``ranks`` (None when this rank is not in it). Every process must call it, with the same
    arguments, in the same order (``dist.new_group``'s rule). Their collectives fail after
    ``timeout``; None is torch's default (30 minutes on gloo), not the default group's."""
    check_layout(dp, tp, len(ranks))
    ranks = list(ranks)
    tp_groups = [dist.new_group(ranks[d * tp : (d + 1) * tp], timeout=timeout) for d in range(dp)]
    dp_groups = [dist.new_group(ranks[t::tp], timeout=timeout) for t in range(tp)]
    job = dist.new_group(ranks, timeout=timeout)
    me = dist.get_rank()
    if me not in ranks:
        return None
    d, t = divmod(ranks.index(me), tp)
    return dp_groups[t], tp_groups[d], job
