"""Tensor parallelism on torch.distributed (gloo on a CPU, NCCL on GPUs), with uneven and
non-contiguous shards, and nonuniform tensor parallelism (a replica that lost GPUs keeps training
at a lower TP degree).

- ``shard``: ``ShardMap``, which heads and FFN columns each TP rank owns; ``UnitSpec`` and
  ``unit_specs``: how each sharded parameter is cut into units; ``global_index``,
  ``split_by_unit``, ``join_units``: moving between full tensors, shards and single units.
- Tensor parallelism on torch.distributed: Megatron's operators (``comm``), the column/row-parallel
  layers (``tp_linear``) and the model transform (``tp_model``); the layout of a run (``mesh``);
  starting processes with spawn or torchrun (``launch``).
- Nonuniform tensor parallelism: planning after failures and degraded shard maps (``ntp``), the
  process groups and gradient all-reduce of a DP x nonuniform-TP job (``ntp_grads``);
  ``jobs.ntp_workers`` holds its spawned training job.

Import from the modules themselves (``from tutorial_lib.parallel.shard import ShardMap``). The
numpy-only cluster simulation (cost model, failures, planning after failures) is
``tutorial_lib.cluster``.
"""
