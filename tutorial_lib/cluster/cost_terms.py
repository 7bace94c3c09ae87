"""Iteration time and memory per GPU of a GPT under tensor, pipeline and data parallelism.

The formulas are the published ones: FLOPs, parameters and the pipeline bubble from Narayanan
et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
arXiv 2104.04473), activation memory and selective recomputation from Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198). TP traffic
reuses ``cluster.tp_traffic``. Everything is a model of datasheet numbers plus three stated
assumptions: how close each GEMM gets to peak (``cluster.gemm_model``: its shape's tiles and
waves, the roofline, and a ceiling per GPU fitted to published runs in ``cluster.validation``
and ``cluster.validation_hopper``), the fraction of link bandwidth a collective reaches
(``ClusterSpec.collective_efficiency``), and how often memory-bound kernels touch the activations
(``ACTIVATION_PASSES``). The older flat model, one ``compute_efficiency`` for every GEMM, is
still available as an argument.

Every term is public: ``iteration_time`` and ``memory_per_gpu`` add them up for a healthy job,
and ``cluster.replica_cost`` reuses them for a replica that lost GPUs (``stage_params``,
``activation_parts``, ``tp_layer_time``, ``pp_p2p_time``). The model, cluster and split come
from ``cluster.specs``; ``cluster.validation`` compares the model with Table 1 of Narayanan et al.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..flops import training_flops_per_token
from .collectives import best_allreduce
from .gemm_model import GemmModel, gemm_compute_time, gemm_model_for
from .specs import RECOMPUTE, ClusterSpec, ModelSpec, ParallelConfig, check_config
from .tp_traffic import tp_layer_comm_bytes

__all__ = [
    "ACT_BYTES",
    "ADAM_STEP_BYTES",
    "ACTIVATION_PASSES",
    "Breakdown",
    "training_flops",
    "tp_comm_bytes_per_layer",
    "pipeline_bubble_fraction",
    "stage_params",
    "dp_allreduce_time",
    "activation_parts",
    "activation_bytes_per_layer",
    "layers_in_flight",
    "tp_layer_time",
    "pp_p2p_time",
    "exposed_tp_comm",
    "exposed_dp_comm",
    "iteration_time",
    "memory_per_gpu",
    "tflops_per_gpu",
]

# Activations and their TP/PP traffic are 16-bit; assumed under FP8 too, where only GEMM inputs
# are cast to FP8.
ACT_BYTES = 2
ADAM_STEP_BYTES = 30  # per parameter: read fp32 grad + w, m, v (16), write w, m, v (12), bf16 w (2)
# Each activation byte Korthikanti et al. count is written in the forward, read in the backward
# and has a gradient of the same size written there: 3 passes of memory-bound traffic (LayerNorm,
# GeLU, softmax, dropout). Recomputation writes what it recomputes once more. An estimate, not fit.
ACTIVATION_PASSES = 3


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
    and appendix): ``batch x seq`` tokens at ``flops.training_flops_per_token``. Per token and
    layer the forward costs 8h^2 + 4hf (QKV, projection, MLP) plus 4sh (Q K^T and attention x
    V); the logit layer 2hV. Backward is twice the forward.

    - ``none``: 72 B s l h^2 (1 + s/(6h) + V/(12hl)) for f = 4h.
    - ``full``: one more forward of every layer, 96 B s l h^2 (1 + s/(6h) + V/(16lh)).
    - ``selective`` (Korthikanti et al. 2022, sec. 6): their published hardware-FLOPs count,
      72 B s l h^2 (1 + s/(3h) + V/(12hl)), i.e. 12 s h per token and layer on top of ``none``.
      We use it so HFU figures match theirs; a direct count of the recomputed Q K^T and
      attention x V gives 4 s h, so the published count is an upper bound (about 2% of a
      GPT-3-sized step)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}.")
    m = model
    per_token = training_flops_per_token(m.layers, m.hidden, m.seq, m.vocab, m.ffn, recompute)
    return float(batch * m.seq * per_token)


def tp_comm_bytes_per_layer(model: ModelSpec, par: ParallelConfig) -> float:
    """Bytes one TP rank sends per layer and micro-batch: ``tp_traffic``'s 8 b s h (t-1)/t
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


