"""A run's checkpoint: one design in two forms, and one loader that reads either at any layout.

A checkpoint holds the model's state, the optimizer's, and the rest of the run (the Trainer's
``run_state``: step, configs, loss scaler, schedule, RNG, sampler, history). Its form follows
the layout (``ParallelDims.sharded``):

- **one file**, ``checkpoint.pt``, when one process holds the whole state: a single process, or
  DDP's replicas (rank 0 of the job writes it). ``save_checkpoint`` writes it atomically and
  ``load_checkpoint`` opens it without running code from it; the optimizer's state is
  ``optimizer.state_dict()``'s, keyed by parameter index.
- **a DCP directory**, ``checkpoint/``, when the state is split over ranks (FSDP2, tensor
  parallelism): every rank writes its own pieces of the full tensors with
  ``torch.distributed.checkpoint`` (``shards/``: ``.distcp`` files and a ``.metadata`` index of
  every piece's offsets), and rank 0 the run state (``run.pt``, with the SHA-256 of every shard
  file); nothing is gathered on one rank. It is written into a ``.tmp`` sibling, complete once
  its ``run.pt`` is there (written last); rank 0 then moves the previous checkpoint aside
  (``.old``), renames the new one into place and deletes the old one last. So at every instant
  one complete checkpoint exists under ``checkpoint``, ``.tmp`` or ``.old``, and ``settle``
  (before a save, and when a run starts) finishes an interrupted publication: the newest complete
  one becomes ``checkpoint``, and half-written ones go. A failed write on rank 0 raises on every
  rank.

Both forms are verified on load: a file against the checksum of its content (``files``), a
directory's ``run.pt`` likewise and each shard file against the SHA-256 that ``run.pt`` records.
A mismatch, a missing file or a truncated one is a ``CheckpointError`` naming the file.

``load_run`` reads either form into a model at any layout. It asks torch for this rank's view of
the state (``get_state_dict``, with TP's shards as pieces of the full tensors: ``dcp.dcp_view``)
and fills it: from a directory with ``dcp.load`` (each rank reads just the pieces it needs, from
whichever files hold them), from a file by copying each piece out of the full tensor. So a
dp 2 x tp 2 checkpoint resumes at dp 1 x tp 3, at dp 4 or in one process, and a file written in
one process resumes under any layout. A file loaded where one process holds the whole state
takes the plain path (``load_state_dict``), which restores Transformer Engine's FP8 state too.

Moving a run between ``fp8`` and ``te-fp8`` is a tool beside this one design:
``files.convert_checkpoint_file`` (``python -m tutorial_lib convert-checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..parallel.comm import on_rank0
from ..parallel.mesh import ParallelDims, parallel_of
from .dcp import SafeFileSystemReader, SafeLoadPlanner, dcp_view, fill_from_full
from .files import (
    REMEDY,
    CheckpointError,
    file_sha256,
    load_checkpoint,
    load_model_state_dict,
    model_state_dict,
    save_checkpoint,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "checkpoint_name",
    "keep_implementation",
    "load_run",
    "save_run",
    "settle",
]

CHECKPOINT_FORMAT = "tutorial_lib.checkpoint/2"  # what run_state writes and resume checks
# (2: checksums of the content, of every shard file, and of the data the run trained on)
RUN_FILE = "run.pt"  # a DCP checkpoint's run state
SHARDS = "shards"  # a DCP checkpoint's pieces


def checkpoint_name(dims: ParallelDims) -> str:
    """What a run with layout ``dims`` writes in its ``out_dir``: a file or a DCP directory."""
    return "checkpoint" if dims.sharded else "checkpoint.pt"


def save_run(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    run_state: dict[str, Any],
) -> Path:
    """Write the checkpoint of a run at ``model``'s layout (module docstring); every process of
    the run calls it. A file holds the run state, the model (Transformer Engine's FP8 state as
    plain data: ``model_state_dict``) and the optimizer."""
    path, dims = Path(path), parallel_of(model)
    if not dims.sharded:
        state = {**run_state, "model": model_state_dict(model), "optimizer": optimizer.state_dict()}
        on_rank0(dims.job, lambda: save_checkpoint(path, state))
        return path
    tmp = _sibling(path, "tmp")
    on_rank0(dims.job, lambda: settle(path))  # a crash's half-written .tmp goes, nothing good
    with keep_lazy_state(optimizer):
        model_sd, optim_sd = get_state_dict(model, optimizer)
    with _single_process_is_intended(), _dcp_errors(tmp):
        dcp.save(
            dcp_view(dims, model.config, model_sd, optim_sd),  # type: ignore[arg-type]
            checkpoint_id=tmp / SHARDS,
            process_group=dims.job,
            no_dist=not dist.is_initialized(),
        )

    def publish() -> None:
        files = {f.name: file_sha256(f) for f in sorted((tmp / SHARDS).iterdir())}
        save_checkpoint(tmp / RUN_FILE, {**run_state, "sharded": True, "files": files})
        _publish(path)  # tmp is complete: it takes the checkpoint's name

    on_rank0(dims.job, publish)
    return path


def _sibling(path: Path, kind: str) -> Path:
    return path.with_name(f"{path.name}.{kind}")


def _complete(directory: Path) -> bool:
    """A DCP checkpoint directory is complete once its ``run.pt`` (written last) is there."""
    return (directory / RUN_FILE).is_file()


def _publish(path: Path) -> None:
    """Move the complete ``path.tmp`` to ``path``: the current checkpoint (if any) goes aside
    to ``path.old`` first and is deleted last, so a crash at any point leaves a complete one."""
    tmp, old = _sibling(path, "tmp"), _sibling(path, "old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)  # older than path, which is complete
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def settle(path: str | Path) -> list[str]:
    """Finish what a crash interrupted at the DCP checkpoint ``path`` (rank 0, while no save is
    running): a complete ``.tmp`` is the newest checkpoint and is published if its files verify
    (else it is set aside as ``.damaged``), a complete ``.old`` takes the name if nothing else has
    it, half-written ones are deleted. Returns what was done, in words (nothing if nothing)."""
    path = Path(path)
    tmp, old = _sibling(path, "tmp"), _sibling(path, "old")
    done = []
    if tmp.is_dir() and _complete(tmp):
        try:
            verify_files(tmp)  # a crash's checkpoint replaces the last good one only if intact
        except CheckpointError as err:
            damaged = _sibling(path, "damaged")
            shutil.rmtree(damaged, ignore_errors=True)
            os.replace(tmp, damaged)
            done.append(f"set {tmp.name} aside as {damaged.name}, kept for inspection: {err}")
        else:
            _publish(path)
            done.append(f"recovered {tmp.name}, the complete checkpoint of an interrupted save")
    elif tmp.exists():
        shutil.rmtree(tmp)
        done.append(f"deleted {tmp.name}, the half-written checkpoint of an interrupted save")
    if old.is_dir() and _complete(old) and not path.exists():
        os.replace(old, path)
        done.append(f"recovered {old.name}, the previous checkpoint of an interrupted save")
    elif old.exists():
        shutil.rmtree(old)
    return done


def verify_files(path: Path) -> dict[str, Any]:
    """The run state of the DCP checkpoint ``path``, after checking every file of it against the
    SHA-256 its ``run.pt`` records; ``CheckpointError`` on a missing, extra or changed file."""
    run = load_checkpoint(path / RUN_FILE)
    recorded = run.get("files")
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{path / RUN_FILE} records no checksums of its shard files.")
    present = {f.name for f in (path / SHARDS).iterdir()} if (path / SHARDS).is_dir() else set()
    for name in sorted(set(recorded) | present):
        where = path / SHARDS / name
        problem = (
            "is missing"
            if name not in present
            else "is not part of the checkpoint"
            if name not in recorded
            else "is corrupt (its SHA-256 differs from the one recorded when it was written)"
            if file_sha256(where) != recorded[name]
            else None
        )
        if problem:
            raise CheckpointError(f"{where} {problem}. {REMEDY}")
    return run


@contextlib.contextmanager
def _dcp_errors(path: Path) -> Iterator[None]:
    """DCP's ``CheckpointException`` (one traceback per failed rank) as one ``CheckpointError``."""
    try:
        yield
    except dcp.api.CheckpointException as exc:
        failures = list(getattr(exc, "failures", {}).values())
        first = failures[0] if failures else exc
        cause = first[0] if isinstance(first, tuple) else first  # (exception, traceback)
        if isinstance(cause, OSError):  # a full disk, a permission: its errno names the fix
            raise cause from None
        raise CheckpointError(
            f"{path}: {type(cause).__name__}: {str(cause).strip().splitlines()[0]}"
        ) from None


