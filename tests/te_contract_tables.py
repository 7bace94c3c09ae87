"""The Transformer Engine (TE) API the ``te-fp8`` backends rely on, as tables the contract tests
check against TE's source (``test_te_contract.py``) and the stand-in TE follows
(``test_te_backend.py``).

The tables the package itself reads at run time (``TE_RECIPE_FIELDS``, ``TE_RECIPE_POWER_2_FLAGS``,
``TE_RECIPE_QPARAMS``, ``TE_ENUM_MEMBERS``, ``TE_GPU_NEEDS``) stay in
``tutorial_lib.fp8.te_contract``; these declare what ``te_convert`` and ``te_policy`` call, name
or assume, and exist only to be checked.
"""

from __future__ import annotations

from tutorial_lib.fp8.te_contract import TE_RECIPE_FIELDS

# Callables we call -> the keyword arguments we pass them (always by keyword).
TE_API_USED: dict[str, tuple[str, ...]] = {
    "transformer_engine.pytorch.Linear": (
        "in_features",
        "out_features",
        "bias",
        "params_dtype",
        "device",
        "init_method",
    ),
    "transformer_engine.pytorch.LayerNorm": ("normalized_shape", "eps", "dtype", "device"),
    "transformer_engine.pytorch.LayerNormLinear": (
        "in_features",
        "out_features",
        "eps",
        "bias",
        "normalization",
        "params_dtype",
        "device",
        "init_method",
    ),
    "transformer_engine.pytorch.LayerNormMLP": (
        "hidden_size",
        "ffn_hidden_size",
        "eps",
        "bias",
        "normalization",
        "activation",
        "params_dtype",
        "device",
        "init_method",
        "output_layer_init_method",
    ),
    "transformer_engine.pytorch.autocast": ("enabled", "recipe", "amax_reduction_group"),
    "transformer_engine.pytorch.is_fp8_available": ("return_reason",),
    "transformer_engine.pytorch.is_fp8_block_scaling_available": ("return_reason",),
    "transformer_engine.pytorch.is_mxfp8_available": ("return_reason",),
    "transformer_engine.pytorch.is_nvfp4_available": ("return_reason",),
    # dataclasses.replace(qparams, power_2_scale=...): see TE_RECIPE_POWER_2_FLAGS.
    "transformer_engine.common.recipe.QParams": ("power_2_scale",),
}
TE_API_USED.update(
    {f"transformer_engine.common.recipe.{cls}": f for cls, f in TE_RECIPE_FIELDS.items()}
)
# Names the docstrings and the book point readers to (existence only).
TE_API_NAMED: tuple[str, ...] = (
    "transformer_engine.pytorch.TransformerLayer",
    "transformer_engine.pytorch.DotProductAttention",
    "transformer_engine.pytorch.quantized_model_init",
    "transformer_engine.common.recipe.Format",
    "transformer_engine.common.recipe.Recipe",
)
# Defaults we rely on by *not* passing an argument, or mirror in our own recipe (source text).
TE_DEFAULTS_ASSUMED: dict[str, dict[str, str]] = {
    "transformer_engine.common.recipe.DelayedScaling": {
        "margin": "0",
        "fp8_format": "Format.HYBRID",
        "amax_history_len": "1024",
        "amax_compute_algo": "'max'",
        "reduce_amax": "True",
    },
    "transformer_engine.pytorch.autocast": {"enabled": "True", "calibrating": "False"},
    "transformer_engine.pytorch.Linear": {
        "return_bias": "False",
        "parallel_mode": "None",
        "tp_size": "1",
        "sequence_parallel": "False",
    },
    "transformer_engine.pytorch.LayerNorm": {"zero_centered_gamma": "False"},
    # One output tensor, one unsplit weight called "weight", no tensor parallelism, gain 1 + 0.
    "transformer_engine.pytorch.LayerNormLinear": {
        "return_bias": "False",
        "return_layernorm_output": "False",
        "parameters_split": "None",
        "parallel_mode": "None",
        "tp_size": "1",
        "sequence_parallel": "False",
        "zero_centered_gamma": "False",
    },
    "transformer_engine.pytorch.LayerNormMLP": {
        "return_bias": "False",
        "return_layernorm_output": "False",
        "set_parallel_mode": "False",
        "tp_size": "1",
        "sequence_parallel": "False",
        "zero_centered_gamma": "False",
    },
    "transformer_engine.pytorch.is_fp8_available": {"return_reason": "False"},
}
# The parameter names we copy weights into (test_te_contract.py finds each in the class's source).
TE_PARAMETER_NAMES: dict[str, tuple[str, ...]] = {
    "transformer_engine.pytorch.Linear": ("weight", "bias"),
    "transformer_engine.pytorch.LayerNorm": ("weight", "bias"),
    "transformer_engine.pytorch.LayerNormLinear": (
        "layer_norm_weight",
        "layer_norm_bias",
        "weight",
        "bias",
    ),
    "transformer_engine.pytorch.LayerNormMLP": (
        "layer_norm_weight",
        "layer_norm_bias",
        "fc1_weight",
        "fc1_bias",
        "fc2_weight",
        "fc2_bias",
    ),
}
# Columns of a TE module's forward scaling state (tex.FP8FwdTensors, one GEMM).
TE_FWD_INDEX: dict[str, int] = {"input": 0, "weight": 1, "output": 2}
