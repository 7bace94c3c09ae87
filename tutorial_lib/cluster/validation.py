"""The cost model against published training runs.

Two models are validated:

- **One efficiency for every GEMM** (``validation_table``): Table 1 of Narayanan et al. 2021
  (arXiv 2104.04473), ten weak-scaling runs of GPT models from 1.7B to 1T parameters on A100
  GPUs (``MEGATRON_2021_TABLE1``), one calibrated parameter (``A100_COMPUTE_EFFICIENCY``).
- **GEMM efficiency from the shape** (``gemm_validation_table``, ``cluster.gemm_model``): 25
  published runs from three papers (``PUBLISHED_RUNS``): Table 1 again, Korthikanti et al. 2022
  (arXiv 2205.05198) Table 5 and section 6.3 (22B to 1T, full recomputation against selective
  recomputation with sequence parallelism, interleaved schedule with 3 chunks where they used
  it), and the PTD-P rows of Narayanan et al.'s Table 2 (175B and 530B on 384 to 2240 GPUs).
  Fitted: the A100 GEMM ceiling (``A100_GEMM_CEILING``) and the tile shape (256 x 128 of the
  three tried), on Table 1's rows 1, 3, 5, 7 and 9 only. Every other row is held out;
  ``validation_summary`` reports the held-out error separately (for this table and for
  ``validation_hopper``'s).

The fits themselves (a bisection and a golden-section search over the calibration rows) are in
``tests/test_cost_model.py`` and ``tests/test_gemm_model.py``, which recompute every fitted
constant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cost_terms import iteration_time, tflops_per_gpu, training_flops
from .gemm_model import A100_GEMM_CEILING, gemm_model_for
from .specs import CLUSTERS, ClusterSpec, ModelSpec, ParallelConfig

__all__ = [
    "Table1Row",
    "MEGATRON_2021_TABLE1",
    "CALIBRATION_ROWS",
    "A100_COMPUTE_EFFICIENCY",
    "validation_table",
    "PublishedRun",
    "PUBLISHED_RUNS",
    "CALIBRATION_RUNS",
    "gemm_validation_table",
    "validation_summary",
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
A100_COMPUTE_EFFICIENCY = 0.6116  # fitted on CALIBRATION_ROWS, rounded; a test recomputes it


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


# ---- GEMM efficiency from the shape, against three publications -----------------------------


@dataclass(frozen=True)
class PublishedRun:
    """One published training run on A100 80GB (Selene: DGX A100 nodes, 8 x 200 Gb/s HDR).

    ``seconds`` is the iteration time: printed by the source, or derived from its TFLOP/s per
    GPU with its own FLOP count (``derived``: full recomputation's 96 B s l h^2 (1 + s/(6h) +
    V/(16 l h)), which reproduces the printed numbers). ``assumed`` says what the source does
    not state. V = 51,200 and s = 2048 in all three papers; mixed precision (16-bit)."""

    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    recompute: str
    sequence_parallel: bool
    virtual_stages: int
    seconds: float
    derived: bool = False
    assumed: str = ""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def setup(self) -> tuple[ModelSpec, ClusterSpec, ParallelConfig]:
        model = ModelSpec(
            layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=51200, seq=2048
        )
        par = ParallelConfig(
            tp=self.tp,
            pp=self.pp,
            dp=self.dp,
            micro_batch=self.micro_batch,
            global_batch=self.global_batch,
            recompute=self.recompute,
            sequence_parallel=self.sequence_parallel,
            virtual_stages=self.virtual_stages,
            dtype="fp16",
            grad_bytes=2,
        )
        return model, CLUSTERS["DGX A100 (Selene)"].with_gpus(self.gpus), par


def _from_tflops(row: PublishedRun, tflops: float) -> PublishedRun:
    model, _, _ = row.setup()
    seconds = training_flops(model, row.global_batch, "full") / (row.gpus * tflops * 1e12)
    return dataclasses.replace(row, seconds=seconds, derived=True)


_T1 = "Narayanan et al. 2021, Table 1"
_T2 = "Narayanan et al. 2021, Table 2 (PTD-P)"
_K5 = "Korthikanti et al. 2022, Table 5"
_V1 = "v = 1: the interleaved schedule was used, with an unstated number of chunks"


def _published_runs() -> tuple[PublishedRun, ...]:
    runs = [
        _from_tflops(
            PublishedRun(
                f"T1 {r.params_b:g}B", _T1, r.layers, r.hidden, r.heads, r.tp, r.pp,
                r.gpus // (r.tp * r.pp), 1, r.batch, "full", False, 1, 0.0,
                assumed="micro-batch 1; " + _V1,
            ),
            r.tflops,
        )
        for r in MEGATRON_2021_TABLE1
    ]  # fmt: skip
    for size, shape, (tp, pp, mb, batch), v, (full, selective) in (
        ("22B", (48, 6144, 64), (8, 1, 4, 4), 1, (1.42, 1.10)),
        ("175B", (96, 12288, 96), (8, 8, 1, 64), 3, (18.13, 13.75)),
        ("530B", (105, 20480, 128), (8, 35, 1, 280), 3, (49.05, 37.83)),
        ("1T", (128, 25600, 160), (8, 64, 1, 512), 1, (94.42, 71.49)),
    ):
        for recompute, sp, seconds in (("full", False, full), ("selective", True, selective)):
            runs.append(
                PublishedRun(
                    f"K {size} {recompute}", _K5, *shape, tp, pp, 1, mb, batch, recompute,
                    sp, v, seconds,
                )
            )  # fmt: skip
    runs.append(
        PublishedRun(
            "K 530B selective dp8", "Korthikanti et al. 2022, sec. 6.3", 105, 20480, 128, 8,
            35, 8, 1, 2240, "selective", True, 3, 39.15,
            assumed="global batch 8 x 280 (the batch per model instance is kept)",
        )
    )  # fmt: skip
    for shape, (tp, pp), batch, points in (
        ((96, 12288, 96), (8, 12), 1536, ((4, 153), (8, 149), (16, 141))),
        ((105, 20480, 128), (8, 35), 2240, ((2, 171), (4, 167), (8, 159))),
    ):
        for dp, tflops in points:
            name = f"T2 {'175B' if shape[0] == 96 else '530B'} {tp * pp * dp} GPUs"
            assumed = "full recomputation; " + _V1
            if shape[0] == 96:
                assumed = "tp 8 x pp 12 (the table prints model-parallel size 96); " + assumed
            row = PublishedRun(
                name, _T2, *shape, tp, pp, dp, 1, batch, "full", False, 1, 0.0, assumed=assumed
            )
            runs.append(_from_tflops(row, tflops))
    return tuple(runs)


PUBLISHED_RUNS: tuple[PublishedRun, ...] = _published_runs()
CALIBRATION_RUNS = tuple(f"T1 {MEGATRON_2021_TABLE1[i].params_b:g}B" for i in CALIBRATION_ROWS)
# The A100's tile and ceiling (gemm_model.A100_GEMM_TILE, A100_GEMM_CEILING) were chosen on the
# calibration rows above; a test recomputes them.


def gemm_validation_table(ceiling: float = A100_GEMM_CEILING) -> list[dict]:
    """Every run of ``PUBLISHED_RUNS``: measured and predicted seconds per iteration, the error
    (measured / predicted - 1: positive when the model is too fast, as a TFLOP/s error would
    read), whether the run calibrated the ceiling, and the predicted time's parts."""
    gemm = gemm_model_for(CLUSTERS["DGX A100 (Selene)"].gpu, ceiling)
    table = []
    for r in PUBLISHED_RUNS:
        time = iteration_time(*r.setup(), gemm=gemm)
        table.append(
            {
                **dataclasses.asdict(r),
                "gpus": r.gpus,
                "predicted_seconds": time.total,
                "error": r.seconds / time.total - 1,
                "calibration": r.name in CALIBRATION_RUNS,
                "fractions": time.fractions(),
            }
        )
    return table


def validation_summary(table: list[dict]) -> dict[str, float]:
    """Mean and largest absolute error over the calibration rows and over the held-out rows of
    ``table`` (``gemm_validation_table``'s or ``validation_hopper.hopper_validation_table``'s)."""
    out: dict[str, float] = {}
    for key, rows in (
        ("calibration", [r for r in table if r["calibration"]]),
        ("held_out", [r for r in table if not r["calibration"]]),
    ):
        errors = [abs(r["error"]) for r in rows]
        out[f"{key}_rows"] = len(errors)
        out[f"{key}_mean_abs_error"] = sum(errors) / len(errors)
        out[f"{key}_max_abs_error"] = max(errors)
    return out
