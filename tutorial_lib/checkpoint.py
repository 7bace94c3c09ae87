"""Checkpoint files: written atomically, opened without running code from them.

``save_checkpoint`` writes through a temporary file, fsync and ``os.replace``, so a crash never
leaves a torn file. ``load_checkpoint`` opens only whole ``torch.save`` archives, with
``torch.load(weights_only=True)``: tensors and plain data, nothing that could run code.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint"]


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` with ``torch.save`` atomically: a crash never leaves a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class CheckpointError(ValueError):
    """A checkpoint that cannot be opened safely: corrupt, truncated, not a ``torch.save`` file,
    or holding Python objects beyond tensors and plain data (which could run code on load)."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Open a checkpoint written by ``save_checkpoint`` without running any code from it.

    ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, tuples and dicts only,
    which is everything ``Trainer.state_dict`` holds. Anything else (a pickled object whose
    unpickling calls a function) is refused with ``CheckpointError``, as is a file that is not
    a whole ``torch.save`` archive.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its directory is last
        raise CheckpointError(
            f"{path} is not a readable checkpoint: it is empty, truncated or corrupt, or not a "
            f"torch.save file ({path.stat().st_size} bytes). Resume from an earlier checkpoint, "
            "or start the run again without --resume."
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        unsafe = re.search(r"GLOBAL (\S+)", str(exc))  # a global the safe unpickler refused
        if unsafe is None:  # damaged pickle data inside a whole archive
            raise _corrupt(path, exc) from exc
        raise CheckpointError(
            f"Refusing to open {path}: besides tensors and plain data it holds a reference to "
            f"{unsafe.group(1)}, and unpickling it could run arbitrary code. tutorial_lib "
            "checkpoints never contain such objects. Only if you trust the file's source, open "
            "it with torch.load(path, weights_only=False) and save its tensors again."
        ) from None
    except (RuntimeError, EOFError, ValueError, KeyError, OSError) as exc:
        raise _corrupt(path, exc) from exc


def _corrupt(path: Path, exc: BaseException) -> CheckpointError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
    return CheckpointError(
        f"{path} is not a readable checkpoint: it is truncated or corrupt "
        f"({type(exc).__name__}: {first}). Resume from an earlier checkpoint, or start the run "
        "again without --resume."
    )
