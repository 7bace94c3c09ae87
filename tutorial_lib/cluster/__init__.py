"""A numpy-only simulation of GPT training on a GPU cluster: what tensor, pipeline and data
parallelism cost, how GPUs fail, and what a job keeps after failures with and without nonuniform
tensor parallelism (the NTP paper's simulation). Models of datasheet numbers, never measurements;
the runtime tensor parallelism on torch.distributed lives in ``tutorial_lib.parallel``.

The cost model
    ``tp_traffic``: TP communication per layer, ring all-reduces, link ridges.
    ``specs``: ``ModelSpec``, ``ClusterSpec`` (presets ``CLUSTERS``, ``GB200``),
    ``ParallelConfig``, ``check_config``.
    ``cost_terms``: the terms of an iteration (``training_flops``, ``dp_allreduce_time``,
    ``pipeline_bubble_fraction``, ...) and their sums ``iteration_time``, ``memory_per_gpu``,
    ``tflops_per_gpu``.
    ``gemm_model``: GEMM efficiency from the shape (tiles, waves, roofline, a ceiling per GPU).
    ``collectives``: ring, tree and NVLink SHARP all-reduces.
    ``validation``: the model against 25 published A100 runs (three papers), held-out error;
    ``validation_hopper``: Megatron-Core's H100 table: Hopper's ceiling fitted on 3 runs, 6 held out.
    ``domains``: NVL8 Hopper systems against NVL32 and NVL72 domains under failures.
Failures and plans
    ``failures``: the Llama 3 failure model, Monte Carlo traces, expected replica availability.
    ``replicas``: where given failures land (domains, replicas) and the replicas left whole.
    ``replica_cost``: ``TrainingJob`` and the step time of a healthy or degraded replica;
    ``PowerBoost``.
    ``plan_options``: what a degraded replica runs under each of ``PLAN_POLICIES``.
    ``packing``: packing damaged TP groups into replicas; scoring candidate plans.
    ``plans``: ``plan_cluster`` -> ``ClusterPlan`` (its docstring lists the modelling assumptions).
    ``monte_carlo``: throughput and availability over random failures; spare domains.
    ``goodput``: goodput when every failure restarts the job from its last checkpoint
    (``RestartCost``, ``simulate_goodput``); Young's and Daly's checkpoint intervals.
    ``reproduce`` and ``report``: the NTP paper's experiments (``ntp-reproduce``).
    ``explore``: chapter 11's plan explorer (matplotlib; imported on its own, not here).
"""

from .collectives import allreduce_time, best_allreduce
from .cost_terms import (
    Breakdown,
    activation_bytes_per_layer,
    dp_allreduce_time,
    iteration_time,
    memory_per_gpu,
    pipeline_bubble_fraction,
    tflops_per_gpu,
    tp_comm_bytes_per_layer,
    training_flops,
)
from .domains import DOMAIN_MODEL, domain_comparison, domain_jobs
from .failures import (
    FailureModel,
    FailureTrace,
    Recovery,
    expected_replica_availability,
    fraction_of_time_above,
    random_failures,
    simulate_trace,
)
from .gemm_model import GemmModel, gemm_model_for
from .goodput import (
    GoodputResult,
    IntervalSweep,
    RestartCost,
    daly_interval,
    expected_goodput,
    job_mtbf_hours,
    optimal_interval,
    simulate_goodput,
    young_interval,
)
from .monte_carlo import SpareResult, availability_samples, spare_domains, throughput_samples
from .packing import relative_throughput, slot_failures
from .plan_options import PLAN_POLICIES
from .plans import ClusterPlan, ReplicaAssignment, plan_cluster
from .replica_cost import PowerBoost, TrainingJob
from .replicas import replica_availability
from .report import format_report
from .reproduce import PAPER_CLUSTER, PAPER_MODEL, PAPER_REPORTED, ntp_reproduce
from .specs import CLUSTERS, GB200, ClusterSpec, ModelSpec, ParallelConfig, check_config
from .validation import (
    MEGATRON_2021_TABLE1,
    PUBLISHED_RUNS,
    PublishedRun,
    Table1Row,
    gemm_validation_table,
    validation_summary,
    validation_table,
)
from .validation_hopper import (
    MEGATRON_CORE_H100,
    hopper_validation_summary,
    hopper_validation_table,
)

__all__ = [
    # cost model
    "ModelSpec",
    "ClusterSpec",
    "ParallelConfig",
    "GB200",
    "CLUSTERS",
    "check_config",
    "Breakdown",
    "training_flops",
    "tp_comm_bytes_per_layer",
    "pipeline_bubble_fraction",
    "dp_allreduce_time",
    "activation_bytes_per_layer",
    "iteration_time",
    "memory_per_gpu",
    "tflops_per_gpu",
    "Table1Row",
    "MEGATRON_2021_TABLE1",
    "validation_table",
    "PUBLISHED_RUNS",
    "PublishedRun",
    "gemm_validation_table",
    "validation_summary",
    "MEGATRON_CORE_H100",
    "hopper_validation_table",
    "hopper_validation_summary",
    "allreduce_time",
    "best_allreduce",
    "GemmModel",
    "gemm_model_for",
    "DOMAIN_MODEL",
    "domain_comparison",
    "domain_jobs",
    # failures
    "Recovery",
    "FailureModel",
    "FailureTrace",
    "simulate_trace",
    "fraction_of_time_above",
    "random_failures",
    "replica_availability",
    "expected_replica_availability",
    # plans after failures
    "PLAN_POLICIES",
    "PowerBoost",
    "TrainingJob",
    "ReplicaAssignment",
    "ClusterPlan",
    "plan_cluster",
    "slot_failures",
    "relative_throughput",
    "throughput_samples",
    "availability_samples",
    "SpareResult",
    "spare_domains",
    # goodput with restarts
    "RestartCost",
    "GoodputResult",
    "IntervalSweep",
    "young_interval",
    "daly_interval",
    "expected_goodput",
    "job_mtbf_hours",
    "simulate_goodput",
    "optimal_interval",
    "PAPER_CLUSTER",
    "PAPER_MODEL",
    "PAPER_REPORTED",
    "ntp_reproduce",
    "format_report",
]
