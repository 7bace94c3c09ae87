"""What tensor parallelism costs in communication, and when the links can keep up.

Megatron-style TP (Shoeybi et al. 2019; Narayanan et al. 2021, arXiv 2104.04473) runs, per
transformer layer and micro-batch, two all-reduces of the (b, s, h) activations in the forward
pass (after the attention and after the MLP, ``g``) and two in the backward pass (``f``'s
gradients). A ring all-reduce of S bytes over t ranks sends and receives ``2 S (t - 1) / t``
bytes per rank, so per layer and rank the traffic is ``4 * 2 * b s h (t - 1) / t`` elements,
the ``8 b s h (t - 1) / t`` of Narayanan et al. With sequence parallelism (Korthikanti et al.
2022, arXiv 2205.05198) each all-reduce becomes a reduce-scatter plus an all-gather: the same
bytes, but LayerNorm and dropout work on 1/t of the sequence.

The compute of a layer is ``24 b s h^2`` FLOPs forward (QKV, projection and MLP GEMMs, without
attention scores) and twice that backward; TP divides it by t. So the ratio of FLOPs to network
bytes, the layer's *network intensity*, is ``72 b s h^2 / t`` over ``8 b s h (t-1)/t * bytes``
= ``9 h / ((t - 1) * bytes)``: it grows with the width and falls with the degree. Compare it
with the *ridge* ``peak FLOP/s / link bytes/s`` of a roofline whose roof is the link instead of
HBM: above the ridge the GEMMs can hide the communication, below it the link is the bottleneck.

The all-reduce algorithm sets the bytes (``algorithm=``): ``"ring"`` (above, and over
InfiniBand) or ``"nvls"``, NVLink SHARP: the third-generation NVSwitch adds the GPUs' buffers
inside the switch (NVIDIA 2022, the NVSwitch technical blog), and NCCL uses it through its NVLS
algorithms (NCCL 2.17/2.18 release notes). Each GPU then sends its buffer to the switch once and
receives the sum once: ``S`` bytes each way instead of ``2 S (t - 1) / t``, and the intensity
becomes ``18 h / (t * bytes)``. That is the algorithmic byte count, the ideal the switch allows;
NCCL's achieved NVLS bandwidth is a measurement, not this model. Only an NVSwitch domain
(NVLink inside a DGX/HGX H100) offers it.

All functions are models from datasheet numbers: a measurement would add latency, imperfect
overlap and the all-reduce algorithm NCCL actually picks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import flops
from ..checks import check_positive_int
from ..hardware import DeviceSpec
from .specs import CLUSTERS

__all__ = [
    "Link",
    "LINKS",
    "ALLREDUCE_ALGORITHMS",
    "allreduce_factor",
    "allreduce_bytes",
    "tp_layer_comm_bytes",
    "tp_layer_flops",
    "tp_network_intensity",
    "link_ridge",
    "ridge_width",
    "ridge_degree",
    "tp_layer_times",
]

# "ring": reduce-scatter + all-gather over point-to-point links; "nvls": NVLink SHARP, the sum
# computed in the NVSwitch.
ALLREDUCE_ALGORITHMS = ("ring", "nvls")


@dataclass(frozen=True)
class Link:
    """One interconnect: bytes/s per GPU in one direction, and where the number comes from."""

    name: str
    bandwidth: float
    source: str


LINKS: dict[str, Link] = {
    "NVLink 4 (H100/H200 SXM)": Link(
        "NVLink 4 (H100/H200 SXM)",
        CLUSTERS["DGX H100"].nvlink_bandwidth,
        "H100 datasheet: 900 GB/s bidirectional NVLink per GPU",
    ),
    "InfiniBand NDR (one 400 Gb/s port per GPU)": Link(
        "InfiniBand NDR (one 400 Gb/s port per GPU)",
        400e9 / 8,
        "DGX H100 datasheet: eight ConnectX-7 400 Gb/s ports for eight GPUs",
    ),
}


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}.")


def allreduce_factor(ranks: int, algorithm: str = "ring") -> float:
    """Bytes each rank sends (and receives) per byte of the buffer it all-reduces.

    ``ring``: 2 (t - 1) / t, a reduce-scatter and an all-gather each moving (t - 1)/t of it.
    ``nvls``: 1, the buffer goes to the switch once and the sum comes back once.
    0 for both at t = 1: nothing to reduce."""
    check_positive_int(ranks, "ranks")
    _check_algorithm(algorithm)
    if ranks == 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks if algorithm == "ring" else 1.0


def allreduce_bytes(nbytes: float, ranks: int, algorithm: str = "ring") -> float:
    """Bytes each rank sends (and receives) in an all-reduce of ``nbytes`` over ``ranks``."""
    return nbytes * allreduce_factor(ranks, algorithm)


def tp_layer_comm_bytes(
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    dtype_bytes: int = 2,
    backward: bool = True,
    algorithm: str = "ring",
) -> float:
    """Bytes one TP rank sends per transformer layer: two all-reduces of the (b, s, h)
    activations forward, two more backward (``backward=False``: forward only)."""
    activation = batch * seq * hidden * dtype_bytes
    count = 4 if backward else 2
    return count * allreduce_bytes(activation, tp, algorithm)


def tp_layer_flops(batch: int, seq: int, hidden: int, tp: int, backward: bool = True) -> float:
    """GEMM FLOPs one TP rank does per layer: 24 b s h^2 forward (x3 with backward), / t
    (``flops.tp_layer_flops`` for b s tokens)."""
    return flops.tp_layer_flops(batch * seq, hidden, tp, backward)


def tp_network_intensity(
    hidden: int, tp: int, dtype_bytes: int = 2, algorithm: str = "ring"
) -> float:
    """FLOPs per network byte of a TP layer (forward + backward): 72 b s h^2 / t over
    4 b s h * bytes * factor, i.e. 9 h / ((t - 1) bytes) for a ring and 18 h / (t bytes) with
    NVLS. Infinite at t = 1, where nothing is communicated."""
    factor = allreduce_factor(tp, algorithm)
    if factor == 0.0:
        return float("inf")
    return 18.0 * hidden / (tp * factor * dtype_bytes)


def link_ridge(spec: DeviceSpec, link: Link, dtype: str = "bf16") -> float:
    """FLOPs per byte at which the GPU's peak and the link's bandwidth take equal time."""
    peak = spec.peak(dtype)
    if peak is None:
        raise ValueError(f"{spec.name} has no {dtype} peak in the spec table.")
    return peak / link.bandwidth


def ridge_width(
    spec: DeviceSpec,
    link: Link,
    tp: int,
    dtype: str = "bf16",
    dtype_bytes: int = 2,
    algorithm: str = "ring",
) -> float:
    """The hidden size at which a TP layer's intensity equals the link's ridge: wider layers
    are compute-bound. ``ridge * t * factor * bytes / 18``: for a ring in BF16,
    ``ridge * (t - 1) * 2 / 9``; with NVLS, ``ridge * t / 9``. 0 at t = 1 (no communication)."""
    factor = allreduce_factor(tp, algorithm)
    return link_ridge(spec, link, dtype) * tp * factor * dtype_bytes / 18.0


def ridge_degree(
    hidden: int,
    spec: DeviceSpec,
    link: Link,
    dtype: str = "bf16",
    dtype_bytes: int = 2,
    algorithm: str = "ring",
) -> float:
    """The TP degree (a real number, at least 1) at which a layer of width ``hidden`` reaches
    the link's ridge: below it the GEMMs outlast the transfers. From the intensity,
    ``1 + 9 h / (ridge * bytes)`` for a ring, ``18 h / (ridge * bytes)`` with NVLS."""
    check_positive_int(hidden, "hidden")
    _check_algorithm(algorithm)
    x = 18.0 * hidden / (link_ridge(spec, link, dtype) * dtype_bytes)  # t * factor at the ridge
    t = 1.0 + x / 2.0 if algorithm == "ring" else x  # ring: 2 (t - 1) = x; nvls: t = x
    return max(1.0, t)


def tp_layer_times(
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    spec: DeviceSpec,
    link: Link,
    dtype: str = "bf16",
    dtype_bytes: int = 2,
    algorithm: str = "ring",
) -> dict[str, float]:
    """Per layer and rank, forward + backward, at datasheet speed: ``compute_s`` (GEMMs at peak),
    ``comm_s`` (the four all-reduces on ``link``, by ``algorithm``) and ``exposed_fraction``,
    the share of the step the link would add if nothing overlapped (comm / (compute + comm))."""
    peak = spec.peak(dtype)
    if peak is None:
        raise ValueError(f"{spec.name} has no {dtype} peak in the spec table.")
    compute = tp_layer_flops(batch, seq, hidden, tp) / peak
    comm = tp_layer_comm_bytes(batch, seq, hidden, tp, dtype_bytes, algorithm=algorithm)
    comm /= link.bandwidth
    return {"compute_s": compute, "comm_s": comm, "exposed_fraction": comm / (compute + comm)}
