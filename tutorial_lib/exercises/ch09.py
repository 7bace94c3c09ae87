"""Exercise 9.1: ZeRO's memory model, what one data-parallel rank holds at each stage, checked
against ``parallel.dp.zero_bytes_per_rank`` (which chapter 9 compares with measured DDP and FSDP2
runs)."""

from __future__ import annotations

from ..parallel.dp import zero_bytes_per_rank
from .base import Case, Exercise

STUB = '''\
def bytes_per_rank(
    n_params: int,
    dp: int,
    stage: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optim_bytes: int = 8,
) -> tuple[float, float, float]:
    """Bytes one of dp data-parallel ranks holds, per ZeRO stage.

    A model of n_params parameters keeps param_bytes per parameter
    for its weights, grad_bytes for its gradients and optim_bytes
    for the optimizer state (AdamW in FP32: two moments, 8 bytes).
      stage 0 (DDP): every rank holds all three in full;
      stage 1: the optimizer state is split evenly over the ranks;
      stage 2: the gradients are split too;
      stage 3 (FSDP): the parameters are split too.
    Returns (parameters, gradients, optimizer) in bytes, as floats
    (a split part is total / dp).
    """
    raise NotImplementedError
'''

TASK = (
    "ZeRO (and FSDP) save memory by splitting what every data-parallel rank would otherwise "
    "hold in full. Write the model of one rank's bytes: a model of `n_params` parameters keeps "
    "`param_bytes` per parameter for its weights, `grad_bytes` for its gradients and "
    "`optim_bytes` for its optimizer state; stage 0 (DDP) replicates all three, stage 1 splits "
    "the optimizer state evenly over the `dp` ranks, stage 2 the gradients too, stage 3 (FSDP) "
    "the parameters too. Return the three byte counts as floats."
)


def _cases() -> list[Case]:
    gpt2 = 124_439_808  # GPT-2 small, tied embeddings
    cases = [
        Case(f"GPT-2 small, dp 8, stage {s}", {"n_params": gpt2, "dp": 8, "stage": s})
        for s in (0, 1, 2, 3)
    ]
    cases.append(
        Case(
            "7B parameters, dp 64, stage 3, BF16 weights and gradients, "
            "FP32 master weights and moments in the optimizer (12 B)",
            {
                "n_params": 7_000_000_000,
                "dp": 64,
                "stage": 3,
                "param_bytes": 2,
                "grad_bytes": 2,
                "optim_bytes": 12,
            },
        )
    )
    cases.append(Case("1001 parameters, dp 3, stage 2", {"n_params": 1001, "dp": 3, "stage": 2}))
    cases.append(Case("one rank: nothing to split", {"n_params": 5000, "dp": 1, "stage": 3}))
    return cases


EXERCISES = [
    Exercise(
        id="9.1",
        title="ZeRO's memory per data-parallel rank",
        function="bytes_per_rank",
        signature=(
            "bytes_per_rank(n_params: int, dp: int, stage: int, param_bytes: int = 4, "
            "grad_bytes: int = 4, optim_bytes: int = 8) -> tuple[float, float, float]"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=zero_bytes_per_rank,
        reference_name="tutorial_lib.parallel.dp.zero_bytes_per_rank",
        outputs=("parameters", "gradients", "optimizer"),
    )
]
