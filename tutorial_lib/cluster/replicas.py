"""Where failed GPUs land: in which scale-up domain, in which data-parallel replica, and the
share of replicas a failure pattern leaves whole (with uniform TP, a replica with one failed GPU
is out). ``failed_indices`` checks a failure pattern (GPU indices or a bool mask) for the whole
planner. The chance of a whole replica under random failures is
``failures.expected_replica_availability``.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_positive_int

__all__ = ["failed_indices", "failed_per_domain", "failed_per_replica", "replica_availability"]


def failed_indices(failed: np.ndarray, n_gpus: int) -> np.ndarray:
    """Failed GPU indices from indices or an (n_gpus,) bool mask; checks range and duplicates."""
    failed = np.asarray(failed)
    if failed.dtype == bool:
        if failed.shape != (n_gpus,):
            raise ValueError(f"a failure mask must have shape ({n_gpus},), got {failed.shape}.")
        return np.flatnonzero(failed)
    if failed.size and not np.issubdtype(failed.dtype, np.integer):
        raise TypeError(f"failed GPU indices must be integers, got dtype {failed.dtype}.")
    failed = failed.astype(np.int64).ravel()
    if failed.size and (failed.min() < 0 or failed.max() >= n_gpus):
        raise ValueError(f"failed GPU indices must lie in [0, {n_gpus}).")
    if len(np.unique(failed)) != len(failed):
        raise ValueError("failed GPU indices contain duplicates; a GPU fails only once.")
    return failed


def _check_domains(n_gpus: int, domain_size: int) -> int:
    check_positive_int(n_gpus, "n_gpus")
    check_positive_int(domain_size, "domain_size")
    if n_gpus % domain_size:
        raise ValueError(
            f"n_gpus ({n_gpus}) must be a positive multiple of domain_size ({domain_size})."
        )
    return n_gpus // domain_size


def failed_per_domain(failed: np.ndarray, n_gpus: int, domain_size: int) -> np.ndarray:
    """(n_gpus // domain_size,) int64: failed GPUs in each scale-up domain (domain d holds GPUs
    ``d * domain_size`` to ``(d + 1) * domain_size - 1``). ``failed``: indices or a bool mask."""
    n_domains = _check_domains(n_gpus, domain_size)
    idx = failed_indices(failed, n_gpus)
    return np.bincount(idx // domain_size, minlength=n_domains).astype(np.int64)


def failed_per_replica(
    n_gpus: int, domain_size: int, tp: int, failed: np.ndarray, gpus_per_replica: int | None = None
) -> np.ndarray:
    """(n_replicas,) int64: failed GPUs in each data-parallel replica.

    Layout: a TP group is ``tp`` consecutive GPUs inside one scale-up domain; each domain holds
    ``domain_size // tp`` of them from its first GPU on, and its last ``domain_size % tp`` GPUs
    belong to no replica (e.g. TP 64 in a 72-GPU domain leaves 8 spares). A replica is
    ``gpus_per_replica // tp`` consecutive TP groups (default ``gpus_per_replica = tp``: one
    group; more when a replica also spans pipeline stages, possibly over several domains).
    """
    n_domains = _check_domains(n_gpus, domain_size)
    gpus_per_replica = tp if gpus_per_replica is None else gpus_per_replica
    if not 1 <= tp <= domain_size:
        raise ValueError(f"tp ({tp}) must lie in [1, domain_size={domain_size}].")
    if gpus_per_replica < tp or gpus_per_replica % tp:
        raise ValueError(f"gpus_per_replica ({gpus_per_replica}) must be a multiple of tp ({tp}).")
    per_domain, per_replica = domain_size // tp, gpus_per_replica // tp
    n_groups = n_domains * per_domain
    if n_groups % per_replica:
        raise ValueError(
            f"{n_groups} TP groups of {tp} do not split into replicas of "
            f"{per_replica} groups ({gpus_per_replica} GPUs)."
        )
    idx = failed_indices(failed, n_gpus)
    domain, offset = np.divmod(idx, domain_size)
    used = offset < per_domain * tp  # failures on a domain's spare GPUs hit no replica
    group = domain[used] * per_domain + offset[used] // tp
    return np.bincount(group // per_replica, minlength=n_groups // per_replica).astype(np.int64)


def replica_availability(
    n_gpus: int, domain_size: int, tp: int, failed: np.ndarray, gpus_per_replica: int | None = None
) -> float:
    """Fraction of data-parallel replicas without a failed GPU (layout: ``failed_per_replica``).

    With uniform TP a replica with one failed GPU is out, so this is the share of the cluster's
    replicas that can still train; for F failures placed uniformly at random its expectation is
    ``expected_replica_availability(n_gpus, gpus_per_replica, F)``.
    """
    counts = failed_per_replica(n_gpus, domain_size, tp, failed, gpus_per_replica)
    return float(np.mean(counts == 0))
