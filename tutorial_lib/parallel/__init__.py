"""Tensor parallelism on torch.distributed (gloo on a CPU, NCCL on GPUs), with uneven and
non-contiguous shards, and nonuniform tensor parallelism (a replica that lost GPUs keeps training
at a lower TP degree).

- ``shard``: ``ShardMap``, which heads and FFN columns each TP rank owns; ``UnitSpec`` and
  ``unit_specs``: how each sharded parameter is cut into units; ``global_index``,
  ``split_by_unit``, ``join_units``: moving between full tensors, shards and single units.

The numpy-only cluster simulation (cost model, failures, planning after failures) is
``tutorial_lib.cluster``.
"""

from .shard import (
    ShardMap,
    UnitSpec,
    global_index,
    join_units,
    split_by_unit,
    split_evenly,
    unit_specs,
)

__all__ = [
    "ShardMap",
    "UnitSpec",
    "unit_specs",
    "split_evenly",
    "global_index",
    "split_by_unit",
    "join_units",
]

# Tensor parallelism on torch.distributed: Megatron's operators (comm), the column/row-parallel
# layers (tp_linear) and the model transform (tp_model); the layout of a run (mesh); starting
# processes with spawn or torchrun (launch).
from .comm import (
    CopyToTensorParallel,
    GatherFromSequenceParallel,
    ReduceFromTensorParallel,
    ScatterToSequenceParallel,
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    scatter_to_sp,
)
from .launch import DistEnv, SpawnError, init_from_env, spawn
from .mesh import ParallelDims
from .tp_linear import ColumnParallelLinear, RowParallelLinear
from .tp_model import (
    TPLayers,
    TPSpec,
    gather_full,
    gather_full_state_dict,
    parallelize,
    shard_state_dict,
)

__all__ += [
    "CopyToTensorParallel",
    "ReduceFromTensorParallel",
    "GatherFromSequenceParallel",
    "ScatterToSequenceParallel",
    "copy_to_tp",
    "reduce_from_tp",
    "gather_from_sp",
    "scatter_to_sp",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TPLayers",
    "parallelize",
    "TPSpec",
    "shard_state_dict",
    "gather_full",
    "gather_full_state_dict",
    "spawn",
    "SpawnError",
    "init_from_env",
    "DistEnv",
    "ParallelDims",
]

# Nonuniform tensor parallelism: planning after failures and degraded shard maps (ntp), the
# process groups and gradient all-reduce of a DP x nonuniform-TP job (ntp_grads); ntp_workers
# holds its spawned training job.
from .ntp import (  # noqa: E402 (after the TP exports above)
    NTPPlan,
    ReplicaPlan,
    Route,
    degraded_shard_map,
    local_batch,
    plan_ntp,
    reshard_routes,
    token_weights,
)
from .ntp_grads import (  # noqa: E402
    NTPRank,
    build_ntp_groups,
    ntp_allreduce_grads,
    reshard_from_core,
    reshard_to_core,
)

__all__ += [
    "NTPPlan",
    "ReplicaPlan",
    "plan_ntp",
    "degraded_shard_map",
    "Route",
    "reshard_routes",
    "local_batch",
    "token_weights",
    "NTPRank",
    "build_ntp_groups",
    "reshard_to_core",
    "reshard_from_core",
    "ntp_allreduce_grads",
]
