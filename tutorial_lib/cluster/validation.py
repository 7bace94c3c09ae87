"""The cost model against Table 1 of Narayanan et al. 2021 (arXiv 2104.04473): the ten weak-scaling
runs of GPT models from 1.7B to 1T parameters on A100 GPUs (``MEGATRON_2021_TABLE1``), the one
calibrated parameter (``calibrate_compute_efficiency``, stored as ``A100_COMPUTE_EFFICIENCY``)
and the predicted-vs-achieved table (``validation_table``, whose docstring says where the model
is off, and why).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cost_terms import iteration_time, tflops_per_gpu
from .specs import CLUSTERS, ClusterSpec, ModelSpec, ParallelConfig

__all__ = [
    "Table1Row",
    "MEGATRON_2021_TABLE1",
    "CALIBRATION_ROWS",
    "A100_COMPUTE_EFFICIENCY",
    "calibrate_compute_efficiency",
    "validation_table",
]


@dataclass(frozen=True)
class Table1Row:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved teraFLOP/s per GPU


# Narayanan et al. 2021 (arXiv 2104.04473v5), Table 1 "Weak-scaling throughput for GPT models
# ranging from 1 billion to 1 trillion parameters": V = 51,200, s = 2048, A100 80GB on Selene,
# interleaved schedule with scatter/gather, activation recomputation (sec. 5.1).
MEGATRON_2021_TABLE1: tuple[Table1Row, ...] = tuple(
    Table1Row(*r)
    for r in (
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    )
)
CALIBRATION_ROWS = (0, 2, 4, 6, 8)  # every other row; rows 1, 3, 5, 7, 9 are held out
A100_COMPUTE_EFFICIENCY = 0.6116  # calibrate_compute_efficiency(), rounded; a test recomputes it


def _table1_setup(row: Table1Row) -> tuple[ModelSpec, ClusterSpec, ParallelConfig]:
    """Assumptions beyond the table: micro-batch 1 (as in the paper's Table 2 PTD-P runs), 16-bit
    gradients all-reduced after the backward (Megatron 2021 did not overlap them) and v = 1: the
    paper used the interleaved schedule but does not say with how many chunks."""
    model = ModelSpec(
        layers=row.layers,
        hidden=row.hidden,
        heads=row.heads,
        vocab=51200,
        seq=2048,
        name=f"{row.params_b}B",
    )
    dp = row.gpus // (row.tp * row.pp)
    par = ParallelConfig(
        tp=row.tp,
        pp=row.pp,
        dp=dp,
        micro_batch=1,
        global_batch=row.batch,
        recompute="full",
        dtype="fp16",
        grad_bytes=2,
    )
    return model, CLUSTERS["DGX A100 (Selene)"].with_gpus(row.gpus), par


def _efficiency_matching(row: Table1Row) -> float:
    """The compute_efficiency at which the model reproduces ``row`` exactly (bisection)."""
    lo, hi = 0.05, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tflops_per_gpu(*_table1_setup(row), compute_efficiency=mid) < row.tflops:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def calibrate_compute_efficiency(rows: tuple[int, ...] = CALIBRATION_ROWS) -> float:
    """Mean over ``rows`` of the efficiency that reproduces each row exactly."""
    return sum(_efficiency_matching(MEGATRON_2021_TABLE1[i]) for i in rows) / len(rows)


def validation_table(compute_efficiency: float = A100_COMPUTE_EFFICIENCY) -> list[dict]:
    """Predicted vs achieved TFLOP/s per GPU for every row of Table 1, with the relative error.

    One parameter is calibrated, ``compute_efficiency``: the mean of the per-row values that
    reproduce rows 1, 3, 5, 7 and 9 (0-based 0, 2, 4, 6, 8) exactly, 0.612; the other rows are
    held out. Calibrating on the whole table would overstate the agreement. Result: every row
    within 14%, mean absolute error 4.6% over all rows and 4.0% over the held-out ones; the
    tests pin these numbers.

    Where the model is off, and why. It over-predicts the small models (+13% at 1.7B, +6% at
    3.6B): their narrow GEMMs (h = 2304, 96-wide heads) run further from peak than wide ones, and
    the model has one efficiency for every GEMM size. The memory-bound term recovers part of this
    (without it the 1.7B error is +24%). ``ACTIVATION_PASSES`` was set from the kernel count, not
    fitted; 5 passes instead of 3 would bring the 1.7B error to +8.5% and the mean to 3.3%. It
    under-predicts the largest models (-7% at 530B, -5% at 1T): there the v = 1 bubble,
    (p - 1)/m = 12%, overstates what the paper's interleaved schedule paid (with v = 2 where the
    stage's layer count allows it, the 1T error is -2%). It knows nothing of their kernels (fused
    softmax, the [s, b, a, h] layout), of load imbalance between stages (the logit layer sits on
    the last) or of data loading and logging, which Table 1 includes.
    """
    table = []
    for i, row in enumerate(MEGATRON_2021_TABLE1):
        model, cluster, par = _table1_setup(row)
        time = iteration_time(model, cluster, par, compute_efficiency=compute_efficiency)
        predicted = tflops_per_gpu(model, cluster, par, compute_efficiency=compute_efficiency)
        table.append(
            {
                **dataclasses.asdict(row),
                "dp": par.dp,
                "micro_batches": par.micro_batches,
                "predicted_tflops": predicted,
                "error": predicted / row.tflops - 1,
                "calibration": i in CALIBRATION_ROWS,
                "fractions": time.fractions(),
            }
        )
    return table
