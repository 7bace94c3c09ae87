"""Spawned workers only the tests run (the chapters' are ``tutorial_lib.jobs``): checks of the
tensor-parallel operators and layers, TP training steps, DTensor's TP under FSDP2, FP8 under DDP,
and what failures look like. ``spawn`` unpickles a worker in the rank after taking the caller's
``sys.path``, so workers from this folder run like the package's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8 import DelayedScaling, autocast, convert_to_fp8
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.jobs.dp_workers import DPRun
from tutorial_lib.model import GPT
from tutorial_lib.parallel import comm
from tutorial_lib.parallel.comm import Group, group_rank, on_rank0
from tutorial_lib.parallel.dtensor_tp import dtensor_parallelize
from tutorial_lib.parallel.mesh import ParallelDims
from tutorial_lib.parallel.shard import ShardMap, UnitSpec, global_index
from tutorial_lib.parallel.tp_linear import ColumnParallelLinear, RowParallelLinear
from tutorial_lib.parallel.tp_model import TPSpec, gather_full, parallelize
from tutorial_lib.train import TrainConfig, Trainer


def reduce_scatter_paths(group: Group, shape: tuple[int, ...], dim: int = 1) -> dict[str, Any]:
    """Both of ``comm``'s reduce-scatter paths on a rank-dependent input: ``dist.reduce_scatter``
    and the all-reduce + slice fallback for gloo builds without one (its private helpers: this
    is their test)."""
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    x = x * (group_rank(group) + 1)
    return {
        "reduce_scatter": comm._reduce_scatter(x, group, dim),
        "by_all_reduce": comm._reduce_scatter_by_all_reduce(x, group, dim),
    }


def dp_refusals_worker(rank: int, world_size: int, run: DPRun) -> dict[str, str]:
    """What goes wrong on purpose, on every rank: a checkpoint write that fails on rank 0 (every
    rank must raise, not wait), and FP8 on a group of fewer than all processes (refused)."""
    out = {}

    def fails() -> None:
        raise OSError("disk full (on purpose)")

    try:
        on_rank0(dist.group.WORLD, fails)
    except (RuntimeError, OSError) as err:  # rank 0 raises its own error, the others name it
        out["write"] = f"{type(err).__name__}: {err}"
    solo = dist.new_group([0])
    if rank == 0:
        try:
            dims = ParallelDims(solo, "ddp")
            build_model(run.model, precision="fp8", parallel=dims, device="cpu", seed=run.seed)
        except ValueError as err:
            out["fp8"] = str(err)
    dist.barrier()
    return out


def vocab_and_region_check(group: Group, n_tokens: int, vocab: int) -> dict[str, Any]:
    """The vocabulary-parallel loss and embedding on this rank's rows of the same float64
    logits, weight and ids on every rank (uneven splits: ``split_evenly``), and the two
    operators that open and close the sequence-parallel region: outputs and input gradients."""
    from tutorial_lib.parallel.shard import split_evenly
    from tutorial_lib.parallel.vocab import vocab_parallel_cross_entropy, vocab_parallel_embedding

    r, n = group_rank(group), dist.get_world_size(group)
    rows = split_evenly(vocab, n)[r]
    start, end = rows[0], rows[-1] + 1
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n_tokens, vocab, dtype=torch.float64, generator=gen) * 3
    targets = torch.randint(0, vocab, (n_tokens,), generator=gen)
    weight = torch.randn(vocab, 8, dtype=torch.float64, generator=gen)
    idx = torch.randint(0, vocab, (3, n_tokens), generator=gen)
    mine = logits[:, start:end].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(mine, targets, start, group)
    loss.backward()
    w = weight[start:end].clone().requires_grad_()
    emb = vocab_parallel_embedding(idx, w, start, group)
    emb.backward(torch.ones_like(emb))
    x = torch.arange(2 * 6 * 4, dtype=torch.float64).reshape(2, 6, 4).requires_grad_()
    piece = comm.split_to_sp(x, group, dim=1)
    piece.backward(torch.full_like(piece, float(r + 1)))
    z = torch.arange(2 * 2 * 4, dtype=torch.float64).reshape(2, 2, 4) + 10.0 * r
    z.requires_grad_()
    full = comm.gather_from_sp(z, group, dim=1, partial_grad=False)
    full.backward(torch.arange(full.numel(), dtype=torch.float64).reshape(full.shape))
    return {
        "range": (start, end),
        "loss": loss.detach(),
        "dlogits": mine.grad,
        "embedding": emb.detach(),
        "dweight": w.grad,
        "split": piece.detach(),
        "dsplit": x.grad,
        "gathered": full.detach(),
        "dgathered": z.grad,
    }


def sp_generation_check(group: Group, cfg: Any, lengths: Sequence[int]) -> list[float]:
    """A sequence- and vocabulary-parallel ``TPGPT`` without targets, at sequence lengths that
    do not split over the ranks (generation's): the largest difference of its logits from the
    full model's, per length."""
    torch.manual_seed(0)
    full = GPT(cfg)
    n = dist.get_world_size(group)
    tp_model = parallelize(
        full, group, ShardMap.even(cfg, n, vocab_parallel=True), sequence_parallel=True
    )
    out = []
    with torch.no_grad():
        for T in lengths:
            idx = torch.randint(
                0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(T)
            )
            got, _ = tp_model(idx)
            want, _ = full(idx)
            out.append(float((got - want).abs().max()))
    return out


def parallel_linear_check(
    group: Group,
    kind: str,
    spec: UnitSpec,
    units: Sequence[Sequence[int]],
    full: nn.Linear,
    x: torch.Tensor,
    dy: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """A ``ColumnParallelLinear`` (kind "column") or ``RowParallelLinear`` ("row") cut from
    ``full`` by ``units[rank]``: forward on ``x`` (its shard, for a row layer), backward with
    ``dy`` (its shard, for a column layer). Local output and gradients, and the shard index."""
    r, total = group_rank(group), sum(len(u) for u in units)
    index = global_index(spec, units[r], total)
    bias = full.bias is not None
    layer: ColumnParallelLinear | RowParallelLinear
    b: torch.Tensor | None
    if kind == "column":
        layer = ColumnParallelLinear(
            full.in_features, full.out_features, bias, group, spec, tuple(units[r]), total
        )
        weight, b = full.weight.index_select(0, index), full.bias
        b = None if b is None else b.index_select(0, index)
        x, dy = x.clone(), dy.index_select(-1, index)
    else:
        layer = RowParallelLinear(
            full.in_features, full.out_features, bias, group, spec, tuple(units[r]), total
        )
        weight, b = full.weight.index_select(1, index), full.bias
        x = x.index_select(-1, index)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if b is not None:
            if layer.bias is None:  # cannot happen: the layer has a bias iff ``full`` has one
                raise RuntimeError(f"parallel_linear_check: the {kind} layer has no bias.")
            layer.bias.copy_(b)
    x.requires_grad_()
    y = layer(x)
    y.backward(dy)
    return {
        "y": y.detach(),
        "dW": layer.weight.grad,
        "dx": x.grad,
        "index": index,
        "db": None if layer.bias is None else layer.bias.grad,
    }


def tp_train_steps(
    group: Group,
    cfg: GPTConfig,
    shard_map: ShardMap,
    state_dict: dict[str, torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor, int, int],
    train_cfg: TrainConfig,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """``train_cfg.steps`` steps of a tensor-parallel ``Trainer`` from ``state_dict`` on
    ``TokenData(*data)``, with parameters in ``dtype``: the history and the gathered full state
    dict at the end."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the model and the TP layers parallelize builds
    try:
        dims = ParallelDims(tp=TPSpec(group, shard_map))
        model = build_model(cfg, weights=state_dict, parallel=dims, device="cpu")
        trainer = Trainer(model, TokenData(*data), train_cfg, device="cpu")
        history = trainer.train()
    finally:
        torch.set_default_dtype(default)
    full = gather_full(model.state_dict(), cfg, group, shard_map)
    return {"history": history, "state_dict": full}


SGD_LR, SGD_BATCH = 0.1, 4


def _sgd_batches(cfg: GPTConfig, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    shape = (SGD_BATCH, cfg.block_size)
    return [
        (
            torch.randint(0, cfg.vocab_size, shape, generator=gen),
            torch.randint(0, cfg.vocab_size, shape, generator=gen),
        )
        for _ in range(steps)
    ]


def sgd_losses(cfg: GPTConfig, steps: int) -> list[float]:
    """One process: ``steps`` plain SGD steps of the seeded GPT on ``_sgd_batches``; the losses."""
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    losses = []
    for x, y in _sgd_batches(cfg, steps):
        _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def dtensor_fsdp_losses(
    groups: tuple[Group, Group, Group], cfg: GPTConfig, steps: int
) -> list[float]:
    """2D, as torchtitan composes them: dp x tp on the job's processes, DTensor TP
    (``dtensor_parallelize``) over the ``tp`` dimension of a 2D ``DeviceMesh``, FSDP2 over its
    ``dp`` dimension (each parameter a DTensor sharded over both), each data-parallel rank on its
    rows of the global batch; the same SGD steps as ``sgd_losses``, whose losses (the mean over
    the data-parallel ranks) it returns. ``groups``: (data-parallel, tensor-parallel, whole
    job), as ``workers.run_jobs`` hands a job with ``mesh_tp``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    dp_group, tp_group, job = groups
    ranks = dist.get_process_group_ranks(job)
    tp = dist.get_world_size(tp_group)
    dp = len(ranks) // tp
    mesh = DeviceMesh.from_group(
        [dp_group, tp_group], "cpu", mesh=torch.tensor(ranks).view(dp, tp),
        mesh_dim_names=("dp", "tp"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = dtensor_parallelize(GPT(cfg), mesh["tp"])
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    d = dist.get_rank(dp_group)
    rows = slice(d * SGD_BATCH // dp, (d + 1) * SGD_BATCH // dp)
    losses = []
    for x, y in _sgd_batches(cfg, steps):
        _, loss = model(x[rows], y[rows])
        assert loss is not None
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)
        losses.append(float(total) / dp)
    return losses


dtensor_fsdp_losses.mesh_tp = lambda *args: 2  # type: ignore[attr-defined]  # run_jobs: tp 2


def fp8_ddp_steps(
    rank: int,
    world_size: int,
    amaxes: Sequence[Sequence[float]],
    cases: dict[str, tuple[bool, bool]],
) -> dict[str, dict[str, list[float]]]:
    """Per case ``name: (reduce_amax, exclude)``: FP8 steps of one ``FP8Linear`` (16 -> 16,
    history 4) under ``DistributedDataParallel`` with its defaults (``broadcast_buffers=True``).
    Step s feeds this rank a batch whose amax is ``amaxes[rank][s]``. ``exclude=False`` empties
    the DDP ignore list that ``convert_to_fp8`` fills (``fp8.ddp``), as for a model without that
    handling. Returns the input column of the forward history, the input scale at the end, and
    the input scale each forward pass quantized with."""
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for name, (reduce_amax, exclude) in cases.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 16))
        convert_to_fp8(model, amax_history_len=4)
        if not exclude:
            setattr(model, "_ddp_params_and_buffers_to_ignore", [])  # noqa: B010
        layer = model[0]
        assert isinstance(layer, FP8Linear)
        used: list[float] = []  # read after DDP's broadcast, before the layer quantizes
        layer.register_forward_pre_hook(
            lambda m, args, layer=layer, used=used: used.append(
                layer.fp8_state.forward.scale[0].item()
            )
        )
        ddp = DistributedDataParallel(model)
        recipe = DelayedScaling(amax_history_len=4, reduce_amax=reduce_amax)
        for amax in amaxes[rank]:
            with autocast(recipe=recipe):
                y = ddp(torch.full((8, 16), float(amax)))
            y.sum().backward()
        out[name] = {
            "history": layer.fp8_state.forward.amax_history[:, 0].tolist(),
            "scale": [layer.fp8_state.forward.scale[0].item()],
            "scale_used": used,
        }
    return out


def raise_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Return ``rank``, except on ``bad_rank``, which raises: what a failing worker looks like.
    The barrier first: a rank that returned at once could leave the group while another was
    still connecting to it, which then fails with gloo's error instead of its own."""
    dist.barrier()
    if rank == bad_rank:
        raise RuntimeError(f"rank {rank} of {world_size} fails on purpose")
    return rank
