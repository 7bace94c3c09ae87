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

Tensor parallelism. Our TP shards are plain tensors of different shapes under the same names
(uneven heads, Q, K and V rows of a rank's heads apart in the full ``qkv``), which DCP would take
for one replicated tensor. So each sharded entry (the parameter and AdamW's moments) is handed to
DCP as what it is: a few rectangular pieces of the *full* tensor, each with its offsets there
(``tp_chunks``: the runs of consecutive indices of ``shard.global_index``, cut again by FSDP2's
rows under 2D), as a ``Pieces`` tensor: views of this rank's tensors, and the three methods
through which DCP asks DTensor for its chunks.
DCP records every piece's offsets in the metadata and, on load, reads for each piece this rank
needs the overlapping parts of whichever pieces were saved. Saved at dp 2 x tp 2, a checkpoint
resumes at dp 1 x tp 3 (2, 1, 1 heads), at tp 1, or in one process; nothing is gathered.

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
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorProperties
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..config import GPTConfig
from ..train import Trainer, keep_implementation
from .dp import keep_lazy_state, on_rank0
from .shard import ShardMap, global_index, param_spec, rank_units, unit_specs

__all__ = [
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "load_sharded",
    "save_sharded",
    "use_sharded_checkpoints",
    "SHARDED_NAME",
    "Pieces",
    "tp_chunks",
]

RUN_FILE = "run.pt"
SHARDED_NAME = "checkpoint"  # what train() writes to its out_dir after use_sharded_checkpoints
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
    """The ranks that share the trainer's checkpoint: every process of its job (``job_group``:
    data- and tensor-parallel), else its group, else all."""
    if not dist.is_initialized():
        return None
    job = getattr(trainer, "job_group", None)
    return job if job is not None else getattr(trainer, "group", None)


def _on_rank0(group: Any, write: Any) -> None:
    """``write()`` on rank 0 of the group (``dp.on_rank0``: a failure raises on every rank); in
    one process, just ``write()``."""
    if dist.is_initialized():
        on_rank0(group if group is not None else dist.group.WORLD, write)
    else:
        write()


def tp_runs(index: list[int]) -> list[tuple[int, int, int]]:
    """``(start in the shard, start in the full tensor, length)`` of each run of consecutive
    full-tensor indices in ``index`` (a shard's ``global_index``)."""
    runs, start = [], 0
    for i in range(1, len(index) + 1):
        if i == len(index) or index[i] != index[i - 1] + 1:
            runs.append((start, index[start], i - start))
            start = i
    return runs


def tp_chunks(
    name: str, tensor: torch.Tensor, cfg: GPTConfig, shard_map: ShardMap, rank: int
) -> torch.Tensor | None:
    """TP rank ``rank``'s ``tensor`` (a parameter ``name`` or one of its AdamW moments) as DCP
    should see it: ``Pieces``, views of its pieces at their offsets in the full tensor;
    ``tensor`` itself if it is replicated over TP; None if this rank holds none of it (FSDP2 may
    leave a rank no rows). A DTensor (FSDP2's rows of the TP shard) keeps only its own rows."""
    spec = param_spec(name, unit_specs(cfg), shard_map)
    if spec is None:
        return tensor
    from torch.distributed.tensor import DTensor

    local, row0 = tensor, 0
    if isinstance(tensor, DTensor):  # FSDP2: rows [row0, row0 + len) of the TP shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements
        )
        local, row0 = tensor.to_local(), int(offset[0])
    units, total = rank_units(shard_map, spec, rank)
    full = list(tensor.shape)
    full[spec.dim] = spec.groups * total * spec.width
    pieces = []
    for start, at, length in tp_runs(global_index(spec, units, total).tolist()):
        if spec.dim == 0:  # FSDP2's rows cut the run
            lo, hi = max(start, row0), min(start + length, row0 + local.shape[0])
            if hi <= lo:
                continue
            piece, offsets = local.narrow(0, lo - row0, hi - lo), [at + lo - start]
        else:  # a row-parallel weight's columns; FSDP2 splits its (unsplit) rows
            piece, offsets = local.narrow(1, start, length), [row0, at]
        if piece.numel():
            pieces.append((torch.Size(offsets + [0] * (local.dim() - len(offsets))), piece))
    return Pieces(torch.Size(full), pieces) if pieces else None


class Pieces(torch.Tensor):
    """A full tensor of which this rank holds some rectangular ``pieces`` (offsets in the full
    tensor, a view of this rank's tensor), as DCP sees it: the three methods DCP asks a tensor
    for (the protocol DTensor implements: the chunks to write, the chunks to read into, a chunk
    by its offsets). It holds no storage of its own and supports no other operation."""

    _pieces: list[tuple[torch.Size, torch.Tensor]]

    @staticmethod
    def __new__(cls, size: torch.Size, pieces: list[tuple[torch.Size, torch.Tensor]]) -> Pieces:
        first = pieces[0][1]
        out = torch.Tensor._make_wrapper_subclass(cls, size, dtype=first.dtype, device=first.device)
        out._pieces = pieces
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise TypeError(f"Pieces only describes a tensor to DCP; {func} is not supported.")

    def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
        from torch.distributed.checkpoint.planner import (
            TensorWriteData,
            WriteItem,
            WriteItemType,
        )

        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=piece.shape),
                    properties=TensorProperties.create_from_tensor(piece),
                    size=self.shape,
                ),
            )
            for offsets, piece in self._pieces
        ]

    def __create_chunk_list__(self) -> list[Any]:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=o, sizes=p.shape) for o, p in self._pieces]

    def __get_tensor_shard__(self, index: Any) -> torch.Tensor:
        for offsets, piece in self._pieces:
            if offsets == index.offset:
                return piece
        raise ValueError(f"{index.fqn}: no piece at offsets {index.offset} on this rank.")


