"""``autocast``: the FP8 region, named and behaving like Transformer Engine's ``te.pytorch.autocast``.

Inside ``autocast(enabled=True)`` every ``FP8Linear`` runs its GEMMs in FP8 with the region's recipe:
delayed scaling (the default), or a stateless recipe of ``fp8.recipes``, which has no state to
update. Under delayed scaling, when the scaling state changes (TE 2.x, ``transformer_engine/pytorch/quantization.py``,
``FP8GlobalStateManager.autocast_exit``; ``module/linear.py``, ``_Linear.backward``):
    forward state (input, weight, output): when the OUTERMOST region exits, if that region was
        enabled and grad is enabled at exit (``torch.is_grad_enabled()``). So evaluation under
        ``torch.no_grad()`` never updates scales, but, as in TE, its amaxes are still recorded
        into row 0 and enter the next training update.
    backward state (grad_output, grad_input): at the end of the backward pass of the module that
        ran FIRST in the region's forward pass among those that need a gradient (the last one to
        run backward), for every module of that region. As in TE (``_check_fp8_reduce_and_update``
        is only asked when the input, weight or bias requires grad), a module with nothing to
        differentiate (frozen weights, an input that needs no grad) runs no backward, so it
        cannot claim the update; the next module that does claims it. Here the claiming module's
        autograd Function does the update (``BackwardStep``).
Amaxes are MAX-all-reduced over ``amax_reduction_group`` before an update when the recipe's
``reduce_amax`` is set and the group has more than one rank (one all-reduce per group).
TE's calibration mode (``calibrating=True``: high precision, amaxes recorded) is not reproduced.
Activation checkpointing: wrap checkpointed blocks in ``tutorial_lib.fp8.checkpoint`` (module
``recompute``), never plain ``torch.utils.checkpoint`` (FP8Linear refuses it with an error naming
the helper: the non-reentrant form at the forward, the reentrant form at its recompute).
The region state is process-global (like TE's): do not run FP8 regions in several threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .recipes import DelayedScaling, Recipe
from .scaling import FP8ModuleState

__all__ = ["FP8AutocastState", "autocast", "get_autocast_state", "reduce_amax"]


@dataclass(frozen=True)
class FP8AutocastState:
    """The settings of the innermost active ``autocast``.

    FP8: enabled (FP8 GEMMs), recipe.
    Distributed: amax_reduction_group (None: the default group).
    Execution: emulate (None: decided per module/device, see ``FP8Linear``).
    """

    enabled: bool
    recipe: DelayedScaling | Recipe
    amax_reduction_group: Any = None
    emulate: bool | None = None


@dataclass(eq=False)
class BackwardStep:
    """Modules run with grad in one outermost region; the first that needs grad updates their
    backward state."""

    entries: list[tuple[FP8ModuleState, DelayedScaling, Any]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    claimed: bool = False  # a module whose backward will run has taken the update

    def add(self, state: FP8ModuleState, fp8: FP8AutocastState) -> None:
        recipe = fp8.recipe
        assert isinstance(recipe, DelayedScaling)  # only delayed scaling has state to update
        if id(state) not in self.seen:
            self.seen.add(id(state))
            self.entries.append((state, recipe, fp8.amax_reduction_group))

    def update(self) -> None:
        """Update every module's backward state (called by the claiming module's backward)."""
        _update_states(self.entries, forward=False)


@dataclass(eq=False)
class _Region:
    """What the outermost autocast collects: modules that ran in FP8 (forward) and the step record
    shared by their backward passes."""

    forward: BackwardStep = field(default_factory=BackwardStep)
    backward: BackwardStep = field(default_factory=BackwardStep)


_STACK: list[FP8AutocastState] = []
_REGION: list[_Region] = []  # one entry while an outermost region is open


def get_autocast_state() -> FP8AutocastState | None:
    """The innermost active region's settings, or None outside any ``autocast``."""
    return _STACK[-1] if _STACK else None


