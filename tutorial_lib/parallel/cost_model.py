"""Iteration time and memory per GPU of a GPT under tensor, pipeline and data parallelism.

The formulas are the published ones: FLOPs, parameters and the pipeline bubble from Narayanan
et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
arXiv 2104.04473), activation memory and selective recomputation from Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198). TP traffic
reuses ``parallel.cost``. Everything is a model of datasheet numbers plus three stated
assumptions: the fraction of peak the GEMMs reach (``compute_efficiency``, calibrated below),
the fraction of link bandwidth a collective reaches (``ClusterSpec.collective_efficiency``), and
how often memory-bound kernels touch the activations (``ACTIVATION_PASSES``).

Placement follows Megatron's rank order (TP fastest, then DP, then PP): TP always lives inside a
scale-up domain (NVLink), DP groups use NVLink inside a domain and the scale-out network across
domains, and the pipeline crosses domains whenever the job is larger than one domain.

``validation_table()`` compares the model with Table 1 of Narayanan et al.; see its docstring.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hardware import SPECS, DeviceSpec
from .cost import ring_allreduce_bytes, tp_layer_comm_bytes

if TYPE_CHECKING:
    from ..config import GPTConfig

__all__ = [
    "ModelSpec",
    "ClusterSpec",
    "ParallelConfig",
    "Breakdown",
    "GB200",
    "CLUSTERS",
    "check_config",
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
    "CALIBRATION_ROWS",
    "A100_COMPUTE_EFFICIENCY",
    "calibrate_compute_efficiency",
    "validation_table",
]

# Activations and their TP/PP traffic are 16-bit; assumed under FP8 too, where only GEMM inputs
# are cast to FP8.
ACT_BYTES = 2
ADAM_STEP_BYTES = 30  # per parameter: read fp32 grad + w, m, v (16), write w, m, v (12), bf16 w (2)
# Each activation byte Korthikanti et al. count is written in the forward, read in the backward
# and has a gradient of the same size written there: 3 passes of memory-bound traffic (LayerNorm,
# GeLU, softmax, dropout). Recomputation writes what it recomputes once more. An estimate, not fit.
ACTIVATION_PASSES = 3
# GEMM fraction of peak in a real training step. 0.6 is what Table 1 calibrates to on A100
# (A100_COMPUTE_EFFICIENCY); a lone BF16 8192^3 GEMM reaches 0.80 on an H200 (measured once, CUDA torch),
# an upper bound. No Hopper end-to-end calibration exists yet: revisit when one is recorded.
DEFAULT_COMPUTE_EFFICIENCY = 0.6

GB200 = DeviceSpec(
    name="GB200 (per GPU, NVL72)",
    # GB200 NVL72 specs per rack, with sparsity: FP8 720 PF, FP16/BF16 360 PF, TF32 180 PF;
    # divided by 72 GPUs and by 2 for dense math.
    peak_flops={"tf32": 1.25e15, "bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5.0e15},
    hbm_bandwidth=8.0e12,  # 576 TB/s per rack / 72
    hbm_capacity=186e9,  # 13.4 TB HBM3e per rack / 72 (MLPerf system files list 186 GB)
    nvlink_bandwidth=900e9,  # NVLink 5: 130 TB/s per rack = 1.8 TB/s per GPU bidirectional
    source="NVIDIA GB200 NVL72 specifications (rack totals / 72), dense values",
)


def _positive(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(
                f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}."
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
        _positive(self, ("layers", "hidden", "heads", "ffn", "vocab", "seq"))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}.")

    @classmethod
    def from_gpt_config(cls, cfg: GPTConfig) -> ModelSpec:
        """The spec of the book's own ``GPT`` for ``cfg``."""
        return cls(
            layers=cfg.n_layer,
            hidden=cfg.n_embd,
            heads=cfg.n_head,
            vocab=cfg.vocab_size,
            seq=cfg.block_size,
        )

    def layer_params(self) -> int:
        """QKV and projection 4h^2 + 4h, MLP 2hf + f + h, two LayerNorms 4h."""
        h, f = self.hidden, self.ffn
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
    source: str = ""

    def __post_init__(self) -> None:
        _positive(self, ("n_gpus", "domain_size"))
        if self.nvlink_bandwidth <= 0 or self.scaleout_bandwidth <= 0:
            raise ValueError(f"{self.name}: link bandwidths must be positive.")
        if not 0 < self.collective_efficiency <= 1 or self.collective_latency < 0:
            raise ValueError(
                f"{self.name}: collective_efficiency must be in (0, 1] and collective_latency >= 0."
            )
        small = self.n_gpus <= self.domain_size and self.domain_size % self.n_gpus == 0
        if not small and self.n_gpus % self.domain_size:
            raise ValueError(
                f"{self.name}: n_gpus={self.n_gpus} must divide or be a multiple "
                f"of domain_size={self.domain_size}."
            )

    def with_gpus(self, n_gpus: int) -> ClusterSpec:
        return dataclasses.replace(self, n_gpus=n_gpus)


_IB_400G = 400e9 / 8  # one 400 Gb/s ConnectX-7 port per GPU
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
            source="DGX H100 datasheet: NVLink 4 900 GB/s per GPU bidirectional; eight "
            "single-port ConnectX-7 400 Gb/s for the compute fabric",
        ),
        ClusterSpec(
            name="DGX H200",
            gpu=SPECS["H200"],
            n_gpus=8,
            domain_size=8,
            nvlink_bandwidth=450e9,
            scaleout_bandwidth=_IB_400G,
            source="DGX BasePOD reference architecture: DGX H200, four OSFP ports serving "
            "eight single-port ConnectX-7, up to 400 Gb/s; H200 datasheet: NVLink 900 GB/s",
        ),
        ClusterSpec(
            name="DGX B200",
            gpu=SPECS["B200"],
            n_gpus=8,
            domain_size=8,
            nvlink_bandwidth=900e9,
            scaleout_bandwidth=_IB_400G,
            source="DGX BasePOD reference architecture: DGX B200, 4 OSFP ports serving 8 "
            "single-port ConnectX-7 up to 400 Gb/s; HGX B200 datasheet: NVLink 5 1.8 TB/s",
        ),
        ClusterSpec(
            name="GB200 NVL72",
            gpu=GB200,
            n_gpus=72,
            domain_size=72,
            nvlink_bandwidth=900e9,
            scaleout_bandwidth=_IB_400G,
            source="GB200 NVL72 specifications: 72 GPUs in one NVLink domain, 130 TB/s; "
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
    shards the 12 bytes of FP32 optimizer state over DP (ZeRO-1)."""

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

    def __post_init__(self) -> None:
        _positive(self, ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages"))
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

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per iteration, m = B / (b d)."""
        return self.global_batch // (self.micro_batch * self.dp)


def check_config(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> None:
    """Raise ValueError if ``par`` cannot run ``model`` on ``cluster``."""
    problems = []
    if par.tp * par.pp * par.dp != cluster.n_gpus:
        problems.append(f"tp x pp x dp = {par.tp * par.pp * par.dp} != n_gpus={cluster.n_gpus}")
    if model.heads % par.tp or model.ffn % par.tp:  # type: ignore[operator]
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


@dataclass(frozen=True)
class Breakdown:
    """Named parts that add up to a total (seconds or bytes)."""

    parts: dict[str, float]
    unit: str

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def __getitem__(self, key: str) -> float:
        return self.parts[key]

    def fractions(self) -> dict[str, float]:
        return {k: v / self.total for k, v in self.parts.items()}


def training_flops(model: ModelSpec, batch: int, recompute: str = "none") -> float:
    """GEMM FLOPs of one training iteration on ``batch`` sequences (Narayanan et al. 2021, eq. 3
    and appendix). Per token and layer the forward costs 8h^2 + 4hf (QKV, projection, MLP) plus
    4sh (Q K^T and attention x V); the logit layer 2hV. Backward is twice the forward.

    - ``none``: 72 B s l h^2 (1 + s/(6h) + V/(12hl)) for f = 4h.
    - ``full``: one more forward of every layer, 96 B s l h^2 (1 + s/(6h) + V/(16lh)).
    - ``selective`` (Korthikanti et al. 2022, sec. 6): their published hardware-FLOPs count,
      72 B s l h^2 (1 + s/(3h) + V/(12hl)), i.e. 12 s h per token and layer on top of ``none``.
      We use it so HFU figures match theirs; a direct count of the recomputed Q K^T and
      attention x V gives 4 s h, so the published count is an upper bound (about 2% of a
      GPT-3-sized step)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}.")
    h, s, f = model.hidden, model.seq, model.ffn
    layer_fwd = 8 * h * h + 4 * h * f + 4 * s * h  # type: ignore[operator]
    passes = {"none": 3.0, "selective": 3.0, "full": 4.0}[recompute]
    per_token = model.layers * passes * layer_fwd + 3 * 2 * h * model.vocab
    if recompute == "selective":
        per_token += model.layers * 12 * s * h
    return float(batch * s * per_token)


def tp_comm_bytes_per_layer(model: ModelSpec, par: ParallelConfig) -> float:
    """Bytes one TP rank sends per layer and micro-batch: ``parallel.cost``'s 8 b s h (t-1)/t
    elements (Narayanan et al. sec. 3.2). Full recomputation repeats the forward's two
    all-reduces (x1.5). Sequence parallelism turns each all-reduce into a reduce-scatter and an
    all-gather: the same bytes (Korthikanti et al. sec. 4.2.2)."""
    args = (par.micro_batch, model.seq, model.hidden, par.tp, ACT_BYTES)
    extra = tp_layer_comm_bytes(*args, backward=False) if par.recompute == "full" else 0.0
    return tp_layer_comm_bytes(*args) + extra


def pipeline_bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Bubble time over ideal time, (p - 1) / m, divided by v for the interleaved schedule
    (Narayanan et al. 2021, sec. 2.2)."""
    if pp < 1 or micro_batches < 1 or virtual_stages < 1:
        raise ValueError("pp, micro_batches and virtual_stages must be >= 1.")
    return (pp - 1) / (virtual_stages * micro_batches)


def _stage_params(model: ModelSpec, par: ParallelConfig) -> float:
    """Parameters on one GPU of the first (largest) stage: its layers / t, the vocabulary-parallel
    word embedding V h / t and the (replicated) position embedding s h."""
    layers = model.layers / par.pp * model.layer_params() / par.tp
    return layers + model.vocab * model.hidden / par.tp + model.seq * model.hidden


def dp_allreduce_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    """Seconds for the gradient all-reduce of one GPU's shard, S = params/(t p) x grad_bytes.
    Narayanan's ring gives 2 S (d-1)/d per rank. Placed hierarchically: the k = min(d, domain/t)
    ranks of a DP group that share a domain reduce-scatter and all-gather over NVLink, and each
    of them all-reduces its S/k across the d/k domains on its own NIC. So a DP group spanning
    whole DGX nodes sees 8 NICs' worth of bandwidth, as nccl-tests does (issue #119)."""
    d = par.dp
    if d == 1:
        return 0.0
    nbytes = _stage_params(model, par) * par.grad_bytes
    k = min(d, cluster.domain_size // par.tp)
    eff, lat = cluster.collective_efficiency, cluster.collective_latency
    time = ring_allreduce_bytes(nbytes, k) / (eff * cluster.nvlink_bandwidth) + lat * (k > 1)
    domains = round(d / k)
    if domains > 1:
        time += ring_allreduce_bytes(nbytes / k, domains) / (eff * cluster.scaleout_bandwidth) + lat
    return time


def _activation_parts(model: ModelSpec, b: int, tp: int, sp: bool) -> tuple[float, float]:
    """(other, attention) activation bytes per layer and GPU (Korthikanti et al. sec. 4):
    other = s b h (10 + 24/t), or 34 s b h / t with sequence parallelism; attention (softmax,
    its dropout mask and output) = 5 a s^2 b / t."""
    sbh = model.seq * b * model.hidden
    other = 34 * sbh / tp if sp else sbh * (10 + 24 / tp)
    return other, 5 * model.heads * model.seq**2 * b / tp


def activation_bytes_per_layer(
    model: ModelSpec,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Bytes of activations one layer keeps for the backward (Korthikanti et al. 2022, Table 2):
    s b h (34 + 5 a s / h) without parallelism; s b h (10 + 24/t + 5 a s/(h t)) with TP;
    s b h / t (34 + 5 a s / h) with TP + SP; ``selective`` drops the attention part (34 s b h / t
    with SP); ``full`` keeps only the layer input, 2 s b h (/ t with SP)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}.")
    other, attention = _activation_parts(model, micro_batch, tp, sequence_parallel)
    if recompute == "full":
        return 2 * model.seq * micro_batch * model.hidden / (tp if sequence_parallel else 1)
    return other if recompute == "selective" else other + attention


def _layers_in_flight(model: ModelSpec, par: ParallelConfig) -> float:
    """Layer-activations (of one micro-batch) the first stage holds at its peak. 1F1B keeps
    min(p, m) micro-batches of l/p layers; Megatron's interleaved warm-up on the first rank is
    2(p-1) + (v-1)p chunks of l/(pv) layers, plus the one being computed."""
    p, v, m = par.pp, par.virtual_stages, par.micro_batches
    if v == 1:
        return min(p, m) * model.layers / p
    return min(p * (v + 1) - 1, m * v) * model.layers / (p * v)


def _tp_layer_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    if par.tp == 1:
        return 0.0
    collectives = (6 if par.recompute == "full" else 4) * (2 if par.sequence_parallel else 1)
    bw = cluster.collective_efficiency * cluster.nvlink_bandwidth
    return tp_comm_bytes_per_layer(model, par) / bw + collectives * cluster.collective_latency


def _pp_p2p_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    """Per micro-batch: activations forward and gradients backward, b s h / t each with the
    scatter/gather optimisation (Narayanan et al. sec. 4.1), v times with interleaving."""
    if par.pp == 1:
        return 0.0
    crosses = cluster.n_gpus > cluster.domain_size
    bw = cluster.scaleout_bandwidth if crosses else cluster.nvlink_bandwidth
    nbytes = par.micro_batch * model.seq * model.hidden * ACT_BYTES / par.tp
    per_send = nbytes / (cluster.collective_efficiency * bw) + cluster.collective_latency
    return 2 * par.virtual_stages * per_send


def iteration_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    par: ParallelConfig,
    *,
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
) -> Breakdown:
    """Seconds per iteration on one GPU, by cause. ``compute``: ``training_flops`` at
    ``compute_efficiency`` x peak, spread evenly over the GPUs. ``memory_bound``: the activation
    traffic of LayerNorm, GeLU, softmax and dropout, ``ACTIVATION_PASSES`` x the bytes Korthikanti
    et al. count (+1 pass for what is recomputed), at HBM bandwidth. ``tp_comm`` and ``pp_p2p``:
    not overlapped (as in Megatron 2021). ``pp_bubble``: the bubble fraction of the steady
    state. ``dp_comm``: exposed all-reduce; with ``overlap_dp_comm`` only what outlasts the last
    micro-batch's backward. ``optimizer``: the Adam step, ``ADAM_STEP_BYTES`` per parameter at HBM
    bandwidth. With ``dtype="fp8"`` the GEMMs run at the FP8 peak with the same efficiency, which
    is optimistic (FP8 GEMMs usually reach a smaller fraction of their peak)."""
    check_config(model, cluster, par)
    if not 0 < compute_efficiency <= 1:
        raise ValueError(f"compute_efficiency must be in (0, 1], got {compute_efficiency}.")
    m, stage_layers = par.micro_batches, model.layers / par.pp
    peak = cluster.gpu.peak(par.dtype) * compute_efficiency  # type: ignore[operator]
    compute = training_flops(model, par.global_batch, par.recompute) / (cluster.n_gpus * peak)
    other, attention = _activation_parts(model, par.micro_batch, par.tp, par.sequence_parallel)
    redo = {"none": 0.0, "selective": attention, "full": other + attention}[par.recompute]
    traffic = ACTIVATION_PASSES * (other + attention) + redo
    memory = m * stage_layers * traffic / cluster.gpu.hbm_bandwidth
    tp = m * stage_layers * _tp_layer_time(model, cluster, par)
    p2p = m * _pp_p2p_time(model, cluster, par)
    steady = compute + memory + tp + p2p
    bubble = steady * pipeline_bubble_fraction(par.pp, m, par.virtual_stages)
    dp = dp_allreduce_time(model, cluster, par)
    if par.overlap_dp_comm:
        backward_share = 2 / (4 if par.recompute == "full" else 3)
        dp = max(0.0, dp - (compute + memory) / m * backward_share)
    shard = _stage_params(model, par) / (par.dp if par.distributed_optimizer else 1)
    optimizer = shard * ADAM_STEP_BYTES / cluster.gpu.hbm_bandwidth
    return Breakdown(
        {
            "compute": compute,
            "memory_bound": memory,
            "tp_comm": tp,
            "pp_p2p": p2p,
            "pp_bubble": bubble,
            "dp_comm": dp,
            "optimizer": optimizer,
        },
        "s",
    )


def memory_per_gpu(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> Breakdown:
    """Bytes on one GPU of the first pipeline stage (the fullest): 2-byte weights, ``grad_bytes``
    gradients and 12 bytes of FP32 master weights and Adam moments per parameter (16 bytes in
    all with 2-byte gradients), sharded by t and p (and the optimizer by d with
    ``distributed_optimizer``); activations of ``_layers_in_flight`` layers. Not modelled: the
    embedding/logit activations, temporary buffers, the CUDA context and fragmentation."""
    check_config(model, cluster, par)
    params = _stage_params(model, par)
    per_layer = activation_bytes_per_layer(
        model, par.micro_batch, par.tp, par.sequence_parallel, par.recompute
    )
    return Breakdown(
        {
            "weights": 2 * params,
            "grads": par.grad_bytes * params,
            "optimizer": 12 * params / (par.dp if par.distributed_optimizer else 1),
            "activations": per_layer * _layers_in_flight(model, par),
        },
        "B",
    )


def tflops_per_gpu(
    model: ModelSpec,
    cluster: ClusterSpec,
    par: ParallelConfig,
    *,
    flops: str = "hardware",
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
) -> float:
    """Predicted TFLOP/s per GPU. ``flops="hardware"`` counts the recomputation too (what Table 1
    of Narayanan et al. reports); ``"model"`` does not (the numerator of MFU)."""
    if flops not in ("hardware", "model"):
        raise ValueError(f"flops must be 'hardware' or 'model', got {flops!r}.")
    recompute = par.recompute if flops == "hardware" else "none"
    seconds = iteration_time(model, cluster, par, compute_efficiency=compute_efficiency).total
    return training_flops(model, par.global_batch, recompute) / (cluster.n_gpus * seconds) / 1e12


# ---- validation against Narayanan et al. 2021, Table 1 -----------------------------------
@dataclass(frozen=True)
class Table1Row:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved teraFLOP/s per GPU


# Narayanan et al. 2021 (arXiv 2104.04473v5), Table 1 "Weak-scaling throughput for GPT models
# ranging from 1 billion to 1 trillion parameters": V = 51,200, s = 2048, A100 80GB on Selene,
# interleaved schedule with scatter/gather, activation recomputation (sec. 5.1).
MEGATRON_2021_TABLE1: tuple[Table1Row, ...] = tuple(
    Table1Row(*r)
    for r in (
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    )
)
CALIBRATION_ROWS = (0, 2, 4, 6, 8)  # every other row; rows 1, 3, 5, 7, 9 are held out
A100_COMPUTE_EFFICIENCY = 0.6116  # calibrate_compute_efficiency(), rounded; a test recomputes it


def _table1_setup(row: Table1Row) -> tuple[ModelSpec, ClusterSpec, ParallelConfig]:
    """Assumptions beyond the table: micro-batch 1 (as in the paper's Table 2 PTD-P runs), 16-bit
    gradients all-reduced after the backward (Megatron 2021 did not overlap them) and v = 1: the
    paper used the interleaved schedule but does not say with how many chunks."""
    model = ModelSpec(
        layers=row.layers,
        hidden=row.hidden,
        heads=row.heads,
        vocab=51200,
        seq=2048,
        name=f"{row.params_b}B",
    )
    dp = row.gpus // (row.tp * row.pp)
    par = ParallelConfig(
        tp=row.tp,
        pp=row.pp,
        dp=dp,
        micro_batch=1,
        global_batch=row.batch,
        recompute="full",
        dtype="fp16",
        grad_bytes=2,
    )
    return model, CLUSTERS["DGX A100 (Selene)"].with_gpus(row.gpus), par


def _efficiency_matching(row: Table1Row) -> float:
    """The compute_efficiency at which the model reproduces ``row`` exactly (bisection)."""
    lo, hi = 0.05, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tflops_per_gpu(*_table1_setup(row), compute_efficiency=mid) < row.tflops:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def calibrate_compute_efficiency(rows: tuple[int, ...] = CALIBRATION_ROWS) -> float:
    """Mean over ``rows`` of the efficiency that reproduces each row exactly."""
    return sum(_efficiency_matching(MEGATRON_2021_TABLE1[i]) for i in rows) / len(rows)


def validation_table(compute_efficiency: float = A100_COMPUTE_EFFICIENCY) -> list[dict]:
    """Predicted vs achieved TFLOP/s per GPU for every row of Table 1, with the relative error.

    One parameter is calibrated, ``compute_efficiency``: the mean of the per-row values that
    reproduce rows 1, 3, 5, 7 and 9 (0-based 0, 2, 4, 6, 8) exactly, 0.612; the other rows are
    held out. Calibrating on the whole table would overstate the agreement. Result: every row
    within 14%, mean absolute error 4.6% over all rows and 4.0% over the held-out ones; the
    tests pin these numbers.

    Where the model is off, and why. It over-predicts the small models (+13% at 1.7B, +6% at
    3.6B): their narrow GEMMs (h = 2304, 96-wide heads) run further from peak than wide ones, and
    the model has one efficiency for every GEMM size. The memory-bound term recovers part of this
    (without it the 1.7B error is +24%). ``ACTIVATION_PASSES`` was set from the kernel count, not
    fitted; 5 passes instead of 3 would bring the 1.7B error to +8.5% and the mean to 3.3%. It
    under-predicts the largest models (-7% at 530B, -5% at 1T): there the v = 1 bubble,
    (p - 1)/m = 12%, overstates what the paper's interleaved schedule paid (with v = 2 where the
    stage's layer count allows it, the 1T error is -2%). It knows nothing of their kernels (fused
    softmax, the [s, b, a, h] layout), of load imbalance between stages (the logit layer sits on
    the last) or of data loading and logging, which Table 1 includes.
    """
    table = []
    for i, row in enumerate(MEGATRON_2021_TABLE1):
        model, cluster, par = _table1_setup(row)
        time = iteration_time(model, cluster, par, compute_efficiency=compute_efficiency)
        predicted = tflops_per_gpu(model, cluster, par, compute_efficiency=compute_efficiency)
        table.append(
            {
                **dataclasses.asdict(row),
                "dp": par.dp,
                "micro_batches": par.micro_batches,
                "predicted_tflops": predicted,
                "error": predicted / row.tflops - 1,
                "calibration": i in CALIBRATION_ROWS,
                "fractions": time.fractions(),
            }
        )
    return table
