"""Checkpoint files: written atomically, opened without running code from them.

``save_checkpoint`` writes through a temporary file, fsync and ``os.replace``, so a crash never
leaves a torn file. ``load_checkpoint`` opens only whole ``torch.save`` archives, with
``torch.load(weights_only=True)``: tensors and plain data, nothing that could run code.

A model's state goes through ``model_state_dict`` / ``load_model_state_dict``. For plain and
``FP8Linear`` models they are ``state_dict``/``load_state_dict``. A Transformer Engine module
(``te-fp8``) checkpoints its FP8 scaling state as ``_extra_state``, a *pickled* object (which TE
>= 2.18 refuses to load unless ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``): we store it as
tensors and plain data instead (``fp8.te_state``) and restore it without pickle. A checkpoint
that holds TE's pickled form is refused with a ``CheckpointError`` naming the modules and the fix.
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

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "convert_checkpoint_file",
    "model_state_dict",
    "load_model_state_dict",
]


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
    which is everything a ``Trainer`` checkpoint holds. Anything else (a pickled object whose
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


# ---- a model's state, Transformer Engine's FP8 extra state included --------------------------
def convert_checkpoint_file(src: str | Path, dst: str | Path, to: str) -> Path:
    """A Trainer checkpoint moved between the ``fp8`` and ``te-fp8`` layouts
    (``fp8.te_checkpoint.convert_checkpoint``), from file ``src`` to a new file ``dst`` (written
    atomically; never over ``src``, so the original is kept). Returns ``dst``'s path."""
    from ..fp8.te_checkpoint import convert_checkpoint

    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError(f"Write the converted checkpoint to a new file, not over {src}.")
    return save_checkpoint(dst, convert_checkpoint(load_checkpoint(src), to))


def model_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()``, with each TE module's ``_extra_state`` (pickled bytes) replaced by
    the same content as tensors and plain data (``fp8.te_state.te_extra_state``; an empty
    tensor where TE keeps no state), so the checkpoint loads with ``weights_only=True``."""
    state = model.state_dict()
    if not any(key.endswith("_extra_state") for key in state):
        return state
    from ..fp8.te_state import te_extra_state, te_extra_state_modules

    for key, module in te_extra_state_modules(model).items():
        if key in state:
            safe = te_extra_state(module)
            state[key] = safe if safe is not None else torch.empty(0, dtype=torch.uint8)
    return state


def load_model_state_dict(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """``model.load_state_dict(state)`` (strict), restoring TE modules' FP8 state from the form
    ``model_state_dict`` writes (``fp8.te_state.load_te_extra_state``, no pickle).

    TE's own pickled form (a non-empty uint8 tensor, e.g. from ``torch.save(model.state_dict())``)
    is refused with ``CheckpointError`` before anything is loaded, unless
    ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` is set; then it goes to TE's ``set_extra_state``.
    The one exception is TE 2.9's pickle of a stateless recipe (current, block, MXFP8, NVFP4),
    which holds no state: it is read with an allow-listing unpickler (``fp8.te_pickle``) and
    loads as the empty state TE 2.20 would have saved.
    """
    if not any(key.endswith("_extra_state") for key in state):
        model.load_state_dict(state)
        return
    from ..fp8.te_pickle import stateless_te_pickle
    from ..fp8.te_state import (
        TE_UNSAFE_PICKLE_ENV,
        check_te_extra_state,
        load_te_extra_state,
        te_extra_state_modules,
    )

    te = {k: m for k, m in te_extra_state_modules(model).items() if k in state}
    state = dict(state)
    for key in te:  # TE 2.9 pickles stateless recipes too: read safely, nothing to restore
        if _is_pickled_te_state(state[key]) and stateless_te_pickle(state[key]) is not None:
            state[key] = torch.empty(0, dtype=torch.uint8)
    pickled = [k for k in te if _is_pickled_te_state(state[k])]
    if pickled and os.environ.get(TE_UNSAFE_PICKLE_ENV) != "1":
        raise CheckpointError(
            f"The checkpoint holds Transformer Engine's pickled FP8 state for {pickled}: "
            "unpickling it can run arbitrary code, so TE >= 2.18 and tutorial_lib refuse it. "
            f"Only if you trust the file, set {TE_UNSAFE_PICKLE_ENV}=1, load it, and save it "
            "again with tutorial_lib (model_state_dict / Trainer.save), which stores this state "
            "as plain tensors."
        )
    _check_keys(model, state)
    safe = {k: state[k] for k in te if isinstance(state[k], dict)}
    for key, value in safe.items():  # every FP8 state must fit before anything loads
        try:
            check_te_extra_state(te[key], value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{key}: {exc} Nothing was loaded.") from exc
    model.load_state_dict({k: v for k, v in state.items() if k not in safe}, strict=False)
    for key, value in safe.items():
        load_te_extra_state(te[key], value)


def _is_pickled_te_state(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.numel() > 0


def _check_keys(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """The strict check ``load_state_dict`` makes, extra-state entries included."""
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}: missing keys "
            f"{missing}, unexpected keys {unexpected}."
        )