def stage_params(model: ModelSpec, par: ParallelConfig) -> float:
    """Parameters on one GPU of the first (largest) stage: its layers / t, the vocabulary-parallel
    word embedding V h / t and the (replicated) position embedding s h."""
    layers = model.layers / par.pp * model.layer_params() / par.tp
    return layers + model.vocab * model.hidden / par.tp + model.seq * model.hidden


def dp_allreduce_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    """Seconds for the gradient all-reduce of one GPU's shard, S = params/(t p) x grad_bytes.
    Placed hierarchically: the k = min(d, domain/t) ranks of a DP group that share a domain
    all-reduce over NVLink (a ring, or NVLink SHARP where the switch has it), and each of them
    all-reduces its S/k across the d/k domains on its own NIC (a ring or a tree, whichever is
    faster: ``cluster.collectives``). So a DP group spanning whole DGX nodes sees 8 NICs' worth
    of bandwidth, as nccl-tests does (issue #119)."""
    d = par.dp
    if d == 1:
        return 0.0
    nbytes = stage_params(model, par) * par.grad_bytes
    k = min(d, cluster.domain_size // par.tp)
    time = _domain_allreduce(nbytes, k, cluster) if k > 1 else 0.0
    domains = round(d / k)
    if domains > 1:
        time += best_allreduce(
            nbytes / k,
            domains,
            cluster.scaleout_bandwidth,
            cluster.collective_efficiency,
            ("ring", "tree"),
            cluster.collective_latency,
            cluster.step_latency,
        )[1]
    return time


def _domain_allreduce(nbytes: float, ranks: int, cluster: ClusterSpec) -> float:
    """An all-reduce inside one scale-up domain: a ring, or NVLS where the switch reduces."""
    algorithms = ("ring", "nvls") if cluster.in_switch_reduction else ("ring",)
    return best_allreduce(
        nbytes,
        ranks,
        cluster.nvlink_bandwidth,
        cluster.collective_efficiency,
        algorithms,
        cluster.collective_latency,
        nvls_efficiency=cluster.nvls_efficiency,
    )[1]


def activation_parts(model: ModelSpec, b: int, tp: int, sp: bool) -> tuple[float, float]:
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
    other, attention = activation_parts(model, micro_batch, tp, sequence_parallel)
    if recompute == "full":
        return 2 * model.seq * micro_batch * model.hidden / (tp if sequence_parallel else 1)
    return other if recompute == "selective" else other + attention


def layers_in_flight(model: ModelSpec, par: ParallelConfig) -> float:
    """Layer-activations (of one micro-batch) the first stage holds at its peak. 1F1B keeps
    min(p, m) micro-batches of l/p layers; Megatron's interleaved warm-up on the first rank is
    2(p-1) + (v-1)p chunks of l/(pv) layers, plus the one being computed."""
    p, v, m = par.pp, par.virtual_stages, par.micro_batches
    if v == 1:
        return min(p, m) * model.layers / p
    return min(p * (v + 1) - 1, m * v) * model.layers / (p * v)


def tp_layer_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    """Seconds of TP communication per layer and micro-batch on one GPU: 4 all-reduces of the
    b s h activations (6 with full recomputation) inside the domain, each a ring or NVLink SHARP
    (``_domain_allreduce``); with sequence parallelism twice as many collectives,
    reduce-scatters and all-gathers of the same bytes on rings (NVLS does not speed them up).
    Together: ``tp_comm_bytes_per_layer`` over NVLink at ``collective_efficiency`` plus the
    latencies, when no switch reduces. 0 at ``tp=1``."""
    if par.tp == 1:
        return 0.0
    collectives = 6 if par.recompute == "full" else 4
    if not par.sequence_parallel:
        nbytes = par.micro_batch * model.seq * model.hidden * ACT_BYTES
        return collectives * _domain_allreduce(nbytes, par.tp, cluster)
    bw = cluster.collective_efficiency * cluster.nvlink_bandwidth
    return tp_comm_bytes_per_layer(model, par) / bw + 2 * collectives * cluster.collective_latency


def pp_p2p_time(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> float:
    """Per micro-batch: activations forward and gradients backward, b s h / t each with the
    scatter/gather optimisation (Narayanan et al. sec. 4.1), v times with interleaving."""
    if par.pp == 1:
        return 0.0
    crosses = cluster.n_gpus > cluster.domain_size
    bw = cluster.scaleout_bandwidth if crosses else cluster.nvlink_bandwidth
    nbytes = par.micro_batch * model.seq * model.hidden * ACT_BYTES / par.tp
    per_send = nbytes / (cluster.collective_efficiency * bw) + cluster.collective_latency
    return 2 * par.virtual_stages * per_send


def exposed_tp_comm(tp_time: float, gemm_time: float, par: ParallelConfig) -> float:
    """TP communication left on the critical path: all of it, or with ``overlap_tp_comm`` what
    outlasts the GEMMs it is pipelined with (Megatron-Core's ``--tp-comm-overlap`` splits each
    all-gather and reduce-scatter into chunks that run while the GEMM works on the previous
    one). Optimistic on two counts: ``gemm_time`` is every GEMM of the step, where Megatron-Core
    overlaps only the linear layers' (not attention's score and value GEMMs), and the slowdown
    of GEMMs that share the SMs with communication is not modelled."""
    return max(0.0, tp_time - gemm_time) if par.overlap_tp_comm else tp_time


def exposed_dp_comm(dp_time: float, micro_batch_time: float, par: ParallelConfig) -> float:
    """Gradient-synchronisation time left on the critical path, given ``dp_time`` for the whole
    collective and the compute of one micro-batch. Without ``overlap_dp_comm``: all of it.
    With it, the reduction runs in buckets during the last micro-batch's backward (2/3 of a
    micro-batch; 3/4 with full recomputation, whose recomputed forward runs in the backward);
    with ``distributed_optimizer`` too, the collective is a reduce-scatter (half the time)
    hidden there and a parameter all-gather (the other half) hidden behind the next
    iteration's first forward (1/3, or 1/4)."""
    if not par.overlap_dp_comm:
        return dp_time
    parts = 4 if par.recompute == "full" else 3
    backward, forward = micro_batch_time * (parts - 1) / parts, micro_batch_time / parts
    if not par.distributed_optimizer:
        return max(0.0, dp_time - backward)
    return max(0.0, dp_time / 2 - backward) + max(0.0, dp_time / 2 - forward)


def iteration_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    par: ParallelConfig,
    *,
    compute_efficiency: float | None = None,
    gemm: GemmModel | None = None,
) -> Breakdown:
    """Seconds per iteration on one GPU, by cause.

    - ``compute``: every GEMM of the stage's layers timed from its shape by ``gemm`` (default
      ``gemm_model_for(cluster.gpu)``: tiles, waves, the roofline and the GPU's ceiling,
      ``cluster.gemm_model``), m micro-batches of them, plus 1/p of the logit layer. Or, with
      ``compute_efficiency``, the older flat model: ``training_flops`` at that fraction of peak,
      spread evenly over the GPUs.
    - ``memory_bound``: the activation traffic of LayerNorm, GeLU, softmax and dropout,
      ``ACTIVATION_PASSES`` x the bytes Korthikanti et al. count (+1 pass for what is
      recomputed), at HBM bandwidth.
    - ``tp_comm`` and ``pp_p2p``: not overlapped (as in Megatron 2021), except TP communication
      with ``overlap_tp_comm`` (``exposed_tp_comm``).
    - ``pp_bubble``: the bubble fraction of the steady state.
    - ``dp_comm``: the exposed gradient synchronisation (``exposed_dp_comm``).
    - ``optimizer``: the Adam step, ``ADAM_STEP_BYTES`` per parameter at HBM bandwidth.

    With ``dtype="fp8"`` the GEMMs run at the FP8 peak with the same ceiling, which is
    optimistic (FP8 GEMMs usually reach a smaller fraction of their peak)."""
    check_config(model, cluster, par)
    if compute_efficiency is not None and gemm is not None:
        raise ValueError("Give compute_efficiency (one efficiency) or gemm (shapes), not both.")
    if compute_efficiency is not None and not 0 < compute_efficiency <= 1:
        raise ValueError(f"compute_efficiency must be in (0, 1], got {compute_efficiency}.")
    m, stage_layers = par.micro_batches, model.layers / par.pp
    if compute_efficiency is not None:
        peak = cluster.gpu.peak(par.dtype) * compute_efficiency  # type: ignore[operator]
        compute = training_flops(model, par.global_batch, par.recompute) / (cluster.n_gpus * peak)
    else:
        compute = m * gemm_compute_time(
            gemm or gemm_model_for(cluster.gpu),
            model.hidden,
            model.heads,
            model.seq,
            model.ffn_width,
            model.vocab,
            stage_layers,
            par.micro_batch,
            par.tp,
            par.recompute,
            par.dtype,
            logit_share=1 / par.pp,
        )
    other, attention = activation_parts(model, par.micro_batch, par.tp, par.sequence_parallel)
    redo = {"none": 0.0, "selective": attention, "full": other + attention}[par.recompute]
    traffic = ACTIVATION_PASSES * (other + attention) + redo
    memory = m * stage_layers * traffic / cluster.gpu.hbm_bandwidth
    tp = exposed_tp_comm(m * stage_layers * tp_layer_time(model, cluster, par), compute, par)
    p2p = m * pp_p2p_time(model, cluster, par)
    steady = compute + memory + tp + p2p
    bubble = steady * pipeline_bubble_fraction(par.pp, m, par.virtual_stages)
    dp = exposed_dp_comm(dp_allreduce_time(model, cluster, par), (compute + memory) / m, par)
    shard = stage_params(model, par) / (par.dp if par.distributed_optimizer else 1)
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
    ``distributed_optimizer``); activations of ``layers_in_flight`` layers. Not modelled: the
    embedding/logit activations, temporary buffers, the CUDA context and fragmentation."""
    check_config(model, cluster, par)
    params = stage_params(model, par)
    per_layer = activation_bytes_per_layer(
        model, par.micro_batch, par.tp, par.sequence_parallel, par.recompute
    )
    return Breakdown(
        {
            "weights": 2 * params,
            "grads": par.grad_bytes * params,
            "optimizer": 12 * params / (par.dp if par.distributed_optimizer else 1),
            "activations": per_layer * layers_in_flight(model, par),
        },
        "B",
    )


def tflops_per_gpu(
    model: ModelSpec,
    cluster: ClusterSpec,
    par: ParallelConfig,
    *,
    flops: str = "hardware",
    compute_efficiency: float | None = None,
    gemm: GemmModel | None = None,
) -> float:
    """Predicted TFLOP/s per GPU. ``flops="hardware"`` counts the recomputation too (what Table 1
    of Narayanan et al. reports); ``"model"`` does not (the numerator of MFU)."""
    if flops not in ("hardware", "model"):
        raise ValueError(f"flops must be 'hardware' or 'model', got {flops!r}.")
    recompute = par.recompute if flops == "hardware" else "none"
    seconds = iteration_time(
        model, cluster, par, compute_efficiency=compute_efficiency, gemm=gemm
    ).total
    return training_flops(model, par.global_batch, recompute) / (cluster.n_gpus * seconds) / 1e12
