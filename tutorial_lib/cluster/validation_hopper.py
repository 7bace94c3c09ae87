"""The cost model on Hopper: Megatron-Core's published H100 weak-scaling table, as a check of
the extrapolation from A100, not a calibration.

``MEGATRON_CORE_H100`` is the table of NVIDIA/Megatron-LM's README ("Training Speed and
Scalability", Megatron-Core r0.8.0, figure added in commit f2e5db402c): GPT models of 1.7B to
462B parameters on 48 to 6144 H100 GPUs, vocabulary 131,072, sequences of 4096 tokens, with the
per-GPU TFLOP/s it reports (Megatron's model-FLOP count, 72 B s l h^2 (1 + s/(6h) +
V/(12 l h)); the parameter counts match only with untied embeddings, which the cost model
does not distinguish). The README says every communication is overlapped with computation:
data-parallel (``--overlap-grad-reduce --overlap-param-gather``), tensor-parallel
(``--tp-comm-overlap``) and pipeline.

It does not state the micro-batch, recomputation, sequence parallelism or interleaving, so
``hopper_validation_table`` assumes (``H100_ASSUMED``) BF16, micro-batch 1, no recomputation,
sequence parallelism where TP > 1, an overlapped DP all-reduce, a distributed optimizer and
v = 1, on DGX H100 with the GEMM ceiling measured on an H200. The cost model charges TP
communication in full; the runs hid most of it, so the model is expected to be too slow where
TP communication is a large share of the step (TP 8 on small layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cost_terms import iteration_time, training_flops
from .gemm_model import gemm_model_for
from .specs import CLUSTERS, ModelSpec, ParallelConfig

__all__ = ["H100Run", "MEGATRON_CORE_H100", "H100_ASSUMED", "hopper_validation_table"]

H100_ASSUMED = (
    "BF16, micro-batch 1, no recomputation, sequence parallelism where TP > 1, overlapped DP "
    "all-reduce, distributed optimizer, v = 1; TP communication not overlapped (the runs did)"
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


def hopper_validation_table() -> list[dict[str, Any]]:
    """Per run: published and predicted seconds per iteration, the error (published /
    predicted - 1: negative when the model is too slow) and the modelled TP communication's
    share of the step, under ``H100_ASSUMED``."""
    cluster = CLUSTERS["DGX H100"]
    gemm = gemm_model_for(cluster.gpu)
    table = []
    for r in MEGATRON_CORE_H100:
        model = r.model()
        par = ParallelConfig(
            tp=r.tp,
            pp=r.pp,
            dp=r.dp,
            micro_batch=1,
            global_batch=r.batch,
            sequence_parallel=r.tp > 1,
            overlap_dp_comm=True,
            distributed_optimizer=True,
        )
        time = iteration_time(model, cluster.with_gpus(r.gpus), par, gemm=gemm)
        table.append(
            {
                "name": f"{r.params_b:g}B",
                "gpus": r.gpus,
                "tp": r.tp,
                "pp": r.pp,
                "dp": r.dp,
                "seconds": r.seconds,
                "predicted_seconds": time.total,
                "error": r.seconds / time.total - 1,
                "tp_comm_share": time.fractions()["tp_comm"],
            }
        )
    return table