def _is_array(value: Any) -> bool:
    return torch.is_tensor(value) and value.dim() > 0


def _tp_layout(trainer: Trainer) -> tuple[ShardMap, int] | None:
    """(shard map, TP rank) of a tensor-parallel trainer (``TPTrainer``, or ``DPTrainer`` with a
    ``TPSpec``); None otherwise."""
    spec = getattr(trainer, "tp", None)
    shard_map = spec.shard_map if spec is not None else getattr(trainer, "shard_map", None)
    return None if shard_map is None else (shard_map, trainer.tp_rank)  # type: ignore[attr-defined]


def _for_dcp(trainer: Trainer, model: dict[str, Any], optim: dict[str, Any]) -> dict[str, Any]:
    """What DCP saves or loads: ``{"model": ..., "optim": ...}``, with every TP-sharded tensor
    as ``tp_chunks`` makes it (views, so a load writes into ``model`` and ``optim``)."""
    layout = _tp_layout(trainer)
    if layout is None:
        return {"model": model, "optim": optim}
    cfg, (shard_map, rank) = trainer.model.config, layout

    def cut(entries: dict[str, Any], name_of: Any) -> dict[str, Any]:
        out = {}
        for key, value in entries.items():  # a 0-d tensor (AdamW's step count) is replicated
            chunks = (
                tp_chunks(name_of(key), value, cfg, shard_map, rank) if _is_array(value) else value
            )
            if chunks is not None:
                out[key] = chunks
        return out

    state = {name: cut(s, lambda k, name=name: name) for name, s in optim.get("state", {}).items()}
    return {"model": cut(model, lambda k: k), "optim": {**optim, "state": state}}


def save_sharded(trainer: Trainer, directory: str | Path) -> Path:
    """Write ``trainer``'s checkpoint as ``directory`` (module docstring); every rank calls it."""
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
            _for_dcp(trainer, model, optim),
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
    with _single_process_is_intended():
        dcp.load(  # into model and optim (through the views of TP's pieces)
            _for_dcp(trainer, model, optim),
            storage_reader=reader,
            planner=SafeLoadPlanner(),
            process_group=_group(trainer),
            no_dist=not dist.is_initialized(),
        )
    optim = keep_implementation(optim, trainer.optimizer)
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=model,
        optim_state_dict=optim,
    )
    trainer.load_run_state(run)
    trainer.last_checkpoint = directory


def use_sharded_checkpoints(trainer: Trainer) -> None:
    """Make ``trainer.train()`` write its checkpoints with ``save_sharded``, as the directory
    ``out_dir/checkpoint`` (``--sharded-checkpoint`` on the command line)."""
    trainer.checkpoint_name = SHARDED_NAME
    trainer.write_checkpoint = lambda path: save_sharded(trainer, path)  # type: ignore[method-assign]
