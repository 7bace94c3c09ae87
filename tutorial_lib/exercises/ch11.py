"""Exercise 11.1: the expected availability of a replica under random failures, checked against
``cluster.failures.expected_replica_availability``."""

from __future__ import annotations

from ..cluster.failures import expected_replica_availability
from .base import Case, Exercise

STUB = '''\
def replica_survival(
    n_gpus: int, gpus_per_replica: int, n_failed: int
) -> float:
    """Probability that one replica of gpus_per_replica GPUs has no
    failed GPU, when n_failed of the cluster's n_gpus GPUs have
    failed, placed uniformly at random (no GPU twice).

    By linearity this is also the expected fraction of replicas that
    can still train under uniform tensor parallelism.
    """
    raise NotImplementedError
'''

TASK = (
    "With uniform tensor parallelism a replica is out as soon as one of its GPUs fails. Place "
    "`n_failed` failures uniformly at random on distinct GPUs of the cluster and compute the "
    "chance that a given replica of k = `gpus_per_replica` GPUs avoids all of them: the "
    "number of ways to put every failure outside the replica over the number of ways to put "
    "them anywhere. (For few failures it is close to (1 - p)^k with p = n_failed / n_gpus; "
    "the check wants the exact count.)"
)


def _cases() -> list[Case]:
    rows = [
        (16384, 8, 32, "Llama 3 scale, TP 8, 32 GPUs down"),
        (16384, 64, 160, "TP 64, 1% of GPUs down"),
        (72, 72, 1, "one NVL72 domain as one replica, one failure"),
        (1000, 1, 999, "a one-GPU replica, all but one GPU down"),
        (8, 8, 0, "no failures"),
        (8, 4, 5, "more failures than GPUs outside the replica"),
        (4608, 36, 23, "odd numbers"),
    ]
    return [
        Case(
            f"{what}: n_gpus {n}, gpus_per_replica {k}, n_failed {f}",
            {"n_gpus": n, "gpus_per_replica": k, "n_failed": f},
        )
        for n, k, f, what in rows
    ]


EXERCISES = [
    Exercise(
        id="11.1",
        title="how likely a replica survives random failures",
        function="replica_survival",
        signature="replica_survival(n_gpus: int, gpus_per_replica: int, n_failed: int) -> float",
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=expected_replica_availability,
        reference_name="tutorial_lib.cluster.failures.expected_replica_availability",
    )
]
