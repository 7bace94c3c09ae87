"""``checkpoint``: activation checkpointing of blocks with ``FP8Linear`` layers (TE's
``transformer_engine.pytorch.checkpoint``, in ``pytorch/distributed.py``).

``torch.utils.checkpoint`` reruns a block's forward during the backward pass, after the FP8
region has exited and updated the scales. Outside the region FP8Linear runs in high precision, so
the recomputed saved tensors differ and torch raises ``CheckpointError``; inside a new region it
would quantize with the updated scales and record its amaxes a second time. TE's checkpoint
stashes each module's scales and amax history before the first forward, swaps them in for the
recompute and restores the updated ones after it
(``FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute``,
``get_old_fp8_meta_tensors_for_recompute``, ``restore_fp8_meta_tensors``).

Here, ``checkpoint`` is ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` with a
``context_fn`` whose two contexts share one record (``_Frame``):
    forward    each FP8Linear call appends what it did: its FP8 settings (None: high
               precision), output dtype, emulation flag and copies of the forward scales and
               scale inverses it quantized with.
    recompute  each FP8Linear call replays the next record: the same settings and scales, no
               amax recorded, no scaling update and no claim on the backward update. The
               backward runs the first forward's autograd nodes (non-reentrant checkpointing
               takes only the saved tensors from the recompute), which keep their own claim.
So the recomputed FP8 operands equal the first forward's bit for bit, and gradients and scaling
state equal those of the run without checkpointing. Not supported: nesting ``checkpoint``, and
plain ``torch.utils.checkpoint`` in either form: the non-reentrant one is refused at the forward
(``check_not_plain_checkpoint``), the reentrant one (``use_reentrant=True``, which runs the
forward under ``no_grad`` and recomputes during the backward pass, outside the region) at the
recompute (``check_not_reentrant_recompute``: an FP8 layer's forward during a backward pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint

from .autocast import FP8AutocastState
from .scaling import ScalingMeta

__all__ = ["checkpoint"]


@dataclass(frozen=True)
class _Call:
    """One FP8Linear call in a checkpointed forward; ``fp8`` None: it ran in high precision."""

    module: Any
    fp8: FP8AutocastState | None = None
    out_dtype: torch.dtype | None = None
    emulate: bool = True
    scales: tuple[torch.Tensor, torch.Tensor] | None = None  # forward scale, scale_inv (copies)


@dataclass(eq=False)
class _Frame:
    """The record of one ``checkpoint`` call, shared by its forward and recompute contexts."""

    calls: list[_Call] = field(default_factory=list)
    replaying: bool = False
    next: int = 0
    pack_hook: Any = None  # torch's saved-tensor pack hook of this checkpoint


_FRAMES: list[_Frame] = []  # the active record (at most one: nesting is refused)


@contextlib.contextmanager
def _context(frame: _Frame, replaying: bool) -> Iterator[None]:
    """Makes ``frame`` active: recording in the forward, replaying in the recompute."""
    frame.replaying, frame.next = replaying, 0
    if not replaying:  # entered right after torch's own saved-tensor hooks
        frame.pack_hook = _top_pack_hook()
    _FRAMES.append(frame)
    try:
        yield
    finally:
        _FRAMES.remove(frame)
        frame.replaying = False


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` with its activations recomputed in the backward pass, FP8
    layers included (TE's ``checkpoint``; see the module docstring).

    Keyword arguments go to ``torch.utils.checkpoint.checkpoint`` (``preserve_rng_state``,
    ``determinism_check``, ``early_stop``) or on to ``function``. Always non-reentrant.
    """
    if kwargs.pop("use_reentrant", False):
        raise ValueError(
            "tutorial_lib.fp8.checkpoint is non-reentrant only: drop use_reentrant=True."
        )
    if "context_fn" in kwargs:
        raise ValueError("tutorial_lib.fp8.checkpoint sets context_fn itself.")
    if _FRAMES:
        raise RuntimeError(
            "tutorial_lib.fp8.checkpoint cannot be nested: checkpoint the outer block only."
        )
    frame = _Frame()
    return torch.utils.checkpoint.checkpoint(
        function,
        *args,
        use_reentrant=False,
        context_fn=lambda: (_context(frame, False), _context(frame, True)),
        **kwargs,
    )


def replay_call(module: Any) -> _Call | None:
    """In a ``checkpoint`` recompute: the next recorded call, which must be ``module``'s; else
    None (not replaying)."""
    if not _FRAMES or not _FRAMES[-1].replaying:
        return None
    frame = _FRAMES[-1]
    call = frame.calls[frame.next] if frame.next < len(frame.calls) else None
    if call is None or call.module is not module:
        raise RuntimeError(
            "tutorial_lib.fp8.checkpoint: the recompute called FP8 layers in another order than "
            "the forward did; the checkpointed function must call the same layers in the same "
            "order every time."
        )
    frame.next += 1
    return call


def record_call(
    module: Any,
    fp8: FP8AutocastState | None = None,
    out_dtype: torch.dtype | None = None,
    emulate: bool = True,
    meta: ScalingMeta | None = None,
) -> None:
    """In a ``checkpoint``'s forward: record this call (``fp8`` None: high precision)."""
    if not _FRAMES or _FRAMES[-1].replaying:
        return
    scales = None if meta is None else (meta.scale.clone(), meta.scale_inv.clone())
    _FRAMES[-1].calls.append(_Call(module, fp8, out_dtype, emulate, scales))


def check_not_plain_checkpoint(layer: str) -> None:
    """Raise if an FP8 forward runs inside plain ``torch.utils.checkpoint`` (non-reentrant),
    whose recompute would run outside the FP8 region."""
    pack = _top_pack_hook()
    module, name = getattr(pack, "__module__", None), getattr(pack, "__qualname__", "")
    plain = module == "torch.utils.checkpoint" and name.startswith("_checkpoint_hook.")
    if plain and not (_FRAMES and _FRAMES[-1].pack_hook is pack):
        raise RuntimeError(
            f"{layer} ran in FP8 inside torch.utils.checkpoint, whose recompute would run it "
            "outside the FP8 region (high precision, or other scales). Checkpoint blocks with "
            "FP8 layers through tutorial_lib.fp8.checkpoint(block, *args) instead."
        )


def check_not_reentrant_recompute(layer: str) -> None:
    """Raise if a layer that has run in FP8 runs again during a backward pass, outside
    ``checkpoint``'s replay: reentrant ``torch.utils.checkpoint`` recomputing it (outside the FP8
    region, or with other scales and a second amax record)."""
    if torch._C._current_graph_task_id() == -1:
        return  # not inside a backward pass
    if getattr(_top_pack_hook(), "__module__", None) == "torch.utils.checkpoint":
        return  # a non-reentrant recompute: its forward was checked (check_not_plain_checkpoint)
    raise RuntimeError(
        f"{layer} ran a forward pass during the backward pass: reentrant "
        "torch.utils.checkpoint (use_reentrant=True, torch's default) recomputing it, which "
        "would run it outside the FP8 region (high precision) or record its amaxes twice. "
        "Checkpoint blocks with FP8 layers through tutorial_lib.fp8.checkpoint(block, *args)."
    )


def _top_pack_hook() -> Any:
    """The innermost saved-tensor pack hook (torch internals; None if unavailable)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    except (AttributeError, RuntimeError):
        return None
    return hooks[0] if hooks else None
