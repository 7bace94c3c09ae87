"""Model configurations (``GPTConfig``) and run presets (``ci``, ``hopper``).

A *model config* says what the network looks like. A *run preset* says how big a run the
notebooks and the CLI make on the hardware at hand: which model size, batch, steps. The same
notebook runs under both presets; only these numbers change.

The preset comes from ``TUTORIAL_PRESET`` (``ci`` or ``hopper``); when it is unset, an sm_90
GPU (H100/H200) selects ``hopper`` and anything else selects ``ci``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import torch

from .checks import check_positive_ints
from .tokenizer import pad_vocab

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "GPTConfig",
    "GPTConfigOverrides",
    "MODEL_SIZES",
    "RunPreset",
    "PRESETS",
    "get_preset",
    "detect_preset_name",
    "preset_for_capability",
]


class GPTConfigOverrides(TypedDict, total=False):
    """Fields of ``GPTConfig`` to override (``from_name``, ``RunPreset``)."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2-style decoder.

    Sizes:
        vocab_size: number of token ids (256 for the byte tokenizer, 50257 for GPT-2's BPE).
        block_size: maximum context length T; positions are learned up to this length.
        n_layer: number of transformer blocks.
        n_head: attention heads per block; must divide ``n_embd``.
        n_embd: model (hidden) width; the MLP is 4 * n_embd wide.

    Regularisation and layout:
        dropout: dropout probability on attention weights and residual branches.
        bias: whether Linear and LayerNorm layers carry a bias (GPT-2 does).
    """

    vocab_size: int = 256
    block_size: int = 256
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        check_positive_ints(self, ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"))
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                f"every head needs n_embd / n_head channels. Use e.g. n_head="
                f"{_nearest_divisor(self.n_embd, self.n_head)} or change n_embd."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}.")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str, **overrides: Unpack[GPTConfigOverrides]) -> GPTConfig:
        """A named size (``tiny``, ``gpt2-124m``, ...), optionally with fields overridden."""
        if name not in MODEL_SIZES:
            raise KeyError(f"Unknown model size {name!r}. Available: {', '.join(MODEL_SIZES)}.")
        return dataclasses.replace(MODEL_SIZES[name], **overrides)


def _nearest_divisor(n: int, near: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))


# GPT-2 sizes follow Radford et al. (2019) with GPT-2's 50257-token vocabulary; a preset sets
# `vocab_size` from its tokenizer (RunPreset.vocab_size: 256 bytes, or a padded BPE).
MODEL_SIZES: dict[str, GPTConfig] = {
    # CI-sized: 0.84M parameters, ~0.2-0.3 s per FP32 training step on 2 CPU cores.
    "tiny": GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128),
    "small": GPTConfig(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384),
    "gpt2-124m": GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": GPTConfig(vocab_size=50257, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    "gpt2-774m": GPTConfig(vocab_size=50257, block_size=1024, n_layer=36, n_head=20, n_embd=1280),
    "gpt2-1.5b": GPTConfig(vocab_size=50257, block_size=1024, n_layer=48, n_head=25, n_embd=1600),
    # FP8 needs wide GEMMs before it pays off (chapter 5's cost model); hidden 4096 matches TE's
    # own single-layer benchmark (hidden 4096, FFN 16384, seq 2048).
    "fp8-2.7b": GPTConfig(vocab_size=50257, block_size=2048, n_layer=12, n_head=32, n_embd=4096),
}


@dataclass(frozen=True)
class RunPreset:
    """How big a run the notebooks and CLI make.

    Model:
        model: name in ``MODEL_SIZES``; ``model_overrides`` changes fields (e.g. vocab 256).
    Training:
        batch_size: sequences per micro-batch; ``grad_accum`` micro-batches per step.
        steps: optimizer steps for the chapter's training run; ``eval_every``/``eval_iters``.
        lr, warmup_steps: peak learning rate and linear warm-up length.
    Benchmarks:
        bench_warmup, bench_iters: timing iterations for ``perf.benchmark``.
        bench_batch_size: sequences per timed training step in the benchmarks.
        gemm_widths: n of the n x n x n BF16 and FP8 GEMMs that chapter 5 times on rotating
            inputs (``bench.gemm_sweep``); multiples of 16, ``torch._scaled_mm``'s rule.
        gemm_small_width: the small GEMM timed on the same inputs every call, kept as the
            example of a launch/L2-bound measurement.
    Comparisons (chapter 3's FP32 vs BF16 parity run, and later ones):
        parity_steps, parity_batch_size: a shorter run, since BF16 is slow on CPUs without BF16
            matrix instructions (AVX2 only).
        ladder_steps: steps per rung of chapter 8's ablation ladder (batch parity_batch_size).
        recipe_steps: steps per run of chapter 6's FP8 recipe comparison (seven runs, BF16 and
            six recipes; batch parity_batch_size).
    sample_tokens: how many tokens ``generate`` writes in the sampling demos.
    tokenizer: what the notebooks (``data.preset_data``) and ``train`` on the command line
        tokenize with: ``"bytes"`` (256 symbols) or ``"bpe"`` (``tokenizer.train_bpe`` asked for
        ``bpe_vocab`` tokens). ``vocab_size`` is the model's rows: the named size's under bytes
        (256), or ``bpe_vocab`` padded to a multiple of 64 (GPT-2's 50,257 becomes 50,304),
        whatever the corpus let the tokenizer learn (rows past its vocabulary are never a
        target).
    """

    name: str
    model: str
    model_overrides: GPTConfigOverrides = field(default_factory=GPTConfigOverrides)
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 100
    eval_every: int = 25
    eval_iters: int = 4
    lr: float = 3e-3
    warmup_steps: int = 10
    bench_warmup: int = 2
    bench_iters: int = 5
    bench_batch_size: int = 16
    gemm_widths: tuple[int, ...] = (192, 256, 384)
    gemm_small_width: int = 128
    parity_steps: int = 100
    parity_batch_size: int = 16
    ladder_steps: int = 100
    recipe_steps: int = 100
    sample_tokens: int = 200
    tokenizer: str = "bytes"
    bpe_vocab: int = 1024

    def __post_init__(self) -> None:
        if self.tokenizer not in ("bytes", "bpe"):
            raise ValueError(
                f"RunPreset {self.name!r}: tokenizer={self.tokenizer!r}; use 'bytes' or 'bpe'."
            )
        if self.bpe_vocab < 258:  # the 256 bytes and the end-of-text token, then merges
            raise ValueError(
                f"RunPreset {self.name!r}: bpe_vocab={self.bpe_vocab} leaves no room for merges "
                "after the 256 bytes and the end-of-text token; ask for 258 or more."
            )

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary rows: ``model_config().vocab_size``."""
        return self.model_config().vocab_size

    def model_config(self, **overrides: Unpack[GPTConfigOverrides]) -> GPTConfig:
        """The named size with the preset's overrides, then ``overrides``. Under a BPE preset
        the vocabulary is ``bpe_vocab`` padded to a multiple of 64 (``tokenizer.pad_vocab``);
        a bytes preset keeps the named size's (256 for the book's byte-level sizes)."""
        merged: GPTConfigOverrides = {**self.model_overrides, **overrides}
        if self.tokenizer == "bpe" and "vocab_size" not in merged:
            merged["vocab_size"] = pad_vocab(self.bpe_vocab)
        return GPTConfig.from_name(self.model, **merged)


PRESETS: dict[str, RunPreset] = {
    # 2 CPU cores: ~0.2-0.3 s per FP32 step for `tiny` (REFERENCE.md), so 80 steps take ~20 s
    # and bring the byte-level loss from ln(256) = 5.5 to below 3.
    "ci": RunPreset(
        name="ci",
        model="tiny",
        batch_size=16,
        steps=80,
        eval_every=20,
        eval_iters=4,
        lr=3e-3,
        warmup_steps=8,
        # A BF16 step on a CPU without BF16 matrix instructions took ~10x an FP32 one on an
        # AVX2-only EPYC: keep BF16 benchmark steps, the parity run and the ladder small, so
        # every notebook stays within its 90 s budget (benchmarks/notebook_times.py records it).
        bench_warmup=1,
        bench_iters=5,
        bench_batch_size=4,
        # BF16 GEMMs ran at ~1.2 GFLOP/s on the AVX2-only EPYC: these widths cost ~1 GFLOP
        # over warm-up + timed calls, about 1 s there (much less with BF16 matrix units).
        gemm_widths=(192, 256, 384),
        gemm_small_width=128,
        parity_steps=30,
        parity_batch_size=4,
        ladder_steps=15,
        # seven runs; the BF16 one costs most where BF16 has no matrix units (~1 s a step on
        # the AVX2-only EPYC): 10 steps keep the chapter under a minute there
        recipe_steps=10,
        sample_tokens=120,
    ),
    # One H100/H200: GPT-2 124M, its 12 layers x 768 width and a BPE vocabulary of GPT-2's size
    # (50,257 tokens asked, 50,304 rows): 124.5M parameters with the tied embedding, 16K tokens
    # per step, so the LM head and the loss cost what they cost in GPT-2. Sized so that
    # `make hopper-check` (every notebook and benchmark) fits its budget on one H200: an FP32
    # step is about 14 TFLOP (6N + attention per token), ~0.2 s at FP32's 67 TFLOP/s, and FP32
    # runs in chapters 1-4 and in the ladder dominate. An estimate from the datasheet until a
    # hopper-check run measures it.
    "hopper": RunPreset(
        name="hopper",
        model="gpt2-124m",
        # Sized so that the whole book is estimated to run within 8 minutes on one H200
        # (tutorial_lib.book_cost; tests/test_book_cost.py): a notebook shows each effect at
        # the real model's shapes in a few dozen steps; long runs belong in benchmarks/.
        batch_size=8,
        steps=30,
        eval_every=15,
        eval_iters=4,
        lr=1e-3,
        warmup_steps=10,
        bench_warmup=3,
        bench_iters=10,
        bench_batch_size=8,
        # Wide enough that the GEMMs, not the launch, take the time (2 x 4096^3 FLOP is ~140 us
        # at BF16's dense peak); 1024 is the launch/L2-bound example (~2 us at that peak).
        gemm_widths=(4096, 6144, 8192),
        gemm_small_width=1024,
        parity_steps=30,
        parity_batch_size=8,
        ladder_steps=20,
        recipe_steps=20,
        sample_tokens=300,
        tokenizer="bpe",
        bpe_vocab=50257,  # GPT-2's, padded to 50,304 rows in the model
    ),
}


def preset_for_capability(capability: tuple[int, int] | None) -> str:
    """The preset auto-detection picks for a CUDA compute capability (None: no CUDA GPU)."""
    return "hopper" if capability == (9, 0) else "ci"


def detect_preset_name() -> str:
    """``hopper`` on an sm_90 CUDA device, else ``ci``."""
    cuda = torch.cuda.is_available()
    return preset_for_capability(torch.cuda.get_device_capability(0) if cuda else None)


def get_preset(name: str | None = None) -> RunPreset:
    """The preset named ``name``, else ``$TUTORIAL_PRESET``, else the auto-detected one."""
    chosen = (name or os.environ.get("TUTORIAL_PRESET", "")).strip().lower()
    chosen = chosen or detect_preset_name()
    if chosen not in PRESETS:
        raise ValueError(
            f"Unknown preset {chosen!r} (from TUTORIAL_PRESET or the argument). "
            f"Available: {', '.join(PRESETS)}."
        )
    return PRESETS[chosen]
