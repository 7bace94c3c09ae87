"""Data parallelism: every rank trains on its share of each global batch, with DDP or FSDP2.

    ddp    ``torch.nn.parallel.DistributedDataParallel``: every rank holds the whole model,
           gradients, and optimizer state; the backward pass all-reduces (averages) the gradients
           in buckets while it runs, so every rank takes the same optimizer step.
    fsdp   FSDP2, ``torch.distributed.fsdp.fully_shard`` on each transformer block and then on
           the whole model: every rank keeps 1/dp of each parameter (a ``DTensor`` sharded on
           dim 0), of its gradient and of its optimizer state. A block's parameters are
           all-gathered just before its forward (and again before its backward, since
           ``reshard_after_forward=True`` frees them after the forward), and its gradients are
           reduce-scattered (averaged) as soon as its backward is done.

``DPTrainer`` is the ``Trainer`` of one rank: ``cfg.batch_size`` is the *global* batch; every rank
draws the same global batch (the data generator is seeded alike everywhere) and takes rows
``[r * B/dp, (r + 1) * B/dp)``, so a dp run sees exactly the batches of one process with the same
seed, and its mean loss and gradients are the single process's, up to float rounding (tested:
``tests/test_data_parallel.py``), as long as the model has no dropout (every rank draws the same
dropout masks, on different rows). The logged loss is averaged over the ranks.

Checkpoints hold the full model and the optimizer state in the single-process format (FSDP2's
shards gathered with ``torch.distributed.checkpoint.state_dict``'s full state dicts, the
optimizer state keyed by parameter index again), written by rank 0. So any layout resumes any
other: a dp 2 checkpoint resumes in one process, and a single-process one at dp 4.

``param_dtype`` (FSDP2 only): FSDP2's ``MixedPrecisionPolicy`` casts the gathered parameters to
this dtype (for example BF16: half the all-gather bytes) and reduces the gradients in float32.
Unlike BF16 autocast, every op of the block then runs in that dtype, LayerNorm included.

``memory_per_rank`` counts the bytes each rank holds for parameters, gradients and optimizer
state, read from the tensors themselves (a DTensor's local shard).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..checkpoint import model_state_dict
from ..config import GPTConfig
from ..data import TokenData
from ..model import GPT
from ..train import TrainConfig, Trainer, keep_implementation, save_checkpoint
from .comm import Group, group_rank, on_rank0, on_rank0_2d
from .compose import check_composition
from .tp_checkpoint import gather_checkpoint, shard_checkpoint
from .tp_model import TPSpec, tp_clip_grad_norm_

__all__ = [
    "DP_MODES",
    "DPTrainer",
    "data_parallel_trainer",
    "keep_lazy_state",
    "local_rows",
    "memory_per_rank",
    "on_rank0",
    "shard_with_fsdp",
    "zero_bytes_per_rank",
]

DP_MODES = ("ddp", "fsdp")


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


def shard_with_fsdp(
    model: GPT,
    group: Group,
    device: torch.device,
    param_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
) -> GPT:
    """FSDP2 on ``model`` in place: each block, then the root (embeddings, final LayerNorm,
    head), over a one-dimensional mesh of ``group``'s ranks."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


