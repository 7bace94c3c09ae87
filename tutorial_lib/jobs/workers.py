"""Functions that run on every rank of a ``launch.spawn`` group: the chapter's and the tests'.

They live in the package because ``spawn`` starts fresh interpreters that import a worker by
name. Workers called by ``spawn`` take ``(rank, world_size, *args)``; the ``*_check`` and
``tp_*`` functions take a process group first, so ``run_jobs`` can run several of them, on
different groups of ranks, in one spawn (starting processes costs seconds; a check, millis).
Results come back to the parent, so keep them small: tensors, numbers, strings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..build import build_model
from ..config import GPTConfig
from ..data import TokenData
from ..fp8 import DelayedScaling, FP8Linear, autocast, convert_to_fp8
from ..model import GPT
from ..parallel import comm
from ..parallel.comm import Group, group_rank, group_size
from ..parallel.mesh import ParallelDims
from ..parallel.shard import ShardMap, UnitSpec, global_index
from ..parallel.tp_linear import ColumnParallelLinear, RowParallelLinear
from ..parallel.tp_model import TPSpec, gather_full, gather_full_state_dict, parallelize
from ..train import TrainConfig, Trainer

__all__ = [
    "run_jobs",
    "tp_forward_backward",
    "tp_forward_backward_worker",
    "operators_check",
    "parallel_linear_check",
    "tp_train_steps",
    "fp8_ddp_steps",
    "raise_on_rank",
    "vocab_and_region_check",
    "tp_trace_step",
    "sp_generation_check",
]

# One job for run_jobs: (ranks, fn, args).
WorkerJob = tuple[Sequence[int], Callable[..., Any], tuple[Any, ...]]


def run_jobs(rank: int, world_size: int, jobs: Sequence[WorkerJob]) -> list[Any]:
    """Run ``fn(group, *args)`` for each job ``(ranks, fn, args)`` whose ranks include this one
    (None for the others). All groups are made first, by every rank in the same order, as
    ``dist.new_group`` requires; jobs on disjoint ranks then run side by side. A job whose
    ``fn`` has a ``mesh_tp`` attribute (``dp_workers.mesh_job``) gets the (data-parallel,
    tensor-parallel, whole-job) groups of a mesh on its ranks instead (``mesh.groups_2d``)."""
    from ..parallel.mesh import groups_2d

    groups: list[Any] = []
    for ranks, fn, args in jobs:
        mesh_tp = getattr(fn, "mesh_tp", None)
        if mesh_tp is None:
            groups.append(dist.new_group(list(ranks)))
        else:
            tp = mesh_tp(*args)
            groups.append(groups_2d(len(ranks) // tp, tp, ranks))
    return [
        fn(group, *args) if rank in ranks else None
        for (ranks, fn, args), group in zip(jobs, groups, strict=True)
    ]


def tp_forward_backward(
    group: Group,
    cfg: GPTConfig,
    shard_map: ShardMap,
    batch: tuple[torch.Tensor, torch.Tensor],
    state_dict: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """One forward and backward of ``GPT(cfg)`` with ``state_dict``, tensor-parallel over
    ``group``: logits, loss, the gathered full gradients and state dict, and local shapes."""
    model = GPT(cfg)
    model.load_state_dict(state_dict)
    tp_model = parallelize(model, group, shard_map)
    x, y = batch
    logits, loss = tp_model(x, y)
    loss.backward()
    grads: dict[str, torch.Tensor] = {}
    for n, p in tp_model.named_parameters():
        if p.grad is None:
            raise RuntimeError(f"tp_forward_backward: parameter {n!r} got no gradient.")
        grads[n] = p.grad
    return {
        "rank": group_rank(group),
        "logits": logits.detach(),
        "loss": loss.detach(),
        "grads": gather_full(grads, cfg, group, shard_map),
        "state_dict": gather_full(tp_model.state_dict(), cfg, group, shard_map),
        "local_shapes": {n: tuple(p.shape) for n, p in tp_model.named_parameters()},
    }


def tp_forward_backward_worker(
    rank: int,
    world_size: int,
    cfg: GPTConfig,
    shard_map: ShardMap,
    batch: tuple[torch.Tensor, torch.Tensor],
    state_dict: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """``tp_forward_backward`` over all ``world_size`` spawned ranks (TP degree = world size)."""
    return tp_forward_backward(dist.group.WORLD, cfg, shard_map, batch, state_dict)


def operators_check(group: Group, shape: tuple[int, ...], dim: int = 1) -> dict[str, Any]:
    """Each of Megatron's operators on a rank-dependent input with a rank-dependent output
    gradient: per operator, the input, the output, the output gradient and the input gradient.
    Also both reduce-scatter paths (``dist.reduce_scatter`` and all-reduce + narrow), and the
    error for a sequence that does not split evenly."""
    r = group_rank(group)
    numel = torch.Size(shape).numel()
    out: dict[str, Any] = {}
    ops = {
        "copy": comm.copy_to_tp,
        "reduce": comm.reduce_from_tp,
        "gather": lambda t, g: comm.gather_from_sp(t, g, dim),
        "scatter": lambda t, g: comm.scatter_to_sp(t, g, dim),
    }
    for name, op in ops.items():
        x = (torch.arange(numel, dtype=torch.float64).reshape(shape) + 100.0 * r).requires_grad_()
        y = op(x, group)
        dy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
        y.backward(dy)
        out[name] = {"x": x.detach(), "y": y.detach(), "dy": dy, "dx": x.grad}
    x = torch.arange(numel, dtype=torch.float64).reshape(shape) * (r + 1)
    out["reduce_scatter"] = comm._reduce_scatter(x, group, dim)
    out["reduce_scatter_by_all_reduce"] = comm._reduce_scatter_by_all_reduce(x, group, dim)
    try:  # a sequence the ranks cannot share equally
        comm.scatter_to_sp(torch.cat([x, x.narrow(dim, 0, 1)], dim), group, dim)
    except ValueError as exc:
        out["uneven_error"] = str(exc)
    return out


def vocab_and_region_check(group: Group, n_tokens: int, vocab: int) -> dict[str, Any]:
    """The vocabulary-parallel loss and embedding on this rank's rows of the same float64
    logits, weight and ids on every rank (uneven splits: ``split_evenly``), and the two
    operators that open and close the sequence-parallel region: outputs and input gradients."""
    from ..parallel.shard import split_evenly
    from ..parallel.vocab import vocab_parallel_cross_entropy, vocab_parallel_embedding

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
    from ..model import GPT

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
    return {"history": history, "state_dict": gather_full_state_dict(model, group, shard_map)}


def tp_trace_step(
    group: Group,
    cfg: GPTConfig,
    data: tuple[torch.Tensor, torch.Tensor, int, int],
    train_cfg: TrainConfig,
    path: str,
) -> dict[str, Any] | None:
    """One tensor-parallel ``Trainer`` step (after one warm-up step) traced on TP rank 0 (``perf.record_trace``
    to ``path``); the other ranks run the same steps untraced. Rank 0 returns the
    ``trace_summary`` of its trace, the others None."""
    from ..perf import load_trace, record_trace, trace_summary

    dims = ParallelDims(tp=TPSpec(group, ShardMap.even(cfg, group_size(group))))
    model = build_model(cfg, parallel=dims, device="cpu", seed=0)
    trainer = Trainer(model, TokenData(*data), train_cfg, device="cpu")
    if group_rank(group) != 0:
        trainer.train_step()
        trainer.train_step()
        return None
    record_trace(trainer.train_step, path, warmup=1, steps=1, device="cpu")
    return trace_summary(load_trace(path))


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
