"""FP8 scaling state under ``DistributedDataParallel``: kept out of DDP's buffer broadcast.

DDP's default ``broadcast_buffers=True`` copies every buffer of rank 0 into the other ranks
before each forward pass. ``FP8Linear`` keeps its scaling state (amax histories, scales, scale
inverses) in buffers, so that it is in ``state_dict()`` and checkpoints; DDP would overwrite each
rank's state with rank 0's:
    - with ``DelayedScaling(reduce_amax=False)``, where each rank should keep its own amaxes and
      scales (TE: "every GPU maintains local amaxes and scaling factors"), every rank would
      quantize with rank 0's scales;
    - with ``reduce_amax=True``, the amaxes a rank recorded since the last update (an evaluation
      under ``no_grad`` records them; they enter the next update) would be replaced by rank 0's
      before the reduction could see them, and a broadcast would run every step for state the
      reduction already keeps equal.
TE has neither problem: its scaling state is not a buffer (``fp8_meta``, checkpointed as
``_extra_state``), so DDP never touches it, and ranks agree through the MAX all-reduce over the
autocast's ``amax_reduction_group``. We do the same: the FP8 buffers go into DDP's ignore list
(``module._ddp_params_and_buffers_to_ignore``, which DDP's constructor reads from the module it
wraps; set through ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``).
``convert_to_fp8`` (so ``build_model`` and the ``fp8`` policy) does it for the model it converts,
so ``DDP(model)`` is safe with its defaults. If you wrap another module (a parent of the converted
one), call ``exclude_fp8_from_ddp`` on it before wrapping. Share amaxes over the data-parallel
ranks with ``autocast(amax_reduction_group=...)`` (default: the world), TE's
``amax_reduction_group``.
"""

from __future__ import annotations

from torch import nn

__all__ = ["exclude_fp8_from_ddp"]

_IGNORE = "_ddp_params_and_buffers_to_ignore"


def exclude_fp8_from_ddp(model: nn.Module) -> list[str]:
    """Keep ``model``'s FP8 scaling buffers out of what ``DistributedDataParallel(model)``
    broadcasts and syncs (module docstring). Names already on DDP's ignore list stay there;
    calling it again adds nothing. Returns the FP8 buffer names now ignored: the fully qualified
    names of the buffers each module lists in its class attribute ``FP8_STATE_BUFFERS``
    (``FP8Linear``'s six). Call it on the very module you pass to DDP, before wrapping it."""
    from torch.nn.parallel import DistributedDataParallel

    names = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        for name in getattr(type(module), "FP8_STATE_BUFFERS", ())
        if name in module._buffers
    ]
    ignored = list(getattr(model, _IGNORE, []))
    ignored += [n for n in names if n not in ignored]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
    return names