def load_run(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    check: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Restore ``model`` and ``optimizer`` from a checkpoint of either form, at ``model``'s
    layout; returns the run state. ``check(run_state)`` runs first and raises if the checkpoint
    does not fit (another model, another precision)."""
    path, dims = Path(path), parallel_of(model)
    if path.is_dir():
        if not (path / RUN_FILE).is_file() or not (path / SHARDS).is_dir():
            raise FileNotFoundError(
                f"{path} is not a sharded checkpoint: expected {RUN_FILE} and {SHARDS}/ in it "
                "(written by a run that shards its state: FSDP2 or tensor parallelism)."
            )
        run = load_checkpoint(path / RUN_FILE)
        check(run)
        on_rank0(dims.job, lambda: verify_files(path), doing="verify the checkpoint")
        reader = SafeFileSystemReader(path / SHARDS)
        reader.read_metadata()  # a refused metadata file raises here, before DCP wraps it
        view, model_sd, optim_sd = _view(model, optimizer, dims)
        with _single_process_is_intended(), _dcp_errors(path):
            dcp.load(  # into model_sd and optim_sd (through the views of TP's pieces)
                view,
                storage_reader=reader,
                planner=SafeLoadPlanner(),
                process_group=dims.job,
                no_dist=not dist.is_initialized(),
            )
        _set(model, optimizer, model_sd, optim_sd)
        return run
    state = load_checkpoint(path)
    check(state)
    if not dims.sharded:  # one process holds it all: the plain path
        load_model_state_dict(model, state["model"])
        optimizer.load_state_dict(keep_implementation(state["optimizer"], optimizer))
        return state
    view, model_sd, optim_sd = _view(model, optimizer, dims)
    # parameter names in the optimizer's index order (its groups, in order): the same in every
    # process and at every layout, so they map the file's optimizer state to names
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]
    saved = state["optimizer"]
    by_name = {  # the file keys the optimizer state by index, the view by parameter name
        "state": {names[int(i)]: s for i, s in saved["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in saved["param_groups"]
        ],
    }
    fill_from_full(view, {"model": state["model"], "optim": by_name})  # in place
    _set(model, optimizer, model_sd, {**optim_sd, "param_groups": by_name["param_groups"]})
    return state


def _view(
    model: nn.Module, optimizer: torch.optim.Optimizer, dims: ParallelDims
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the DCP view, the model's and the optimizer's state dicts it is a view of)."""
    with keep_lazy_state(optimizer):  # (the Trainer clears it again at step 0)
        model_sd, optim_sd = get_state_dict(model, optimizer)
    return dcp_view(dims, model.config, model_sd, optim_sd), model_sd, optim_sd  # type: ignore[arg-type]


def _set(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_sd: dict[str, Any],
    optim_sd: dict[str, Any],
) -> None:
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_sd,
        optim_state_dict=keep_implementation(optim_sd, optimizer),
    )


# AdamW's settings that choose a kernel, not the math: a checkpoint written where the fused kernel
# ran (or could not) must not switch the kernel of the process that resumes it.
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


def keep_implementation(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``saved`` (an optimizer state dict) with each param group's kernel choice (``fused``,
    ``foreach``, ...) taken from ``optimizer``, so a run resumed on another layout or device
    keeps the kernel it can run; the hyperparameters and state come from ``saved``."""
    groups = [
        {**g, **{k: mine[k] for k in _IMPLEMENTATION_KEYS if k in mine}}
        for g, mine in zip(saved["param_groups"], optimizer.param_groups, strict=False)
    ]
    return {**saved, "param_groups": groups}


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


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """DCP warns whenever it runs without a process group; here that is a choice."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield
