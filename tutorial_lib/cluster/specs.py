"""What a cost model is about: the model (``ModelSpec``), the cluster (``ClusterSpec``, with the
presets ``CLUSTERS`` and the per-GPU ``GB200``) and how a run is split over it
(``ParallelConfig``); ``check_config`` says whether a split can run a model on a cluster.

Placement follows Megatron's rank order (TP fastest, then DP, then PP): TP always lives inside a
scale-up domain (NVLink), DP groups use NVLink inside a domain and the scale-out network across
domains, and the pipeline crosses domains whenever the job is larger than one domain.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..checks import check_positive_ints
from ..hardware import SPECS, DeviceSpec

__all__ = [
    "ModelSpec",
    "ClusterSpec",
    "ParallelConfig",
    "GB200",
    "CLUSTERS",
    "RECOMPUTE",
    "DTYPES",
    "check_config",
]

GB200 = DeviceSpec(
    name="GB200 (per GPU, NVL72)",
    # GB200 NVL72 specs per rack, with sparsity: FP8 720 PF, FP16/BF16 360 PF, TF32 180 PF;
    # divided by 72 GPUs and by 2 for dense math.
    peak_flops={"tf32": 1.25e15, "bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5.0e15},
    hbm_bandwidth=8.0e12,  # 576 TB/s per rack / 72
    source="NVIDIA GB200 NVL72 specifications (rack totals / 72), dense values",
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT-2-style decoder: ``layers`` blocks of width ``hidden`` with ``heads`` heads, an MLP
    of width ``ffn`` (default ``4 * hidden``), tied embeddings for ``vocab`` tokens and learned
    positions up to ``seq``. Every Linear and LayerNorm has a bias, as in Megatron's GPT."""

    layers: int
    hidden: int
    heads: int
    ffn: int | None = None
    vocab: int
    seq: int
    name: str = ""

    def __post_init__(self) -> None:
        if self.ffn is None:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        check_positive_ints(self, ("layers", "hidden", "heads", "ffn", "vocab", "seq"))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}.")

    @property
    def ffn_width(self) -> int:
        """The MLP's hidden width (``ffn``, which ``__post_init__`` fills in when not given)."""
        return 4 * self.hidden if self.ffn is None else self.ffn

    def layer_params(self) -> int:
        """QKV and projection 4h^2 + 4h, MLP 2hf + f + h, two LayerNorms 4h."""
        h, f = self.hidden, self.ffn_width
        return 4 * h * h + 2 * h * f + f + 9 * h

    def params(self) -> int:
        """``l (4h^2 + 2hf + f + 9h) + (V + s) h``. With f = 4h this is Narayanan et al.'s eq. (2),
        12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)): the 12 l h^2 term is 4h^2 of attention plus the
        MLP's 2hf = 8h^2, so a different ``ffn`` changes only the MLP part. Like eq. (2), this
        leaves out the final LayerNorm (2h parameters)."""
        return self.layers * self.layer_params() + (self.vocab + self.seq) * self.hidden


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """GPUs joined by a scale-up domain (NVLink/NVSwitch) and a scale-out network.

    Bandwidths are bytes/s per GPU in one direction. ``collective_efficiency`` is the fraction
    of link bandwidth a large NCCL collective reaches: nccl-tests reports all-reduce bus
    bandwidths of about 200-208 GB/s on 8 A100 SXM (300 GB/s NVLink; nccl-tests issues #149 and
    #178), i.e. 0.67-0.69, and 85-96 of 100 GB/s over HDR InfiniBand (issue #119). 0.7 takes the
    NVLink figure for both. ``collective_latency`` is an assumed fixed cost per collective.
    """

    name: str
    gpu: DeviceSpec
    n_gpus: int
    domain_size: int  # GPUs per scale-up domain: 8 for a DGX, 72 for GB200 NVL72
    nvlink_bandwidth: float
    scaleout_bandwidth: float
    collective_efficiency: float = 0.7
    collective_latency: float = 20e-6
    # NVLink SHARP in the scale-up domain's switches (Hopper/Blackwell NVSwitch; not A100): the
    # all-reduce runs at nvls_efficiency of the link bandwidth on S (n+1)/n bytes
    # (cluster.collectives). step_latency: per sequential step of an all-reduce across
    # domains (NCCL's network hop latency, Simple protocol: 14 us; tuning.cc), so rings grow
    # with the domain count and trees with its logarithm.
    in_switch_reduction: bool = False
    nvls_efficiency: float = 0.69
    step_latency: float = 14e-6
    source: str = ""

    def __post_init__(self) -> None:
        check_positive_ints(self, ("n_gpus", "domain_size"))
        if self.nvlink_bandwidth <= 0 or self.scaleout_bandwidth <= 0:
            raise ValueError(f"{self.name}: link bandwidths must be positive.")
        if not 0 < self.collective_efficiency <= 1 or self.collective_latency < 0:
            raise ValueError(
                f"{self.name}: collective_efficiency must be in (0, 1] and collective_latency >= 0."
            )
        if not 0 < self.nvls_efficiency <= 1 or self.step_latency < 0:
            raise ValueError(f"{self.name}: nvls_efficiency must be in (0, 1], step_latency >= 0.")
        small = self.n_gpus <= self.domain_size and self.domain_size % self.n_gpus == 0
        if not small and self.n_gpus % self.domain_size:
            raise ValueError(
                f"{self.name}: n_gpus={self.n_gpus} must divide or be a multiple "
                f"of domain_size={self.domain_size}."
            )

    def with_gpus(self, n_gpus: int) -> ClusterSpec:
        return dataclasses.replace(self, n_gpus=n_gpus)


_IB_400G = 400e9 / 8  # one 400 Gb/s ConnectX-7 port per GPU
# nccl-tests all-reduce on 8 GPUs, NVLS off -> on (NVIDIA/nccl issue #2140): H100 bus bandwidth
# 370 -> 480 GB/s, algorithm bandwidth 211 -> 275 GB/s; B300 695 -> 845 and 397 -> 483. As
# fractions of the 450 (900) GB/s line rate: rings reach 370/450 = 0.82 (695/900 = 0.77); NVLS
# moves S (n+1)/n bytes in S/algbw seconds, 9/8 x 275/450 = 0.69 (9/8 x 483/900 = 0.60).
_HOPPER_NCCL = {"collective_efficiency": 0.82, "in_switch_reduction": True, "nvls_efficiency": 0.69}
_HOPPER_NCCL_SOURCE = "nccl-tests on 8 x H100 (NVIDIA/nccl #2140): ring 0.82, NVLS 0.69"
BLACKWELL_NCCL = {
    "collective_efficiency": 0.77,
    "in_switch_reduction": True,
    "nvls_efficiency": 0.60,
}
BLACKWELL_NCCL_SOURCE = "nccl-tests on 8 x B300 (NVIDIA/nccl #2140): ring 0.77, NVLS 0.60"
CLUSTERS: dict[str, ClusterSpec] = {
    c.name: c
    for c in (
        ClusterSpec(
            name="DGX A100 (Selene)",
            gpu=SPECS["A100"],
            n_gpus=8,
            domain_size=8,
            nvlink_bandwidth=300e9,
            scaleout_bandwidth=200e9 / 8,
            source="Narayanan et al. 2021 sec. 5: 8 A100 80GB per node on NVLink/NVSwitch, "
            "eight 200 Gb/s HDR InfiniBand HCAs per node; A100 datasheet: 600 GB/s NVLink",
        ),
        ClusterSpec(
            name="DGX H100",
            gpu=SPECS["H100 SXM"],
            n_gpus=8,
            domain_size=8,
            nvlink_bandwidth=450e9,
            scaleout_bandwidth=_IB_400G,
            **_HOPPER_NCCL,  # type: ignore[arg-type]
            source="DGX H100 datasheet: NVLink 4 900 GB/s per GPU bidirectional; eight "
            "single-port ConnectX-7 400 Gb/s for the compute fabric; " + _HOPPER_NCCL_SOURCE,
        ),
        ClusterSpec(
            name="DGX H200",
            gpu=SPECS["H200"],
            n_gpus=8,
            domain_size=8,
            nvlink_bandwidth=450e9,
            scaleout_bandwidth=_IB_400G,
            **_HOPPER_NCCL,  # type: ignore[arg-type]
            source="DGX BasePOD reference architecture: DGX H200, four OSFP ports serving "
            "eight single-port ConnectX-7, up to 400 Gb/s; H200 datasheet: NVLink 900 GB/s; "
            + _HOPPER_NCCL_SOURCE,
        ),
        ClusterSpec(
            name="GB200 NVL72",
            gpu=GB200,
            n_gpus=72,
            domain_size=72,
            nvlink_bandwidth=900e9,
            scaleout_bandwidth=_IB_400G,
            **BLACKWELL_NCCL,  # type: ignore[arg-type]
            source=BLACKWELL_NCCL_SOURCE + "; "
            "GB200 NVL72 specifications: 72 GPUs in one NVLink domain, 130 TB/s; "
            "DGX GB200 compute tray: four InfiniBand OSFP ports (ConnectX-7, 400 Gb/s) "
            "for its four GPUs",
        ),
    )
}

RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How a run is split. ``global_batch`` sequences per iteration, ``micro_batch`` per forward;
    ``virtual_stages`` > 1 is Megatron's interleaved schedule. ``grad_bytes`` is the gradient
    dtype size: 2 gives the 16 bytes per parameter of mixed-precision Adam (Megatron keeps and
    all-reduces FP32 gradients, 4 bytes, when training in BF16). ``distributed_optimizer``
    shards the 12 bytes of FP32 optimizer state over DP (ZeRO-1). ``overlap_dp_comm`` hides
    the gradient reduction behind the last micro-batch's backward (with the distributed
    optimizer its reduce-scatter there and its parameter all-gather behind the next forward,
    Megatron-Core's ``--overlap-grad-reduce --overlap-param-gather``). ``overlap_tp_comm`` hides
    TP communication behind the GEMMs it feeds (Megatron-Core's ``--tp-comm-overlap``, which
    needs sequence parallelism)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int
    sequence_parallel: bool = False
    recompute: str = "none"
    dtype: str = "bf16"
    virtual_stages: int = 1
    overlap_dp_comm: bool = False
    distributed_optimizer: bool = False
    grad_bytes: int = 2
    overlap_tp_comm: bool = False

    def __post_init__(self) -> None:
        check_positive_ints(
            self, ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages")
        )
        if self.global_batch % (self.micro_batch * self.dp):
            raise ValueError(
                f"global_batch={self.global_batch} is not divisible by micro_batch "
                f"x dp = {self.micro_batch} x {self.dp}."
            )
        if self.recompute not in RECOMPUTE or self.dtype not in DTYPES:
            raise ValueError(
                f"recompute must be one of {RECOMPUTE} and dtype one of {DTYPES}; "
                f"got {self.recompute!r}, {self.dtype!r}."
            )
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError("virtual_stages > 1 (interleaved schedule) needs pp > 1.")
        if self.grad_bytes not in (2, 4):
            raise ValueError(f"grad_bytes must be 2 or 4, got {self.grad_bytes}.")
        if self.overlap_tp_comm and self.tp > 1 and not self.sequence_parallel:
            raise ValueError(
                "overlap_tp_comm needs sequence_parallel=True (Megatron-Core overlaps the "
                "all-gathers and reduce-scatters of sequence parallelism with the GEMMs)."
            )

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per iteration, m = B / (b d)."""
        return self.global_batch // (self.micro_batch * self.dp)


def check_config(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> None:
    """Raise ValueError if ``par`` cannot run ``model`` on ``cluster``."""
    problems = []
    if par.tp * par.pp * par.dp != cluster.n_gpus:
        problems.append(f"tp x pp x dp = {par.tp * par.pp * par.dp} != n_gpus={cluster.n_gpus}")
    if model.heads % par.tp or model.ffn_width % par.tp:
        problems.append(f"tp={par.tp} must divide heads={model.heads} and ffn={model.ffn}")
    if cluster.domain_size % par.tp:
        problems.append(
            f"tp={par.tp} must divide the scale-up domain ({cluster.domain_size}); "
            "TP across the scale-out network is not modelled"
        )
    if model.layers % (par.pp * par.virtual_stages):
        problems.append(
            f"pp x virtual_stages = {par.pp * par.virtual_stages} must divide layers={model.layers}"
        )
    if par.virtual_stages > 1 and par.micro_batches % par.pp:
        problems.append(
            f"the interleaved schedule needs micro-batches ({par.micro_batches}) "
            f"divisible by pp={par.pp}"
        )
    if par.sequence_parallel and model.seq % par.tp:
        problems.append(f"sequence parallelism needs tp={par.tp} to divide seq={model.seq}")
    if cluster.gpu.peak(par.dtype) is None:
        problems.append(f"{cluster.gpu.name} has no {par.dtype} peak")
    if problems:
        raise ValueError("Invalid parallel configuration: " + "; ".join(problems) + ".")
