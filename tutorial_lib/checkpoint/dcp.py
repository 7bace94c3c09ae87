"""What a sharded checkpoint needs from ``torch.distributed.checkpoint`` (DCP): a safe reader,
and a view of each rank's state that DCP can write and read at any layout.

The view (``dcp_view``): the model's and the optimizer's state as ``get_state_dict`` gives them
(plain tensors in one process, FSDP2's DTensors), with every tensor-parallel entry replaced by
what it is: a few rectangular pieces of the *full* tensor. Our TP shards are plain tensors of
different shapes under the same names (uneven heads; the Q, K and V rows of a rank's heads lie
apart in the full ``qkv``), which DCP would take for one replicated tensor. So each sharded entry
(a parameter and AdamW's moments) becomes a ``Pieces`` tensor (``tp_chunks``: the runs of
consecutive indices of ``shard.global_index``, cut again by FSDP2's rows under 2D): views of this
rank's tensors with their offsets in the full tensor, and the three methods through which DCP
asks DTensor for its chunks. DCP records every piece's offsets in its metadata and, on load,
reads for each piece this rank needs the overlapping parts of whichever pieces were saved.
``fill_from_full`` fills the same view from full tensors (a one-process checkpoint file).

Safety. DCP's own reader unpickles ``.metadata`` with ``pickle.load`` and its default planner
loads non-tensor values (the optimizer's hyperparameters) with ``torch.load(weights_only=False)``;
a crafted checkpoint could run code through either. Here ``SafeFileSystemReader`` unpickles the
metadata with an allowlist of the classes DCP's metadata is made of (and refuses anything else
with ``CheckpointError``), and ``SafeLoadPlanner`` loads values with ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorProperties
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.tensor import DTensor

from ..config import GPTConfig
from ..parallel.mesh import ParallelDims
from ..parallel.shard import ShardMap, global_index, param_spec, rank_units, unit_specs
from .files import CheckpointError

__all__ = [
    "Pieces",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "dcp_view",
    "fill_from_full",
    "tp_chunks",
]
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


def dcp_view(
    dims: ParallelDims, cfg: GPTConfig, model: dict[str, Any], optim: dict[str, Any]
) -> dict[str, Any]:
    """What DCP saves or loads: ``{"model": ..., "optim": ...}`` (``get_state_dict``'s two
    dicts), with every TP-sharded tensor as ``tp_chunks`` makes it (views, so a load writes
    into ``model`` and ``optim``)."""
    if dims.tp is None:
        return {"model": model, "optim": optim}
    shard_map, rank = dims.tp.shard_map, dims.tp_rank

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


def fill_from_full(view: dict[str, Any], full: dict[str, Any], where: str = "") -> None:
    """Fill ``dcp_view``'s tensors in place from the same entries as full tensors (``full``):
    each ``Pieces`` piece, DTensor shard or plain tensor (a step count too) gets its region of
    the full tensor, in place; other values (hyperparameters) are replaced in ``view``. A missing entry, or a full tensor
    of another shape, raises ``CheckpointError``."""
    for key, dst in view.items():
        name = f"{where}{key}"
        if key not in full:
            raise CheckpointError(
                f"The checkpoint has no {name!r}; it was written for another model."
            )
        src = full[key]
        if isinstance(dst, dict):
            fill_from_full(dst, src, f"{name}.")
            continue
        if not torch.is_tensor(dst):
            view[key] = src
            continue
        if tuple(src.shape) != tuple(dst.shape):
            raise CheckpointError(
                f"{name}: the checkpoint holds shape {tuple(src.shape)}, this model "
                f"{tuple(dst.shape)}; it was written for another model."
            )
        for offsets, piece in _regions(dst):
            region = tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape, strict=False))
            piece.copy_(src[region])


def _regions(t: torch.Tensor) -> list[tuple[torch.Size, torch.Tensor]]:
    """(offsets in the full tensor, this rank's tensor there) of each region ``t`` holds."""
    if isinstance(t, Pieces):
        return t._pieces
    if isinstance(t, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return [(torch.Size(offset), t.to_local())]
    return [(torch.Size([0] * t.dim()), t)]  # a 0-d tensor: the empty region, all of it
