"""FP8 GEMM shapes follow Transformer Engine's rule (``assert_dim_for_fp8_exec`` in
``transformer_engine/pytorch/utils.py``): for the input and the weight, the product of all
dimensions but the last divisible by 8, the last dimension by 16. Checked at the boundary."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tutorial_lib.fp8 import FP8_SHAPE_RULE, DelayedScaling, autocast, convert_to_fp8
from tutorial_lib.fp8.convert import fp8_layer_problems
from tutorial_lib.fp8.linear import FP8Linear

RECIPE = DelayedScaling(amax_history_len=4)


def _run(layer: FP8Linear, x: torch.Tensor) -> torch.Tensor:
    with autocast(recipe=RECIPE):
        out = layer(x)
    out.sum().backward()
    return out


def test_weight_24x16_and_24_tokens_run_in_fp8() -> None:
    """out_features 24 and a token count of 24 are multiples of 8, in_features 16 of 16."""
    layer = FP8Linear(16, 24, amax_history_len=4)
    assert _run(layer, torch.randn(24, 16)).shape == (24, 24)
    assert _run(layer, torch.randn(3, 8, 16)).shape == (3, 8, 24)
    assert layer.fp8_amax_history_fwd[-1, 0] > 0  # it ran in FP8: an amax was recorded
    assert fp8_layer_problems(nn.Sequential(nn.Linear(16, 24))) == []
    model = convert_to_fp8(nn.Sequential(nn.Linear(16, 24), nn.Linear(32, 8)), amax_history_len=4)
    assert all(isinstance(m, FP8Linear) for m in model) and fp8_layer_problems(model) == []


@pytest.mark.parametrize(
    ("in_features", "out_features", "tokens", "named"),
    [
        (16, 20, 24, "out_features = 20 is not divisible by 8"),
        (20, 24, 24, "in_features = 20 is not divisible by 16"),
        (16, 24, 20, "multiply to 20, not divisible by 8"),
    ],
    ids=["weight-20x16", "weight-24x20", "input-20x16"],
)
def test_just_off_the_rule_is_refused_naming_it(
    in_features: int, out_features: int, tokens: int, named: str
) -> None:
    layer = FP8Linear(in_features, out_features, amax_history_len=4)
    with pytest.raises(ValueError, match=r"FP8Linear\(.*\)") as info:
        _run(layer, torch.randn(tokens, in_features))
    message = str(info.value)
    assert named in message and FP8_SHAPE_RULE in message and "pad" in message


def test_model_checks_use_the_same_rule() -> None:
    model = nn.Sequential(nn.Linear(16, 20), nn.Linear(20, 16), nn.Linear(32, 8))
    assert fp8_layer_problems(model) == [
        "0: 16 -> 20 (out_features = 20 is not divisible by 8)",
        "1: 20 -> 16 (in_features = 20 is not divisible by 16)",
    ]
    with pytest.raises(ValueError, match="Transformer Engine's shape rule.*0: 16 -> 20"):
        convert_to_fp8(model)


def test_te_source_states_the_rule(te_source: Callable[[str, str], str]) -> None:
    """``assert_dim_for_fp8_exec`` in TE's cached source (both pinned versions) is the rule."""
    for version in ("2.9.0", "2.20.2"):
        source = te_source(version, "pytorch/utils.py")
        body = source[source.index("def assert_dim_for_fp8_exec") :][:800]
        assert "math.prod(tensor.shape[:-1]) % 8" in body and "tensor.shape[-1] % 16" in body
