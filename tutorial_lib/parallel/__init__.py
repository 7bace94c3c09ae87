"""Tensor parallelism on torch.distributed (gloo on a CPU, NCCL on GPUs), with uneven and
non-contiguous shards, and nonuniform tensor parallelism (a replica that lost GPUs keeps training
at a lower TP degree).

- ``shard``: ``ShardMap``, which heads and FFN columns each TP rank owns; ``UnitSpec`` and
  ``unit_specs``: how each sharded parameter is cut into units; ``global_index``,
  ``split_by_unit``, ``join_units``: moving between full tensors, shards and single units.
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

__all__ = ["ShardMap", "UnitSpec", "unit_specs", "split_evenly", "global_index", "split_by_unit",
           "join_units"]  # fmt: skip