class DPTrainer(Trainer):
    """The ``Trainer`` of one data-parallel rank (module docstring).

    ``mode``: ``"ddp"`` or ``"fsdp"``; ``group``: the data-parallel ranks (default: all).
    ``tp``: the ``TPSpec`` the model was built with, for 2D parallelism (``parallel.mesh``): the
    model holds this rank's tensor-parallel shards, ``group`` is this rank's data-parallel
    column of the mesh, and DDP or FSDP2 runs over it on those shards. Checkpoints gather the
    shards over TP too, into the single-process format. ``job_group``: all the run's processes
    (default: ``group`` without TP, every process with it; a job on some of the processes of a
    spawn passes its own), over which ``parallel.dcp`` writes sharded checkpoints.
    Only rank 0 shows the progress bar and writes checkpoints; every rank takes part in a save.
    """

    def __init__(
        self,
        model: GPT,
        data: TokenData,
        cfg: TrainConfig,
        mode: str = "fsdp",
        group: Group | None = None,
        device: torch.device | str | None = None,
        out_dir: str | Path | None = None,
        param_dtype: torch.dtype | None = None,
        tp: TPSpec | None = None,
        job_group: Group | None = None,
    ) -> None:
        from .launch import check_parallel_precision

        if mode not in DP_MODES:
            raise ValueError(f"Unknown data-parallel mode {mode!r}; choose one of {DP_MODES}.")
        if param_dtype is not None and mode != "fsdp":
            raise ValueError("param_dtype is FSDP2's MixedPrecisionPolicy: use mode='fsdp'.")
        check_composition(cfg.precision, tp is not None, mode == "fsdp")
        self.group = group if group is not None else dist.group.WORLD
        self.mode, self.dp = mode, dist.get_world_size(self.group)
        self.tp = tp
        # every process of the run (sharded checkpoints' collectives span it)
        self.job_group = (
            job_group if job_group is not None else (self.group if tp is None else dist.group.WORLD)
        )
        self.tp_rank = group_rank(tp.group) if tp is not None else 0
        self.dp_rank = group_rank(self.group)
        self._rows = local_rows(cfg.batch_size, self.dp, self.dp_rank)
        if self.dp_rank != 0 or self.tp_rank != 0:
            cfg = dataclasses.replace(cfg, progress=False)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model = model.to(dev)
        if mode == "fsdp":  # before the optimizer is made: it must hold the shards
            shard_with_fsdp(model, self.group, dev, param_dtype)
        super().__init__(model, data, cfg, device=dev, out_dir=out_dir)
        degree = tp.degree if tp is not None else 1
        check_parallel_precision(self, self.dp * degree, tp is not None, mode == "fsdp")
        self._ddp: nn.Module | None = None
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            self._ddp = DistributedDataParallel(self.model, process_group=self.group)
        self._flops_per_token /= self.dp * degree  # MFU per GPU: each does 1/(dp t) of the work

    # ---- the hooks of Trainer.train_step ------------------------------------------------------
    def _batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data.get_batch(split, self.cfg.batch_size, "cpu")  # the global batch
        x, y = x[self._rows], y[self._rows]
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (self._ddp or self.model)(x, y)

    def _mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        total = value.detach().clone()  # the TP ranks of a replica hold the same loss
        dist.all_reduce(total, group=self.group)
        return total / self.dp

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        if self.tp is not None:
            fsdp = self.group if self.mode == "fsdp" else None
            return tp_clip_grad_norm_(self.model, max_norm, self.tp.group, fsdp_group=fsdp)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # ---- checkpoints: the full model and optimizer, in the single-process format --------------
    def state_dict(self) -> dict[str, Any]:
        state = self.run_state()
        if self.mode == "ddp":  # every rank holds the whole (TP-local) model and optimizer
            model = model_state_dict(self.model)  # TE's FP8 state without pickle
            optim = self.optimizer.state_dict()
        else:
            model, optim = self._gather_fsdp()
        if self.tp is not None:  # then over TP: every rank of the replica has its shards now
            model, optim = gather_checkpoint(
                model, optim, self._param_order(), self.model.config, self.tp.group,
                self.tp.shard_map,
            )  # fmt: skip
            state["tensor_parallel"] = {"tp": self.tp.degree}
        state["model"], state["optimizer"] = model, optim
        state["data_parallel"] = {"dp": self.dp, "mode": self.mode}
        return state

    def _gather_fsdp(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """FSDP2's shards gathered over the data-parallel ranks (torch's full state dicts), the
        optimizer state keyed by parameter index again. Without TP only rank 0 keeps them (it
        alone writes); with TP every rank does (the TP gather needs them)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=self.tp is None)
        model = dict(get_model_state_dict(self.model, options=full))
        with keep_lazy_state(self.optimizer):
            optim: dict[str, Any] = dict(
                get_optimizer_state_dict(self.model, self.optimizer, options=full)
            )
        index = {name: i for i, name in enumerate(self._param_order())}
        return model, {
            "state": {index[k]: v for k, v in optim.get("state", {}).items()},
            "param_groups": [
                {**g, "params": [index[k] for k in g["params"]]}
                for g in optim.get("param_groups", [])
            ],
        }

    def _load_model_and_optimizer(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        if self.tp is not None:  # this rank's cut of the full state, for its shard map
            model, optimizer = shard_checkpoint(
                model, optimizer, self._param_order(), self.model.config, self.tp.shard_map,
                self.tp_rank,
            )  # fmt: skip
        if self.mode == "ddp":
            super()._load_model_and_optimizer(model, optimizer)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True)  # every rank read the whole file
        set_model_state_dict(self.model, model, options=full)
        order = self._param_order()
        optimizer = keep_implementation(optimizer, self.optimizer)
        by_name = {
            "state": {order[int(i)]: v for i, v in optimizer["state"].items()},
            "param_groups": [
                {**g, "params": [order[int(i)] for i in g["params"]]}
                for g in optimizer["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.model, self.optimizer, by_name, options=full)  # type: ignore[arg-type]

    def save(self, path: str | Path) -> Path:
        state = self.state_dict()  # every rank takes part in the gathers
        write = lambda: save_checkpoint(path, state)  # noqa: E731
        if self.tp is None:
            on_rank0(self.group, write)  # then the file exists
        else:  # the job's ranks only: TP rank 0 of replica 0 writes, then its column hears
            on_rank0_2d(self.group, self.tp.group, write)
        self.last_checkpoint = Path(path)
        return self.last_checkpoint


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


@contextlib.contextmanager
def keep_lazy_state(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """torch's ``get_*state_dict`` creates the state of an optimizer that has none by running
    an ``lr=0`` step (AdamW's step count becomes 1). Before the first step that would change
    the run that is being saved; this puts the optimizer back to having no state."""
    was_empty = not optimizer.state
    try:
        yield
    finally:
        if was_empty:
            optimizer.state.clear()


def memory_per_rank(trainer: Trainer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (a DTensor counts
    its local shard), read from the tensors themselves; with a GPU, also the allocator's peak."""

    def nbytes(t: torch.Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    params = list(trainer.model.parameters())
    optim = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {
        "parameters": sum(nbytes(p) for p in params),
        "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(nbytes(v) for v in optim if v.dim() > 0),  # not the step counters
    }
    if trainer.device.type == "cuda":
        out["peak_allocated"] = int(torch.cuda.max_memory_allocated(trainer.device))
    return out


def data_parallel_trainer(
    model_cfg: GPTConfig,
    data: TokenData,
    cfg: TrainConfig,
    dp: int,
    mode: str = "fsdp",
    device: str | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
) -> Trainer:
    """Under torchrun with ``dp`` processes: this rank's ``DPTrainer`` (``mesh.parallel_trainer``
    with ``tp=1``: the same seeded weights on every rank). Build ``data`` with the same seed
    everywhere."""
    from .mesh import parallel_trainer

    return parallel_trainer(
        model_cfg, data, cfg, dp, 1, mode, device=device, out_dir=out_dir, seed=seed
    )
