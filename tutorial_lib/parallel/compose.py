"""What composes with what under parallelism: one function says which combinations are refused,
and why; ``build_model`` raises its reason, the book prints its table, and the
tests run every other cell against one process (``tests/test_composition.py``).

Axes: the precision policy, ``fused`` (our Triton kernels), ``compile`` (``torch.compile``),
tensor parallelism (our Megatron layers) and FSDP2 (over the data-parallel ranks; DDP, which
replicates, refuses nothing FSDP2 accepts). Three refusals, each for a reason that is not ours
to remove here:

- FP16 with sharded gradients (TP or FSDP2): its loss scaler checks each rank's own shards for
  inf and NaN, so the ranks could disagree on whether to skip a step. BF16 needs no scaler.
- Transformer Engine (``te-*``) under our TP: TE splits its own modules (``parallel_mode``,
  ``tp_group``), which this package does not wire up (and cannot test without CUDA).
- Transformer Engine under FSDP2: the full-state checkpoint would hold TE's pickled FP8 state,
  which this package refuses to load.

Fused kernels and ``torch.compile`` are refused nowhere: the Triton LayerNorm, GELU and loss
kernels sit around the parallel layers unchanged, and Dynamo compiles the model with the
collectives inside our autograd Functions (``FP8Linear.forward`` runs eagerly, as in one process).

``build_model`` checks a layout once, before it builds anything. Every cell that is not refused
is trained against one process by ``tests/composition_cells.py``: ``tests/test_composition.py``
runs the cells that fit the test suite's time, ``benchmarks/composition.py`` every cell,
compiled ones included, and records the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..precision import available_policies

__all__ = ["Cell", "composition_problem", "composition_table"]


def composition_problem(precision: str, tp: bool, fsdp: bool) -> str | None:
    """Why ``precision`` cannot train under tensor parallelism (``tp``) and/or FSDP2 (``fsdp``),
    with what to do instead; None when it can."""
    where = " and ".join(n for n, on in (("tensor parallelism", tp), ("FSDP2", fsdp)) if on)
    if precision == "fp16" and (tp or fsdp):
        return (
            f"'fp16' under {where}: its loss scaler checks each rank's own gradient shards for "
            "inf and NaN, so ranks could disagree on skipping a step. Use bf16 (no loss "
            "scaling needed)."
        )
    if precision.startswith("te-") and tp:
        return (
            f"{precision!r} under our tensor parallelism: Transformer Engine splits its own "
            "modules (parallel_mode='column'/'row', tp_group), which this package does not "
            "wire up. Use our FP8 precisions (fp8, fp8-current, ...) with --tp."
        )
    if precision.startswith("te-") and fsdp:
        return (
            f"{precision!r} with FSDP2: the full-state checkpoint would hold Transformer "
            "Engine's pickled FP8 state, which this package refuses to load. Use --dp-mode ddp, "
            "or our own FP8 precisions (fp8, fp8-current, ...)."
        )
    return None


@dataclass(frozen=True)
class Cell:
    """One combination; ``problem`` None means it trains (and is tested against one process)."""

    precision: str
    fused: bool
    compile: bool
    tp: bool
    fsdp: bool
    problem: str | None


def composition_table() -> list[Cell]:
    """Every parallel combination (TP, FSDP2 or both) of every registered precision, fused or
    not, compiled or not."""
    return [
        Cell(p, fused, comp, tp, fsdp, composition_problem(p, tp, fsdp))
        for p in available_policies()
        for tp, fsdp in ((True, False), (False, True), (True, True))
        for fused in (False, True)
        for comp in (False, True)
    ]
