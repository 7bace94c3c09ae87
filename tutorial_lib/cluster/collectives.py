"""All-reduce time by algorithm: ring, double binary tree, and NVLink SHARP (in-switch reduction).

For an all-reduce of S bytes over n ranks on links of bandwidth B per direction (NCCL's own
cost model, ``src/graph/tuning.cc``, and nccl-tests' ``doc/PERFORMANCE.md``):

- **ring**: every rank sends and receives 2 (n-1)/n x S, in 2 (n-1) steps, so its latency grows
  linearly with n: ``2 (n-1)/n S / B + 2 (n-1) x step``.
- **tree** (double binary tree, NCCL >= 2.4; between nodes only, chains inside one): about the
  same bytes (NCCL models its bandwidth as 0.5 x 0.92 of the bus bandwidth, so
  ``S / (0.46 B)``), but ``2 log2(n)`` steps: it wins at scale for small messages.
- **nvls** (NVLink SHARP, NCCL >= 2.17, Hopper and Blackwell NVSwitch; not A100): the switch
  adds the contributions, so each GPU moves about S (n+1)/n each way instead of 2 (n-1)/n S
  (NCCL's maintainer, nccl-tests PR #239: algbw = B n/(n+1)). Measured on 8 x H100: bus
  bandwidth 370 GB/s with rings, 480 GB/s with NVLS, i.e. algorithm bandwidth 211 -> 275 GB/s,
  +30% (NVIDIA/nccl issues #1442 and #2140). Reduce-scatter and all-gather gain nothing from it
  (issue #1083), so sequence parallelism's collectives stay on rings.

``allreduce_time`` charges one algorithm; ``best_allreduce`` picks the fastest allowed, as
NCCL's tuner does. Efficiencies (achieved over link bandwidth) come from ``ClusterSpec``. Ring
bytes are ``tp_traffic.allreduce_bytes``; that module's ``"nvls"`` is the switch's ideal, S each
way, where NCCL's NVLS moves S (n+1)/n, which is what is timed here.
"""

from __future__ import annotations

import math

from .tp_traffic import allreduce_bytes

__all__ = [
    "ALGORITHMS",
    "allreduce_time",
    "best_allreduce",
]

ALGORITHMS = ("ring", "tree", "nvls")
_TREE_BW = 0.5 * 0.92  # NCCL's tree all-reduce: algbw = 0.5 x 0.92 x bus bandwidth


def allreduce_time(
    nbytes: float,
    ranks: int,
    bandwidth: float,
    efficiency: float,
    algorithm: str = "ring",
    latency: float = 0.0,
    step_latency: float = 0.0,
) -> float:
    """Seconds for an all-reduce of ``nbytes`` over ``ranks`` on links of ``bandwidth`` bytes/s
    per direction reached at ``efficiency``: a fixed ``latency`` plus ``step_latency`` per
    sequential step of the algorithm (module docstring). 0 for one rank."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}.")
    if (
        not isinstance(ranks, int)
        or ranks < 1
        or nbytes < 0
        or bandwidth <= 0
        or not 0 < efficiency <= 1
        or latency < 0
        or step_latency < 0
    ):
        raise ValueError(
            "Need an integer ranks >= 1, nbytes >= 0, bandwidth > 0, efficiency in (0, 1] and "
            f"latencies >= 0; got {ranks}, {nbytes}, {bandwidth}, {efficiency}, {latency}, "
            f"{step_latency}."
        )
    if ranks == 1:
        return 0.0
    bw = efficiency * bandwidth
    if algorithm == "ring":
        return latency + 2 * (ranks - 1) * step_latency + allreduce_bytes(nbytes, ranks) / bw
    if algorithm == "tree":
        steps = 2 * math.ceil(math.log2(ranks))
        return latency + steps * step_latency + nbytes / (_TREE_BW * bw)
    return latency + step_latency + nbytes * (ranks + 1) / ranks / bw


def best_allreduce(
    nbytes: float,
    ranks: int,
    bandwidth: float,
    efficiency: float,
    algorithms: tuple[str, ...] = ("ring", "tree"),
    latency: float = 0.0,
    step_latency: float = 0.0,
    nvls_efficiency: float | None = None,
) -> tuple[str, float]:
    """(algorithm, seconds) of the fastest of ``algorithms``; ``nvls`` runs at
    ``nvls_efficiency`` (default ``efficiency``)."""
    times = {
        a: allreduce_time(
            nbytes,
            ranks,
            bandwidth,
            (nvls_efficiency or efficiency) if a == "nvls" else efficiency,
            a,
            latency,
            step_latency,
        )
        for a in algorithms
    }
    best = min(times, key=lambda a: times[a])
    return best, times[best]
