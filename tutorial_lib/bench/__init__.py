"""Benchmarks that build and train models, and the recorded-results format they write.

This package sits *above* the trainer: it uses ``build_model`` and ``Trainer`` and the
measuring tools of ``tutorial_lib.perf``, and nothing below it imports it.

- ``results``: the recorded-results format (environment stamp, JSON + markdown, the latest
  Hopper record, table helpers) every script under ``benchmarks/`` writes;
- ``policy_bench``: one training step per precision policy (chapter 3, benchmarks/precision.py);
- ``fp8_model``: the roofline model of when FP8 pays off (chapter 5);
- ``gemm_bench``: BF16 vs FP8 GEMM times by width on rotating inputs (chapter 5);
- ``ladder``: chapter 8's ablation ladder (its figures, and ``recipe_cost``'s: ``plots``); ``fusion_bench``: chapter 7's ops and steps;
- ``attention_bench``: attention's peak memory against T, and SDPA's backends (chapter 7);
- ``overheads``: launch-bound steps, torch.compile's modes, the padded vocabulary (chapter 7).
"""

from . import attention_bench, overheads
from .fp8_model import linear_layer_cost, sweep
from .gemm_bench import gemm_sweep, gemm_sweep_table, plot_gemm_sweep
from .policy_bench import benchmark_policies, make_step
from .recipe_runs import loss_curves, recipe_runs
from .results import (
    environment_stamp,
    latest_hopper_results,
    load_results,
    markdown_table,
    results_label,
    write_and_print,
    write_results,
)

__all__ = [
    "attention_bench",
    "overheads",
    # recorded results
    "environment_stamp",
    "write_results",
    "write_and_print",
    "load_results",
    "latest_hopper_results",
    "results_label",
    "markdown_table",
    # precision-policy benchmark (benchmarks/precision.py, chapter 3)
    "benchmark_policies",
    "make_step",
    "recipe_runs",
    "loss_curves",
    # FP8 cost model (chapter 5)
    "linear_layer_cost",
    "sweep",
    # measured BF16 vs FP8 GEMMs on rotating inputs (chapter 5)
    "gemm_sweep",
    "gemm_sweep_table",
    "plot_gemm_sweep",
]
