"""The cost model on Hopper: Megatron-Core's published H100 weak-scaling table fits Hopper's GEMM
ceiling on three runs and checks the model on the other six.

``MEGATRON_CORE_H100`` is the table of NVIDIA/Megatron-LM's README ("Training Speed and
Scalability", Megatron-Core r0.8.0, figure added in commit f2e5db402c): GPT models of 1.7B to
462B parameters on 48 to 6144 H100 GPUs, vocabulary 131,072, sequences of 4096 tokens, with the
per-GPU TFLOP/s it reports (Megatron's model-FLOP count, 72 B s l h^2 (1 + s/(6h) +
V/(12 l h)); the parameter counts match only with untied embeddings, which the cost model
does not distinguish). The README says every communication is overlapped with computation:
data-parallel (``--overlap-grad-reduce --overlap-param-gather``), tensor-parallel
(``--tp-comm-overlap``) and pipeline.

It does not state the micro-batch, recomputation, sequence parallelism or interleaving, so
``hopper_setup`` assumes (``H100_ASSUMED``) BF16, micro-batch 1, no recomputation, sequence
parallelism where TP > 1 (``--tp-comm-overlap`` needs it), TP communication overlapped with the
GEMMs (``ParallelConfig.overlap_tp_comm``), an overlapped DP reduce-scatter and parameter
all-gather with a distributed optimizer, and v = 1, on DGX H100.

One parameter is fitted, as the A100's ceiling was: the end-to-end GEMM ceiling
(``HOPPER_GEMM_CEILING``; the fit is recomputed in ``tests/test_gemm_model.py``), on the declared
runs ``HOPPER_CALIBRATION_RUNS`` (the smallest, a middle and the largest: 1.7B, 70B and 462B).
``validation.validation_summary`` of ``hopper_validation_table()`` reports the error on the six
held-out runs separately. The fitted
ceiling sits below the one a lone BF16 8192^3 GEMM reached on an H200
(``gemm_model``'s module docstring), as the A100's end-to-end ceiling sits below a lone
GEMM's: a training step's GEMMs share the GPU with everything the model does not list.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .cost_terms import iteration_time, training_flops
from .gemm_model import gemm_model_for
from .specs import CLUSTERS, ClusterSpec, ModelSpec, ParallelConfig

__all__ = [
    "H100Run",
    "MEGATRON_CORE_H100",
    "H100_ASSUMED",
    "HOPPER_CALIBRATION_RUNS",
    "hopper_setup",
    "hopper_validation_table",
]

H100_ASSUMED = (
    "BF16, micro-batch 1, no recomputation, sequence parallelism and overlapped TP communication "
    "where TP > 1, overlapped DP reduce-scatter and parameter all-gather, distributed optimizer, "
    "v = 1"
)
_VOCAB, _SEQ = 131072, 4096


@dataclass(frozen=True)
class H100Run:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    batch: int
    tflops: float  # per GPU, Megatron's model-FLOP count

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        return f"{self.params_b:g}B"

    def model(self) -> ModelSpec:
        return ModelSpec(
            layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=_VOCAB, seq=_SEQ
        )

    @property
    def seconds(self) -> float:
        """The iteration time the reported TFLOP/s implies (model FLOPs: no recomputation)."""
        return training_flops(self.model(), self.batch) / (self.gpus * self.tflops * 1e12)


MEGATRON_CORE_H100: tuple[H100Run, ...] = tuple(
    H100Run(*r)
    for r in (
        (1.7, 16, 2048, 24, 1, 1, 48, 192, 408.8),
        (7.1, 32, 4096, 30, 2, 1, 48, 192, 465.9),
        (16, 48, 6144, 32, 4, 1, 48, 192, 489.1),
        (32, 56, 7168, 48, 8, 1, 48, 192, 459.6),
        (70, 64, 8192, 84, 8, 2, 48, 384, 419.7),
        (119, 80, 10240, 92, 8, 4, 48, 768, 420.5),
        (177, 96, 12288, 96, 8, 6, 48, 1152, 432.8),
        (314, 128, 16384, 96, 8, 8, 48, 1536, 474.4),
        (462, 144, 18432, 112, 8, 16, 48, 3072, 459.9),
    )
)


HOPPER_CALIBRATION_RUNS = ("1.7B", "70B", "462B")
# gemm_model.HOPPER_GEMM_CEILING was fitted on these runs; a test recomputes it.


def hopper_setup(run: H100Run) -> tuple[ModelSpec, ClusterSpec, ParallelConfig]:
    """The model, the DGX H100 cluster and the split of ``run`` under ``H100_ASSUMED``."""
    par = ParallelConfig(
        tp=run.tp,
        pp=run.pp,
        dp=run.dp,
        micro_batch=1,
        global_batch=run.batch,
        sequence_parallel=run.tp > 1,
        overlap_tp_comm=run.tp > 1,
        overlap_dp_comm=True,
        distributed_optimizer=True,
    )
    return run.model(), CLUSTERS["DGX H100"].with_gpus(run.gpus), par


def hopper_validation_table(ceiling: float | None = None) -> list[dict[str, Any]]:
    """Per run: published and predicted seconds per iteration, the error (published /
    predicted - 1: negative when the model is too slow), whether the run calibrated the
    ceiling, the modelled TP communication's share of the step before and after overlap, and
    the error if TP communication were charged in full (``error_tp_charged``), under
    ``H100_ASSUMED`` at ``ceiling`` (default ``HOPPER_GEMM_CEILING``)."""
    table = []
    for r in MEGATRON_CORE_H100:
        model, cluster, par = hopper_setup(r)
        gemm = gemm_model_for(cluster.gpu, ceiling)
        time = iteration_time(model, cluster, par, gemm=gemm)
        plain = iteration_time(model, cluster, replace(par, overlap_tp_comm=False), gemm=gemm)
        table.append(
            {
                "name": r.name,
                "gpus": r.gpus,
                "tp": r.tp,
                "pp": r.pp,
                "dp": r.dp,
                "calibration": r.name in HOPPER_CALIBRATION_RUNS,
                "seconds": r.seconds,
                "predicted_seconds": time.total,
                "error": r.seconds / time.total - 1,
                "tp_comm_share": plain.fractions()["tp_comm"],
                "tp_comm_exposed_share": time.fractions()["tp_comm"],
                "error_tp_charged": r.seconds / plain.total - 1,
            }
        )
    return table
