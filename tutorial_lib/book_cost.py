"""What running the whole book costs on one H200, estimated before a GPU is at hand.

An estimate, not a measurement: each chapter's work at a preset (training steps, timed
iterations, compilations, the fixed cost of a notebook) priced from its FLOP count
(``flops.training_flops_per_token``, as ``GPT.flops_per_token`` counts), an H200's BF16 GEMM rate
and a stated efficiency. Every assumption is a named constant below, with its source or the
word "assumed". ``python -m tutorial_lib info`` prints the ``hopper`` preset's estimate, and
``tests/test_book_cost.py`` keeps the ``hopper`` preset's total within ``BOOK_BUDGET_S`` (the
book must fit, with the recorded benchmarks, in the device check's minutes). A GPU run replaces
it: ``scripts/hopper_check.py`` records each notebook's time.

What each chapter runs is written here in terms of the preset's fields, read from the notebooks'
cells; chapters 9 to 11 run the same tiny models on CPU processes at either preset, so their cost
is the time they took at the ``ci`` preset.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import flops
from .config import GPTConfig, RunPreset

__all__ = ["BOOK_BUDGET_S", "Work", "book_work", "estimate_book", "format_estimate"]

BOOK_BUDGET_S = 480.0  # every notebook at the hopper preset on one H200: at most 8 minutes
# An H200 was seen to run a BF16 8192^3 GEMM at about 790 TFLOP/s: an estimate, not yet one of
# our recorded runs (the device check's fp8_gemm rows will record it).
H200_BF16_GEMM = 790e12
# Assumed: a whole eager GPT-2 124M training step (attention, LayerNorm, GELU, optimizer, launch
# gaps) reaches 35% of the lone GEMM's rate, i.e. about 28% of BF16's dense peak.
STEP_EFFICIENCY = 0.35
# Math rate of each policy's GEMMs relative to BF16's: datasheet peaks (hardware.SPECS['H200']:
# FP32 67, TF32 494.5, BF16/FP16 989.5 TFLOP/s). FP8 is priced as BF16 (assumed: at width 768
# the quantization costs what the faster GEMM saves). An emulated recipe (MXFP8, NVFP4 on
# Hopper) multiplies widened values in FP32 and quantizes in separate kernels: assumed half
# FP32's rate.
RATE = {"fp32": 67 / 989.5, "tf32": 494.5 / 989.5, "bf16": 1.0, "fp16": 1.0, "fp8": 1.0}
RATE["emulated"] = RATE["fp32"] / 2
COMPILE_S = 40.0  # assumed: torch.compile of GPT-2 124M, default mode, cold Inductor cache
WARM_COMPILE_S = 10.0  # assumed: the same graph again in the same run (Inductor's FX cache)
SMALL_COMPILE_S = 3.0  # assumed: one small graph (an op, an MLP, the ci model)
AUTOTUNE_S = 60.0  # assumed: max-autotune of the ci model (chapter 7), benchmarking GEMM configs
# Triton compiling our own kernels on first launch: 0.3 s per kernel variant (tests/
# test_triton_targets.py compiled 105 variants for sm_90 in about 30 s on the 2-core CI CPU,
# 2026-12-04); chapter 7 launches about 40 variants (assumed: its shapes, dtypes and flags).
TRITON_JIT_S = 0.3 * 40
# A GPU notebook's fixed cost: the Jupyter kernel's start, imports, CUDA's start-up, and the BPE
# it trains on the corpus. Importing tutorial_lib, training the BPE and tokenizing took 4.4 s
# in a plain process on the 2-core CI CPU (2026-12-04); 10 s leaves room for the rest (assumed).
NOTEBOOK_S = 10.0
# Chapters 9-11 at the ci preset on the 2-core CI CPU (notebook_times, AMD EPYC, 2026-12-04:
# 13.0, 18.9 and 10.0 s), rounded up to 5 s: they run the same tiny CPU models at either preset.
CPU_CHAPTER_S = {"09": 15.0, "10": 20.0, "11": 15.0}


@dataclass(frozen=True)
class Work:
    """One piece of a chapter: ``steps`` training steps (or forward passes) at ``batch``."""

    chapter: str
    what: str
    policy: str = "bf16"  # a RATE key
    steps: int = 0
    batch: int = 0
    forward_only: bool = False
    seconds: float = 0.0  # fixed seconds (compilation, CPU work)

    def cost(self, cfg: GPTConfig) -> float:
        size = (cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size)  # the model's count
        per_token = (
            flops.forward_flops_per_token(*size)
            if self.forward_only
            else flops.training_flops_per_token(*size)
        )
        rate = H200_BF16_GEMM * STEP_EFFICIENCY * RATE[self.policy]
        return self.seconds + self.steps * self.batch * cfg.block_size * per_token / rate


def _evals(p: RunPreset) -> int:
    return -(-p.steps // p.eval_every) * p.eval_iters if p.eval_every else 0


def book_work(p: RunPreset) -> list[Work]:
    """Every chapter's GPU work at preset ``p`` (the notebooks' cells, in chapter order)."""
    bench, wi = p.bench_batch_size, p.bench_warmup + p.bench_iters
    par, pb = p.parity_steps, p.parity_batch_size
    w = [
        Work("01", "training run", "fp32", p.steps, p.batch_size),
        Work("01", "evaluation", "fp32", _evals(p), p.batch_size, forward_only=True),
        Work("01", "two tokenizer runs, 30 steps each", "fp32", 60, 8),
        Work("01", "profiled steps", "fp32", 2, p.batch_size),
        Work("02", "timed and traced steps", "fp32", 3 * p.bench_iters + 5, p.batch_size),
        Work("03", "FP32 vs BF16 parity", "fp32", par, pb),
        Work("03", "FP32 vs BF16 parity", "bf16", par, pb),
        Work("03", "policy benchmark", "fp32", wi, bench),
        Work("03", "policy benchmark", "tf32", wi, bench),
        Work("03", "policy benchmark", "bf16", 2 * wi, bench),  # bf16 and fp16
        Work("04", "training run", "fp32", min(p.steps, 30), p.batch_size),
        Work("05", "delayed scaling vs BF16", "fp8", par, pb),
        Work("05", "delayed scaling vs BF16", "bf16", par, pb),
        Work("06", "BF16 and the four native recipes", "bf16", 5 * p.recipe_steps, pb),
        Work("06", "MXFP8 and NVFP4 (emulated on Hopper)", "emulated", 2 * p.recipe_steps, pb),
        Work("07", "compiled steps (one compile)", "bf16", 1 + p.bench_iters, bench, seconds=COMPILE_S),
        Work("07", "eager, compiled, Triton steps", "bf16", 3 * wi, bench, seconds=WARM_COMPILE_S),
        Work("07", "op compiles (5 ops x 2 batches, the MLP)", seconds=11 * SMALL_COMPILE_S),
        Work("07", "Triton compiling our kernels", seconds=TRITON_JIT_S),
        Work("07", "compile modes on the ci model", seconds=2 * SMALL_COMPILE_S + AUTOTUNE_S),
        Work("07", "fused and host-timed steps", "fp32", 2 * 4 + 6, bench),
        Work("08", "ladder: fp32, tf32 rungs", "fp32", p.ladder_steps, pb),
        Work("08", "ladder: fp32, tf32 rungs", "tf32", p.ladder_steps, pb),
        Work("08", "ladder: bf16 rungs (eager, compiled)", "bf16", 2 * p.ladder_steps, pb, seconds=WARM_COMPILE_S),
        Work("08", "ladder: fp8 rungs (compiled, eager)", "fp8", 2 * p.ladder_steps, pb, seconds=COMPILE_S),
    ]  # fmt: skip
    chapters = sorted({x.chapter for x in w})
    w += [Work(c, "notebook start, imports, tokenizer", seconds=NOTEBOOK_S) for c in chapters]
    w += [
        Work(c, "CPU processes (same work at every preset)", seconds=s)
        for c, s in CPU_CHAPTER_S.items()
    ]
    return w


def estimate_book(p: RunPreset) -> dict[str, float]:
    """Estimated seconds per chapter ("01" ... "11") on one H200 at preset ``p``."""
    cfg = p.model_config()
    out: dict[str, float] = {}
    for item in book_work(p):
        out[item.chapter] = out.get(item.chapter, 0.0) + item.cost(cfg)
    return dict(sorted(out.items()))


def format_estimate(p: RunPreset) -> str:
    """One line: the book's estimated time at ``p`` on one H200, and the largest chapters."""
    per = estimate_book(p)
    total = sum(per.values())
    top = sorted(per.items(), key=lambda kv: -kv[1])[:3]
    return (
        f"about {total / 60:.1f} min on one H200 (an estimate: {H200_BF16_GEMM / 1e12:.0f} TFLOP/s "
        f"BF16 GEMMs at {STEP_EFFICIENCY:.0%} step efficiency, compile times assumed; budget "
        f"{BOOK_BUDGET_S / 60:.0f} min); longest: "
        + ", ".join(f"chapter {c} {s:.0f} s" for c, s in top)
    )
