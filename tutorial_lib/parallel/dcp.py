"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), safe to open, that reshard.

``save_sharded(trainer, directory)`` has every rank write its own shards of the model and the
optimizer state (DCP's ``.distcp`` files plus a ``.metadata`` index that records each tensor's
global shape and which file holds which piece); nothing is gathered on one rank. The rest of the
run's state (``Trainer.run_state``: step, configs, schedule, sampler, RNG, history) goes into
``directory/run.pt``, written by rank 0 with ``save_checkpoint``. Everything is written into a
temporary sibling (``.tmp``) that rank 0 renames into place at the end, after moving the previous
checkpoint aside (``.old``, deleted last), so a crash never leaves a half-written directory under
the checkpoint's name. A failed write on rank 0 raises on every rank.

``load_sharded(trainer, directory)`` works at any layout: the trainer's own state dict (from
``get_state_dict``: DTensor shards under FSDP2, plain tensors in one process) says which pieces
this rank needs, and DCP reads just those from whichever files hold them. So a dp 2 run resumes
at dp 4, dp 1, or in a single process without any process group.

Safety. DCP's own reader unpickles ``.metadata`` with ``pickle.load`` and its default planner
loads non-tensor values (the optimizer's hyperparameters) with ``torch.load(weights_only=False)``;
a crafted checkpoint could run code through either. Here ``SafeFileSystemReader`` unpickles the
metadata with an allowlist of the classes DCP's metadata is made of (and refuses anything else
with ``CheckpointError``), and ``SafeLoadPlanner`` loads values with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..train import Trainer, keep_implementation
from .dp import keep_lazy_state, on_rank0

__all__ = ["SafeFileSystemReader", "SafeLoadPlanner", "load_sharded", "save_sharded"]

RUN_FILE = "run.pt"
SHARDS = "shards"
_METADATA_CLASSES = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
} | {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    )
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: the allowlisted classes and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"The checkpoint's DCP metadata names {module}.{name}, which DCP metadata never "
            "holds; refusing to unpickle it (it could run code). Only open checkpoints you wrote."
        )


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with the metadata unpickled through an allowlist (module docstring)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} is not DCP metadata (got {type(metadata).__name__}).")
        for info in (metadata.storage_data or {}).values():
            where = Path(str(getattr(info, "relative_path", "")))
            if where.is_absolute() or ".." in where.parts or len(where.parts) != 1:
                raise CheckpointError(
                    f"{path} points a shard at {str(where)!r}, outside the checkpoint's "
                    "directory; refusing to read it."
                )
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, loading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointError(
                f"Refusing to load {read_item.dest_index.fqn!r} from the checkpoint: {err}"
            ) from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes stores it
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """DCP warns whenever it runs without a process group; here that is a choice."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _group(trainer: Trainer) -> Any:
    """The ranks that share the trainer's checkpoint (a data-parallel group, else all)."""
    return getattr(trainer, "group", None) if dist.is_initialized() else None


def _on_rank0(group: Any, write: Any) -> None:
    """``write()`` on rank 0 of the group (``dp.on_rank0``: a failure raises on every rank); in
    one process, just ``write()``."""
    if dist.is_initialized():
        on_rank0(group if group is not None else dist.group.WORLD, write)
    else:
        write()


def _refuse_tensor_parallel(trainer: Trainer) -> None:
    """Our TP shards are plain tensors (uneven, any heads per rank): DCP would read the same
    name on every TP rank as one replicated tensor and keep one rank's shard."""
    if getattr(trainer, "tp", None) is not None or hasattr(trainer, "shard_map"):
        raise ValueError(
            "Sharded (DCP) checkpoints of a tensor-parallel run are not supported: its shards "
            "are plain tensors of different shapes under the same names, which DCP would take "
            "for one replicated tensor. Use trainer.save(path): the single-process format, "
            "gathered over TP, resumes at any layout."
        )


def save_sharded(trainer: Trainer, directory: str | Path) -> Path:
    """Write ``trainer``'s checkpoint as ``directory`` (module docstring); every rank calls it."""
    _refuse_tensor_parallel(trainer)
    directory, group = Path(directory), _group(trainer)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")

    def clear_tmp() -> None:
        if tmp.exists():
            shutil.rmtree(tmp)  # a save that died halfway

    _on_rank0(group, clear_tmp)
    with keep_lazy_state(trainer.optimizer):
        model, optim = get_state_dict(trainer.model, trainer.optimizer)
    with _single_process_is_intended():
        dcp.save(
            {"model": model, "optim": optim},
            checkpoint_id=tmp / SHARDS,
            process_group=group,
            no_dist=not dist.is_initialized(),
        )
    run_state = trainer.run_state()

    def publish() -> None:
        save_checkpoint(tmp / RUN_FILE, run_state)
        # the previous checkpoint moves aside first and goes only once the new one is in place
        if old.exists():
            shutil.rmtree(old)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)

    _on_rank0(group, publish)
    trainer.last_checkpoint = directory
    return directory


def load_sharded(trainer: Trainer, directory: str | Path) -> None:
    """Restore ``trainer`` from a ``save_sharded`` directory, at this run's layout."""
    _refuse_tensor_parallel(trainer)
    directory = Path(directory)
    if not (directory / RUN_FILE).is_file() or not (directory / SHARDS).is_dir():
        raise FileNotFoundError(
            f"{directory} is not a sharded checkpoint: expected {RUN_FILE} and {SHARDS}/ in it "
            "(written by tutorial_lib.parallel.dcp.save_sharded)."
        )
    run = load_checkpoint(directory / RUN_FILE)
    trainer.check_compatible(run)
    reader = SafeFileSystemReader(directory / SHARDS)
    reader.read_metadata()  # a refused metadata file raises here, before DCP wraps the error
    with keep_lazy_state(trainer.optimizer):  # (load_run_state clears it again at step 0)
        model, optim = get_state_dict(trainer.model, trainer.optimizer)  # this rank's pieces
    state: dict[str, Any] = {"model": model, "optim": optim}
    with _single_process_is_intended():
        dcp.load(
            state,
            storage_reader=reader,
            planner=SafeLoadPlanner(),
            process_group=_group(trainer),
            no_dist=not dist.is_initialized(),
        )
    optim = keep_implementation(state["optim"], trainer.optimizer)
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=optim,
    )
    trainer.load_run_state(run)
    trainer.last_checkpoint = directory
