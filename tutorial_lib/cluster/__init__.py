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
    ``explore``: chapter 11's plan explorer (matplotlib).

Import the modules themselves (``from tutorial_lib.cluster import plans``): this package
re-exports nothing.
"""