def register_fp8_run(
    state: FP8ModuleState, fp8: FP8AutocastState, needs_grad: bool
) -> BackwardStep | None:
    """Note that a module ran in FP8 in this region; returns the backward step record if this
    module is the first to run with grad enabled AND ``needs_grad`` (its input, weight or bias
    requires grad, so its backward will run): it then updates everyone's backward state. Else
    None. A module that needs no grad still joins the backward update (as in TE's buffer).
    """
    region = _REGION[-1]
    region.forward.add(state, fp8)
    if not torch.is_grad_enabled():
        return None
    region.backward.add(state, fp8)
    if not needs_grad or region.backward.claimed:
        return None
    region.backward.claimed = True
    return region.backward


def _update_states(
    entries: list[tuple[FP8ModuleState, DelayedScaling, Any]], forward: bool
) -> None:
    """One delayed-scaling update of each entry's forward or backward group; the amaxes of entries
    sharing a reduction group (and wanting reduction) go through one MAX all-reduce."""
    by_group: dict[int, list[tuple[FP8ModuleState, DelayedScaling, Any]]] = {}
    for entry in entries:
        by_group.setdefault(id(entry[2]), []).append(entry)
    for group_entries in by_group.values():
        group = group_entries[0][2]
        reduced = _reduced_rows(group_entries, forward, group)
        for (state, recipe, _), rows in zip(group_entries, reduced, strict=True):
            state.update(recipe, forward=forward, reduced_amax=rows if recipe.reduce_amax else None)


def _reduced_rows(
    entries: list[tuple[FP8ModuleState, DelayedScaling, Any]], forward: bool, group: Any
) -> list[torch.Tensor | None]:
    dist = torch.distributed
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    wanted = [recipe.reduce_amax for _, recipe, _ in entries]
    if not distributed or not any(wanted):
        return [None] * len(entries)
    rows = [(s.forward if forward else s.backward).amax_history[0] for s, _, _ in entries]
    flat = reduce_amax(torch.cat(rows), group)
    return list(torch.split(flat, [r.numel() for r in rows]))


@contextlib.contextmanager
def autocast(
    enabled: bool = True,
    recipe: DelayedScaling | Recipe | None = None,
    amax_reduction_group: Any = None,
    emulate: bool | None = None,
) -> Iterator[None]:
    """An FP8 region for ``FP8Linear`` modules (TE's ``autocast``; nestable).

    FP8:
        enabled: run FP8Linear GEMMs in FP8. recipe: a ``DelayedScaling`` (default: TE's
            defaults) or a stateless recipe of ``fp8.recipes`` (no scaling state).
    Distributed:
        amax_reduction_group: the process group whose ranks share amaxes (default: the world).
    Extras (not in TE):
        emulate: allow the FP32 emulation path on CUDA GPUs without FP8 tensor
            cores (None: defer to each module's flag).
    Scaling state updates: see the module docstring.
    """
    recipe = DelayedScaling() if recipe is None else recipe
    if not isinstance(recipe, DelayedScaling | Recipe):
        raise TypeError(
            f"autocast takes a recipe of tutorial_lib.fp8 (DelayedScaling, Float8CurrentScaling, "
            f"Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling, Float8RowwiseScaling), "
            f"got {type(recipe).__name__}. For Transformer Engine's recipes use te_autocast."
        )
    state = FP8AutocastState(enabled, recipe, amax_reduction_group, emulate)
    outermost = not _STACK
    if outermost:
        _REGION.append(_Region())
    _STACK.append(state)
    try:
        yield
    finally:
        _STACK.pop()
        if outermost:
            region = _REGION.pop()
            if enabled and torch.is_grad_enabled():
                _update_states(region.forward.entries, forward=True)


def reduce_amax(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """A copy of ``tensor`` MAX-all-reduced over ``group`` (default: the world), as TE reduces
    the amaxes of a step over ``amax_reduction_group``.

    Only when ``torch.distributed`` is initialized and the group has more than one rank;
    otherwise an unchanged copy. Typical use: ``meta.update(recipe, fp8_max,
    reduced_amax=reduce_amax(meta.amax_history[0], group))``.
    """
    out = tensor.detach().clone()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out
