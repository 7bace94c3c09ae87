"""Checkpoint files: written atomically, verified on load, opened without running code from them.

``save_checkpoint`` records a checksum of the content (``state_digest``: SHA-256 over every
tensor's dtype, shape and bytes and every plain value, in order), writes through a temporary
file and fsync, reads the file back to check that the disk holds the bytes written, and only
then renamed into place (``os.replace``): a crash never leaves a torn file, and the previous
checkpoint is replaced only by a complete, verified one. ``load_checkpoint`` opens only whole
``torch.save`` archives, with ``torch.load(weights_only=True)`` (tensors and plain data, nothing
that could run code), and refuses content that does not match its checksum: a flipped bit in a
tensor or a setting is an error naming the file, never a silently different run.

A model's state goes through ``model_state_dict`` / ``load_model_state_dict``. For plain and
``FP8Linear`` models they are ``state_dict``/``load_state_dict``. A Transformer Engine module
(``te-fp8``) checkpoints its FP8 scaling state as ``_extra_state``, a *pickled* object (which TE
>= 2.18 refuses to load unless ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``): we store it as
tensors and plain data instead (``fp8.te_state``) and restore it without pickle. A checkpoint
that holds TE's pickled form is refused with a ``CheckpointError`` naming the modules and the fix.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Any, cast

import torch

__all__ = [
    "CHECKSUM",
    "CheckpointError",
    "file_sha256",
    "state_digest",
    "save_checkpoint",
    "load_checkpoint",
    "convert_checkpoint_file",
    "model_state_dict",
    "load_model_state_dict",
]


CHECKSUM = "checksum"  # the key under which a checkpoint file records its content's digest


def state_digest(state: Any) -> str:
    """SHA-256 of a checkpoint's content: each tensor's dtype, shape and bytes, each plain value's
    type and ``repr``, dicts and lists in order. The same before ``torch.save`` and after
    ``torch.load``; any changed bit of a tensor or a setting changes it."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}:".encode())
            for key, item in value.items():
                feed(key)
                feed(item)
        elif isinstance(value, list | tuple):
            digest.update(f"L{len(value)}:".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    feed(state)
    return digest.hexdigest()


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class _HashingWriter:
    """The file ``torch.save`` writes to, hashing the bytes on their way."""

    def __init__(self, f: Any) -> None:
        self.f, self.digest = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return int(self.f.write(data))

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` and its ``state_digest`` (under ``CHECKSUM``) with ``torch.save``,
    atomically: into a temporary file, synced and read back, then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {**state, CHECKSUM: state_digest(state)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # as open() would create it (mkstemp makes it private)
    try:
        with os.fdopen(fd, "wb") as f:
            writer = _HashingWriter(f)
            torch.save(state, cast(IO[bytes], writer))  # it only calls write, flush
            f.flush()
            os.fsync(f.fileno())
        if file_sha256(tmp) != writer.digest.hexdigest():
            raise CheckpointError(
                f"Writing {path}: the file read back differs from the bytes written (a failing "
                "disk or filesystem). The previous checkpoint was kept; write to another --out."
            )
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno and not exc.filename:  # a full disk: name it
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        if "unexpected pos" in str(exc):  # torch's word for a short write: the same, errno-less
            raise OSError(errno.ENOSPC, "No space left (or file too large)", str(path)) from exc
        raise
    return path


# What to do about a checkpoint that cannot be used (the command line's options)
REMEDY = (
    "Restore it from a copy if you have one, or start the run again with --force (the earlier "
    "run's files move to previous/)."
)


class CheckpointError(ValueError):
    """A checkpoint that cannot be opened safely: corrupt, truncated, not a ``torch.save`` file,
    or holding Python objects beyond tensors and plain data (which could run code on load)."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Open a checkpoint written by ``save_checkpoint`` without running any code from it.

    ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, tuples and dicts only,
    which is everything a ``Trainer`` checkpoint holds. Anything else (a pickled object whose
    unpickling calls a function) is refused with ``CheckpointError``, as is a file that is not
    a whole ``torch.save`` archive, or whose content does not match the checksum it records.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    if not _is_zipfile(path):  # torch.save writes a zip archive; its directory is last
        raise CheckpointError(
            f"{path} is not a readable checkpoint: it is empty, truncated or corrupt, or not a "
            f"torch.save file ({path.stat().st_size} bytes). {REMEDY}"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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
    except Exception as exc:  # torch's reader meets damaged bytes in many ways
        raise _corrupt(path, exc) from exc
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} holds a {type(state).__name__}, not a checkpoint (a dict of the run's "
            f"state). {REMEDY}"
        )
    recorded = state.pop(CHECKSUM, None)
    if recorded is None:
        raise CheckpointError(
            f"{path} records no checksum, so its content cannot be verified: it was not written "
            "by save_checkpoint (or by a tutorial_lib older than checkpoint format 2). {REMEDY}"
        )
    if recorded != state_digest(state):
        raise CheckpointError(
            f"{path} is corrupt: its content does not match the checksum recorded when it was "
            f"written (a changed bit on the disk or in a copy). {REMEDY}"
        )
    return state


def _is_zipfile(path: Path) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except zipfile.BadZipFile:  # a damaged end record it does not catch itself
        return False


def _corrupt(path: Path, exc: BaseException) -> CheckpointError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
    return CheckpointError(
        f"{path} is not a readable checkpoint: it is truncated or corrupt "
        f"({type(exc).__name__}: {first}). {REMEDY}"
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
