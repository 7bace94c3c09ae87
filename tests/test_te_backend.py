"""Tests for the ``te-fp8``/``te-fp8-fused`` Transformer Engine backend of tutorial_lib.fp8
(``te_contract``, ``te_convert``, ``te_policy``).

Three groups:
    - without TE (every machine here): the module imports, reports TE missing, fails clearly;
    - with a *stand-in* TE installed into ``sys.modules`` (``fake_te``): the plumbing (model
      conversion, fused or not, recipe and autocast dispatch) on the CPU. The stand-in's
      signatures are the subset of TE's that ``TE_API_USED`` declares and its parameter names
      are ``TE_PARAMETER_NAMES`` (both in ``te_contract_tables``); ``test_te_contract.py`` checks
      both against TE's real source (and that TE's "gelu" is the tanh approximation the stand-in computes);
    - with TE and an sm_89+ GPU: training parity with BF16 and our ``fp8`` policy (and of
      ``te-fp8-fused`` with ``te-fp8``), and TE's amax histories and scales (skipped elsewhere,
      with the reason).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from te_contract_tables import TE_FWD_INDEX, TE_PARAMETER_NAMES
from torch import nn

from tutorial_lib.build import build_model
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.fp8.convert import fp8_layer_problems
from tutorial_lib.fp8.policy import FP8_LOSS_TOLERANCE
from tutorial_lib.fp8.te_contract import TE_GPU_NEEDS, TE_RECIPE_FIELDS, TE_RECIPE_QPARAMS
from tutorial_lib.fp8.te_convert import TEFusedMLP, convert_to_te
from tutorial_lib.fp8.te_policy import (
    TE_FUSED_POLICY_NAME,
    TE_POLICY_NAME,
    TE_RECIPE_SHORT_NAMES,
    check_te_fp8_device,
    make_te_policy,
    register_te_policy,
    te_autocast,
    te_recipe,
    te_recipe_kind,
    te_recipe_kwargs,
    te_recipe_options,
    te_recipe_short_name,
)
from tutorial_lib.hardware import te_available
from tutorial_lib.model import GPT
from tutorial_lib.precision import (
    POLICIES,
    PrecisionPolicy,
    available_policies,
    get_policy,
)
from tutorial_lib.train import TrainConfig, Trainer

TE_OK, TE_REASON = te_available()
needs_no_te = pytest.mark.skipif(TE_OK, reason="Transformer Engine is installed here")
needs_te = pytest.mark.skipif(not TE_OK, reason=TE_REASON)

# Widths divisible by 16, as TE's FP8 GEMMs need (the conftest TINY model, width 36, is not).
FP8_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)
TE_POLICY_NAMES = (TE_POLICY_NAME, TE_FUSED_POLICY_NAME)


@pytest.fixture
def registry() -> Iterator[dict[str, PrecisionPolicy]]:
    """The policy registry without ``te-fp8`` and ``te-fp8-fused``, restored exactly afterwards."""
    saved = dict(POLICIES)
    for name in TE_POLICY_NAMES:
        POLICIES.pop(name, None)
    yield POLICIES
    POLICIES.clear()
    POLICIES.update(saved)


# ---- without TE --------------------------------------------------------------------------------
@needs_no_te
def test_reports_te_missing_with_reason() -> None:
    ok, reason = te_available()
    assert ok is False
    assert "transformer_engine" in reason


@needs_no_te
@pytest.mark.parametrize(
    "call",
    [
        lambda: te_autocast().__enter__(),
        lambda: te_recipe(),
        lambda: convert_to_te(nn.Sequential(nn.Linear(16, 16))),
        lambda: convert_to_te(GPT(FP8_CFG), fused=True),
    ],
    ids=["te_autocast", "te_recipe", "convert_to_te", "fused"],
)
def test_needing_te_raises_with_reason_and_install_route(call: Callable[[], object]) -> None:
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    assert TE_REASON in message
    assert "te_install.md" in message and "--no-build-isolation" in message
    assert "nvcr.io/nvidia/pytorch" in message


@pytest.mark.parametrize("fused", [False, True], ids=["te-fp8", "te-fp8-fused"])
def test_policy_check_refuses_the_cpu(fused: bool) -> None:
    policy = make_te_policy(fused=fused)
    with pytest.raises(RuntimeError, match="sm_89") as info:
        policy.validate("cpu")
    assert f"The {policy.name!r} precision policy" in str(info.value)
    assert "'bf16'" in str(info.value)
    if not TE_OK:  # TE's own reason, e.g. "No module named 'transformer_engine'"
        assert "Transformer Engine is missing" in str(info.value)
        assert TE_REASON in str(info.value)


def test_policy_fields() -> None:
    policy = make_te_policy()
    assert policy.name == TE_POLICY_NAME == "te-fp8"
    assert policy.autocast_dtype is torch.bfloat16
    assert policy.peak_dtype == "fp8"
    assert not policy.grad_scaler
    assert policy.prepare_model.func is convert_to_te
    assert policy.prepare_model.keywords == {"fused": False}
    assert policy.check.func is check_te_fp8_device
    assert policy.check.keywords == {"policy_name": "te-fp8", "recipe": "delayed"}
    assert policy.extra_context is not None


def test_fused_policy_fields() -> None:
    policy, plain = make_te_policy(fused=True), make_te_policy()
    assert policy.name == TE_FUSED_POLICY_NAME == "te-fp8-fused"
    for field in ("autocast_dtype", "peak_dtype", "grad_scaler", "allow_tf32"):
        assert getattr(policy, field) == getattr(plain, field), field
    prepare, check = policy.prepare_model, policy.check
    assert isinstance(prepare, functools.partial) and prepare.func is convert_to_te
    assert prepare.keywords == {"fused": True}
    assert isinstance(check, functools.partial) and check.func is check_te_fp8_device


def test_register_is_idempotent_and_listed(registry: dict[str, PrecisionPolicy]) -> None:
    first = register_te_policy()
    fused = registry[TE_FUSED_POLICY_NAME]  # registered with it
    assert register_te_policy() is first and register_te_policy(fused=True) is fused
    assert registry[TE_POLICY_NAME] is first and fused.name == TE_FUSED_POLICY_NAME
    assert list(registry)[-2:] == list(TE_POLICY_NAMES)  # te-fp8-fused listed after te-fp8
    for name in TE_POLICY_NAMES:
        assert get_policy(name) is registry[name]
        with pytest.raises(RuntimeError, match=f"'{name}'.*sm_89"):
            get_policy(name, "cpu")


def test_listing_policies_registers_both(registry: dict[str, PrecisionPolicy]) -> None:
    assert set(TE_POLICY_NAMES) <= set(available_policies())  # lazily, through te-fp8's entry


def test_fused_policy_loads_lazily_by_name(registry: dict[str, PrecisionPolicy]) -> None:
    assert get_policy(TE_FUSED_POLICY_NAME).name == TE_FUSED_POLICY_NAME


# ---- recipe conversion (pure Python) -----------------------------------------------------------
class _OurFormat(enum.Enum):
    E4M3 = "e4m3"
    HYBRID = "hybrid"
    E5M2 = "e5m2"


@dataclass
class _OurRecipe:
    margin: int = 0
    fp8_format: Any = _OurFormat.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    reduce_amax: bool = True


TE_DEFAULT_KWARGS = {
    "margin": 0,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "max",
    "reduce_amax": True,
}


def test_recipe_kwargs_read_duck_typed() -> None:
    assert te_recipe_kwargs(_OurRecipe()) == TE_DEFAULT_KWARGS
    custom = _OurRecipe(2, _OurFormat.E4M3, 16, "most_recent", False)
    assert te_recipe_kwargs(custom) == {
        "margin": 2,
        "fp8_format": "E4M3",
        "amax_history_len": 16,
        "amax_compute_algo": "most_recent",
        "reduce_amax": False,
    }
    assert te_recipe_kwargs(_OurRecipe(fp8_format="hybrid"))["fp8_format"] == "HYBRID"
    algo = torch.amax
    assert te_recipe_kwargs(_OurRecipe(amax_compute_algo=algo))["amax_compute_algo"] is algo


def test_recipe_kwargs_match_our_recipe_defaults() -> None:
    """Our ``DelayedScaling`` mirrors TE's defaults, so its conversion is TE's default recipe."""
    from tutorial_lib.fp8 import DelayedScaling

    assert te_recipe_kwargs(DelayedScaling()) == TE_DEFAULT_KWARGS


@pytest.mark.parametrize(
    ("recipe", "error", "match"),
    [
        (_OurRecipe(fp8_format=_OurFormat.E5M2), ValueError, "pure E5M2"),
        (_OurRecipe(fp8_format="E3M4"), ValueError, "Unknown FP8 format"),
        (_OurRecipe(amax_compute_algo="mean"), ValueError, "amax_compute_algo"),
        (_OurRecipe(amax_history_len=0), ValueError, "amax_history_len"),
        (types.SimpleNamespace(margin=0), TypeError, "lacks"),
    ],
    ids=["e5m2", "unknown-format", "bad-algo", "empty-history", "not-a-recipe"],
)
def test_recipe_kwargs_refuse(recipe: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        te_recipe_kwargs(recipe)


# ---- shapes ------------------------------------------------------------------------------------
def test_shape_problems_name_the_layers(tiny_cfg: GPTConfig) -> None:
    problems = fp8_layer_problems(GPT(tiny_cfg))  # width 36: every Linear is off
    assert len(problems) == 4 * tiny_cfg.n_layer
    assert any(p.startswith("blocks.0.attn.qkv: 36 -> 108") for p in problems)
    assert fp8_layer_problems(GPT(FP8_CFG)) == []


def test_shape_problems_skip_a_tied_head() -> None:
    emb = nn.Embedding(100, 32)
    head = nn.Linear(32, 100, bias=False)
    head.weight = emb.weight  # tied: 100 is not a multiple of 16, but the head is not converted
    assert fp8_layer_problems(nn.ModuleDict({"emb": emb, "head": head})) == []


# ---- a stand-in TE on the CPU ------------------------------------------------------------------
class _FakeTEModule(nn.Module):
    """What the stand-in modules share with TE's: parameters registered under TE's names (see
    ``TE_PARAMETER_NAMES``), and a dropped bias kept as an empty tensor, not None."""

    def __init__(self, dtype: torch.dtype | None, device: torch.device | str | None) -> None:
        super().__init__()
        self._like = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        self.fp8_meta: dict[str, Any] = {}

    def _weight(
        self, name: str, out_f: int, in_f: int, init: Callable[[torch.Tensor], None] | None
    ) -> None:
        self.register_parameter(name, nn.Parameter(torch.empty(out_f, in_f, **self._like)))
        (init or (lambda w: nn.init.normal_(w, 0.0, 0.023)))(getattr(self, name))

    def _bias(self, name: str, features: int, bias: bool) -> None:
        if bias:
            self.register_parameter(name, nn.Parameter(torch.zeros(features, **self._like)))
        else:
            setattr(self, name, torch.Tensor().to(**self._like))

    def _norm(self, prefix: str, features: int, normalization: str) -> None:
        assert normalization == "LayerNorm", normalization  # the stand-in has no RMSNorm
        self.register_parameter(f"{prefix}weight", nn.Parameter(torch.ones(features, **self._like)))
        self._bias(f"{prefix}bias", features, bias=True)

    def _layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        weight, bias = getattr(self, f"{prefix}weight"), getattr(self, f"{prefix}bias")
        return F.layer_norm(x, weight.shape, weight, bias, self.eps)

    @staticmethod
    def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, bias if bias.numel() else None)


class _FakeLinear(_FakeTEModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str = "cuda",
        init_method: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        super().__init__(params_dtype, device)
        self._weight("weight", out_features, in_features, init_method)
        self._bias("bias", out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.weight, self.bias)


class _FakeLayerNorm(_FakeTEModule):
    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        *,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(dtype, device)
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        (features,) = shape
        self.normalized_shape, self.eps = tuple(shape), eps
        self._norm("", features, "LayerNorm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._layer_norm(x, "")


class _FakeLayerNormLinear(_FakeTEModule):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        normalization: str = "LayerNorm",
        params_dtype: torch.dtype | None = None,
        device: torch.device | str = "cuda",
        init_method: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        super().__init__(params_dtype, device)
        self.eps = eps
        self._norm("layer_norm_", in_features, normalization)
        self._weight("weight", out_features, in_features, init_method)
        self._bias("bias", out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(self._layer_norm(x, "layer_norm_"), self.weight, self.bias)


class _FakeLayerNormMLP(_FakeTEModule):
    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        params_dtype: torch.dtype | None = None,
        device: torch.device | str = "cuda",
        init_method: Callable[[torch.Tensor], None] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        super().__init__(params_dtype, device)
        assert activation == "gelu", activation  # TE's "gelu": the tanh approximation
        self.eps = eps
        self._norm("layer_norm_", hidden_size, normalization)
        self._weight("fc1_weight", ffn_hidden_size, hidden_size, init_method)
        self._bias("fc1_bias", ffn_hidden_size, bias)
        self._weight("fc2_weight", hidden_size, ffn_hidden_size, output_layer_init_method)
        self._bias("fc2_bias", hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._linear(self._layer_norm(x, "layer_norm_"), self.fc1_weight, self.fc1_bias)
        return self._linear(F.gelu(h, approximate="tanh"), self.fc2_weight, self.fc2_bias)


class _FakeFormat(enum.Enum):
    E2M1 = 6.0
    E4M3 = 448.0
    E5M2 = 57344.0
    HYBRID = (448.0, 57344.0)


# TE's recipes: their fields are TE_RECIPE_FIELDS (test_stand_in_recipes_have_te_fields), the
# fp8_quant_* parameters class attributes (not fields), and a few of TE's __post_init__ asserts.
@dataclass(frozen=True)
class _FakeQParams:
    power_2_scale: bool = False
    amax_epsilon: float = 0.0


@dataclass(frozen=True)
class _FakeMMParams:
    use_split_accumulator: bool = True


class _FakeRecipe:
    """TE's ``Recipe`` base class."""


def _no_e5m2(recipe: Any) -> None:
    assert recipe.fp8_format != _FakeFormat.E5M2, "Pure E5M2 training is not supported."


@dataclass
class _FakeDelayedScaling(_FakeRecipe):
    margin: int = 0
    fp8_format: _FakeFormat = _FakeFormat.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    reduce_amax: bool = True
    scaling_factor_compute_algo: Any = None
    fp8_dpa: bool = False
    fp8_mha: bool = False
    __post_init__ = _no_e5m2


@dataclass
class _FakeFloat8CurrentScaling(_FakeRecipe):
    use_power_2_scales: bool = False
    fp8_format: _FakeFormat = _FakeFormat.HYBRID
    fp8_quant_fwd_inp = fp8_quant_fwd_weight = fp8_quant_bwd_grad = _FakeQParams(False)
    fp8_gemm_fprop: _FakeMMParams = _FakeMMParams(False)
    fp8_gemm_dgrad: _FakeMMParams = _FakeMMParams(True)
    fp8_gemm_wgrad: _FakeMMParams = _FakeMMParams(True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    __post_init__ = _no_e5m2


@dataclass
class _FakeFloat8BlockScaling(_FakeRecipe):
    use_f32_scales: bool = False
    fp8_format: _FakeFormat = _FakeFormat.E4M3
    fp8_quant_fwd_inp = fp8_quant_fwd_weight = fp8_quant_bwd_grad = _FakeQParams(True)
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: _FakeMMParams = _FakeMMParams(True)
    fp8_gemm_dgrad: _FakeMMParams = _FakeMMParams(True)
    fp8_gemm_wgrad: _FakeMMParams = _FakeMMParams(True)
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        assert not (self.x_block_scaling_dim == 2 and self.w_block_scaling_dim == 2), (
            "2D by 2D block gemm not supported."
        )
        _no_e5m2(self)


@dataclass
class _FakeMXFP8BlockScaling(_FakeRecipe):
    margin: int = 0
    fp8_format: _FakeFormat = _FakeFormat.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    __post_init__ = _no_e5m2


@dataclass
class _FakeNVFP4BlockScaling(_FakeRecipe):
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    fp4_format: _FakeFormat = _FakeFormat.E2M1
    fp8_format: _FakeFormat = _FakeFormat.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        assert self.fp8_format == _FakeFormat.E4M3, "Only E4M3 is supported for NVFP4 scaling"


FAKE_RECIPES: dict[str, type] = {
    "DelayedScaling": _FakeDelayedScaling,
    "Float8CurrentScaling": _FakeFloat8CurrentScaling,
    "Float8BlockScaling": _FakeFloat8BlockScaling,
    "MXFP8BlockScaling": _FakeMXFP8BlockScaling,
    "NVFP4BlockScaling": _FakeNVFP4BlockScaling,
}


@dataclass
class FakeTE:
    """What the stand-in records: every (name, kwargs) of an autocast entered."""

    pytorch: types.ModuleType
    regions: list[tuple[str, dict[str, Any]]]


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> FakeTE:
    """A stand-in ``transformer_engine`` (2.9 or later) in ``sys.modules``."""
    regions: list[tuple[str, dict[str, Any]]] = []

    def region(name: str) -> Callable[..., contextlib.AbstractContextManager[None]]:
        @contextlib.contextmanager
        def enter(**kwargs: Any) -> Iterator[None]:
            regions.append((name, kwargs))
            yield

        return enter

    root, common = types.ModuleType("transformer_engine"), types.ModuleType("_common")
    pytorch, recipe = types.ModuleType("_pytorch"), types.ModuleType("_recipe")
    pytorch.Linear, pytorch.LayerNorm = _FakeLinear, _FakeLayerNorm
    pytorch.LayerNormLinear, pytorch.LayerNormMLP = _FakeLayerNormLinear, _FakeLayerNormMLP
    pytorch.autocast = region("autocast")
    for need in TE_GPU_NEEDS.values():  # is_fp8_available, is_mxfp8_available, ...
        setattr(
            pytorch,
            need.te_check,
            lambda return_reason=False: (True, "") if return_reason else True,
        )
    for name, cls in {**FAKE_RECIPES, "Recipe": _FakeRecipe, "Format": _FakeFormat}.items():
        setattr(recipe, name, cls)
    recipe.QParams, recipe.MMParams = _FakeQParams, _FakeMMParams
    root.pytorch, root.common, common.recipe = pytorch, common, recipe
    for name, module in {
        "transformer_engine": root,
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": recipe,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return FakeTE(pytorch, regions)


def test_fake_te_counts_as_available(fake_te: FakeTE) -> None:
    assert te_available() == (True, "transformer_engine.pytorch imports")


def test_convert_keeps_the_function(fake_te: FakeTE) -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(FP8_CFG, bias=False)).eval()
    idx = torch.randint(0, 256, (2, 16))
    before = model(idx)[0]
    converted = convert_to_te(copy.deepcopy(model), device="cpu")
    assert not any(type(m) in (nn.Linear, nn.LayerNorm) for m in converted.modules())
    assert type(converted.tok_emb) is nn.Embedding  # the tied embedding/LM head stays
    torch.testing.assert_close(converted(idx)[0], before, rtol=0, atol=0)
    assert not converted.training
    ln = converted.blocks[0].ln1
    assert isinstance(ln, _FakeLayerNorm) and not ln.bias.requires_grad


def test_convert_leaves_a_tied_head(fake_te: FakeTE) -> None:
    emb, head = nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "body": nn.Linear(32, 32), "head": head})
    convert_to_te(model, device="cpu")
    assert model["head"] is head and model["head"].weight is model["emb"].weight
    assert isinstance(model["body"], _FakeLinear)


def test_convert_refuses_odd_shapes(fake_te: FakeTE, tiny_cfg: GPTConfig) -> None:
    with pytest.raises(ValueError, match="divisible by 16.*blocks.0.attn.qkv"):
        convert_to_te(GPT(tiny_cfg), device="cpu")


# ---- fused conversion: LayerNormLinear and LayerNormMLP ----------------------------------------
@pytest.mark.parametrize(
    "fake",
    [_FakeLinear, _FakeLayerNorm, _FakeLayerNormLinear, _FakeLayerNormMLP],
    ids=lambda cls: cls.__name__,
)
def test_stand_in_uses_te_parameter_names(fake: type[nn.Module]) -> None:
    """The names test_te_contract.py finds in TE's source are the stand-in's too."""
    args = {_FakeLayerNorm: (16,), _FakeLayerNormMLP: (16, 64)}.get(fake, (16, 48))
    names = [n for n, _ in fake(*args, device="cpu").named_parameters()]
    assert tuple(names) == TE_PARAMETER_NAMES[f"transformer_engine.pytorch.{fake.__name__[5:]}"]


# Fused parameter -> the parameter of the unconverted GPT it was copied from (block i).
FUSED_SOURCES = {
    "attn.qkv.layer_norm_weight": "ln1.weight",
    "attn.qkv.layer_norm_bias": "ln1.bias",
    "attn.qkv.weight": "attn.qkv.weight",
    "attn.qkv.bias": "attn.qkv.bias",
    "mlp.layernorm_mlp.layer_norm_weight": "ln2.weight",
    "mlp.layernorm_mlp.layer_norm_bias": "ln2.bias",
    "mlp.layernorm_mlp.fc1_weight": "mlp.fc.weight",
    "mlp.layernorm_mlp.fc1_bias": "mlp.fc.bias",
    "mlp.layernorm_mlp.fc2_weight": "mlp.proj.weight",
    "mlp.layernorm_mlp.fc2_bias": "mlp.proj.bias",
}


def _fused_pairs(
    fused: nn.Module, plain: nn.Module
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """(name, fused parameter, the plain model's source or None if it has none)."""
    fused_params, plain_params = dict(fused.named_parameters()), dict(plain.named_parameters())
    for i in range(FP8_CFG.n_layer):
        for new, old in FUSED_SOURCES.items():
            new_p, old_p = (
                fused_params.get(f"blocks.{i}.{new}"),
                plain_params.get(f"blocks.{i}.{old}"),
            )
            if new_p is None:  # a Linear bias TE dropped as the GPT did (bias=False)
                assert old_p is None and new.endswith("bias"), new
                continue
            yield new, new_p, old_p


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fused_convert_keeps_the_function(fake_te: FakeTE, bias: bool) -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(FP8_CFG, bias=bias))
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped copy would show
        for name, p in model.named_parameters():
            if ".ln" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    idx, targets = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    fused = convert_to_te(copy.deepcopy(model), device="cpu", fused=True)
    for m in (model, fused):
        m(idx, targets)[1].backward()
    torch.testing.assert_close(fused(idx, targets), model(idx, targets))  # logits, loss: FP32
    for name, new, old in _fused_pairs(fused, model):
        if old is None:  # a LayerNorm bias GPT does not have: TE's is pinned to zero
            assert name.endswith("layer_norm_bias") and not new.requires_grad, name
            assert torch.all(new == 0) and new.grad is None, name
            continue
        torch.testing.assert_close(new, old, rtol=0, atol=0, msg=name)
        assert new.grad is not None, f"no gradient reaches {name}"
        torch.testing.assert_close(new.grad, old.grad, msg=name)
    trainable = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in (model, fused)]
    assert trainable[0] == trainable[1]


def test_fused_convert_installs_te_modules(fake_te: FakeTE) -> None:
    model = GPT(FP8_CFG).eval()
    fused = convert_to_te(model, device="cpu", fused=True)
    assert fused is model and not any(type(m) in (nn.Linear, nn.LayerNorm) for m in model.modules())
    for block in model.blocks:
        assert type(block.ln1) is nn.Identity and type(block.ln2) is nn.Identity
        assert type(block.attn.qkv) is _FakeLayerNormLinear
        assert type(block.attn.proj) is _FakeLinear  # the rest as before
        assert type(block.mlp) is TEFusedMLP and type(block.mlp.layernorm_mlp) is _FakeLayerNormMLP
        assert not block.mlp.training and not block.attn.qkv.training
        assert block.mlp.layernorm_mlp.eps == block.attn.qkv.eps == 1e-5
    assert type(model.ln_f) is _FakeLayerNorm and type(model.tok_emb) is nn.Embedding
    keys = set(model.state_dict())
    assert {"blocks.0.attn.qkv.layer_norm_weight", "blocks.1.mlp.layernorm_mlp.fc2_bias"} <= keys
    assert not any(".ln1." in k or ".ln2." in k for k in keys)


def test_fused_mlp_keeps_dropout(fake_te: FakeTE) -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(FP8_CFG, dropout=0.25)).train()
    fused = convert_to_te(copy.deepcopy(model), device="cpu", fused=True)
    assert fused.blocks[0].mlp.drop.p == 0.25 and fused.training
    idx = torch.randint(0, 256, (2, 16))
    outs = []
    for m, training in ((model, True), (fused, True), (fused, False)):
        torch.manual_seed(1)  # the same dropout masks from the same seed
        outs.append(m.train(training)(idx)[0])
    torch.testing.assert_close(outs[1], outs[0])
    assert not torch.allclose(outs[1], outs[2])  # dropout was on in training mode


def test_fused_convert_refuses_odd_shapes(fake_te: FakeTE, tiny_cfg: GPTConfig) -> None:
    with pytest.raises(ValueError, match="divisible by 16.*blocks.0.attn.qkv"):
        convert_to_te(GPT(tiny_cfg), device="cpu", fused=True)


def _proj_without_bias(model: GPT) -> GPT:
    model.blocks[1].mlp.proj = nn.Linear(4 * FP8_CFG.n_embd, FP8_CFG.n_embd, bias=False)
    return model


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: convert_to_te(GPT(FP8_CFG), device="cpu"), "blocks.0.ln1 is _FakeLayerNorm"),
        (lambda: nn.Sequential(nn.Linear(16, 16)), "has no Block"),
        (lambda: _proj_without_bias(GPT(FP8_CFG)), "blocks.1.mlp: fc and proj must both"),
    ],
    ids=["converted-already", "no-block", "mixed-bias"],
)
def test_fused_convert_refuses_other_models(
    fake_te: FakeTE, make: Callable[[], nn.Module], match: str
) -> None:
    model = make()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"fused=True.*{match}.*fused=False"):
        convert_to_te(model, device="cpu", fused=True)
    after = model.state_dict()  # nothing was swapped before the error
    assert after.keys() == before.keys()


def test_fused_policy_with_te_available(
    fake_te: FakeTE, registry: dict[str, PrecisionPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = register_te_policy(fused=True)
    assert get_policy(TE_FUSED_POLICY_NAME) is policy
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake H100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    assert get_policy(TE_FUSED_POLICY_NAME, "cuda") is policy  # the check passes
    why = (False, "Device compute capability 8.9 or higher required for FP8 execution.")
    monkeypatch.setattr(fake_te.pytorch, "is_fp8_available", lambda return_reason=False: why)
    with pytest.raises(RuntimeError, match="'te-fp8-fused'.*TE reports no FP8 .*8.9 or higher"):
        get_policy(TE_FUSED_POLICY_NAME, "cuda")  # TE's own verdict, with its reason
    assert policy.prepare_model is not None  # convert_to_te(..., fused=True)
    converted = policy.prepare_model(GPT(FP8_CFG), device="cpu")  # type: ignore[call-arg]
    assert type(converted.blocks[0].mlp) is TEFusedMLP


def test_autocast_dispatch_and_recipe(fake_te: FakeTE) -> None:
    ours = _OurRecipe(margin=1, fp8_format=_OurFormat.E4M3, amax_history_len=8)
    with te_autocast(recipe=ours, amax_reduction_group="group"):
        pass
    ((name, kwargs),) = fake_te.regions
    assert name == "autocast"
    recipe = kwargs["recipe"]
    assert kwargs["amax_reduction_group"] == "group"
    assert kwargs["enabled"] is True
    assert recipe == _FakeDelayedScaling(1, _FakeFormat.E4M3, 8, "max", True)
    assert te_recipe(recipe) is recipe  # TE's own recipes pass through
    assert te_recipe() == _FakeDelayedScaling()


def test_policy_region_reuses_one_recipe(fake_te: FakeTE) -> None:
    policy = make_te_policy(_OurRecipe(amax_history_len=4))
    assert policy.extra_context is not None
    for _ in range(2):
        with policy.extra_context():
            pass
    recipes = [kwargs["recipe"] for _, kwargs in fake_te.regions]
    assert recipes[0] is recipes[1] and recipes[0].amax_history_len == 4


def test_policy_check_with_te_on_gpus(fake_te: FakeTE, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake GPU")
    for cc, ok in (((9, 0), True), ((8, 9), True), ((8, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, cc=cc: cc)
        if ok:
            check_te_fp8_device(torch.device("cuda"))
        else:
            with pytest.raises(RuntimeError, match="Fake GPU is sm_80"):
                check_te_fp8_device(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="got cpu") as info:
        check_te_fp8_device(torch.device("cpu"))
    assert "Transformer Engine is missing" not in str(info.value)


def te_scaling_state(module: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of a TE module's delayed-scaling state, read from ``module.fp8_meta``.

    Returns ``{"forward": {"amax_history": (L, 3), "scale": (3,)}, "backward": {... (L, 2),
    (2,)}}`` for a ``te.Linear`` (forward columns: ``TE_FWD_INDEX``); a direction is
    missing until the module has run under FP8 autocast. Row 0 of a history holds the amax being
    collected for the next update; older values sit in the rows below it, newest last.
    """
    meta = getattr(module, "fp8_meta", None)
    if not isinstance(meta, dict):
        raise TypeError(f"{type(module).__name__} has no TE fp8_meta; pass a TE module.")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, direction in (("scaling_fwd", "forward"), ("scaling_bwd", "backward")):
        state = meta.get(key)
        if state is not None and hasattr(state, "amax_history"):
            out[direction] = {
                "amax_history": state.amax_history.detach().clone(),
                "scale": state.scale.detach().clone(),
            }
    return out


def test_scaling_state_reads_fp8_meta() -> None:
    module = nn.Module()
    module.fp8_meta = {
        "scaling_fwd": types.SimpleNamespace(amax_history=torch.ones(4, 3), scale=torch.ones(3)),
        "recipe": None,
    }
    state = te_scaling_state(module)
    assert set(state) == {"forward"} and state["forward"]["amax_history"].shape == (4, 3)
    state["forward"]["scale"].fill_(2.0)  # a copy
    assert torch.all(module.fp8_meta["scaling_fwd"].scale == 1.0)
    with pytest.raises(TypeError, match="fp8_meta"):
        te_scaling_state(nn.Linear(2, 2))


# ---- TE's recipes by name (the stand-in's recipe classes) -------------------------------------
@pytest.mark.parametrize("cls_name", sorted(FAKE_RECIPES))
def test_stand_in_recipes_have_te_fields(cls_name: str) -> None:
    """The stand-in's fields are those test_te_contract.py finds in every cached TE."""
    fields = {f.name for f in dataclasses.fields(FAKE_RECIPES[cls_name])}
    assert fields == set(TE_RECIPE_FIELDS[cls_name])


def test_every_recipe_by_te_name_and_short_name(fake_te: FakeTE) -> None:
    assert set(TE_RECIPE_SHORT_NAMES.values()) == set(FAKE_RECIPES) == set(TE_RECIPE_FIELDS)
    for short, cls_name in TE_RECIPE_SHORT_NAMES.items():
        for name in (short, cls_name, cls_name.lower(), short.upper()):
            assert type(te_recipe(name)) is FAKE_RECIPES[cls_name], name
            assert te_recipe_kind(name) == te_recipe_short_name(name) == short
    assert te_recipe("delayed") == te_recipe() == _FakeDelayedScaling()


@pytest.mark.parametrize("name", ["fp9", "Float8Scaling", "", "rowwise"])
def test_unknown_recipe_names_list_the_valid_ones(name: str) -> None:
    for call in (te_recipe_short_name, te_recipe_options, make_te_policy, te_recipe_kind):
        with pytest.raises(ValueError, match=f"Unknown TE recipe {name!r}") as info:
            call(name)
        for valid in (*TE_RECIPE_SHORT_NAMES, *TE_RECIPE_SHORT_NAMES.values()):
            assert repr(valid) in str(info.value)


def test_recipe_options_reach_te(fake_te: FakeTE) -> None:
    current = te_recipe("Float8CurrentScaling", fp8_format="E4M3", fp8_dpa=True)
    assert current == _FakeFloat8CurrentScaling(fp8_format=_FakeFormat.E4M3, fp8_dpa=True)
    delayed = te_recipe("delayed", amax_history_len=16, fp8_format=_FakeFormat.E4M3)
    assert delayed == _FakeDelayedScaling(amax_history_len=16, fp8_format=_FakeFormat.E4M3)
    assert te_recipe(None, margin=2) == _FakeDelayedScaling(margin=2)
    block = te_recipe("block", w_block_scaling_dim=1, grad_block_scaling_dim=2)
    assert (block.w_block_scaling_dim, block.grad_block_scaling_dim) == (1, 2)
    assert te_recipe("mxfp8", margin=1) == _FakeMXFP8BlockScaling(margin=1)
    nvfp4 = te_recipe("nvfp4", disable_rht=True, fp4_format="e2m1")
    assert nvfp4 == _FakeNVFP4BlockScaling(disable_rht=True)


@pytest.mark.parametrize(
    ("name", "options", "error", "match"),
    [
        ("current", {"amax_history_len": 16}, TypeError, "no option 'amax_history_len'.*'use_pow"),
        ("block", {"backward_override": None}, TypeError, "no option 'backward_override'"),
        ("mxfp8", {"power_2": True}, TypeError, "MXFP8BlockScaling has no option 'power_2'"),
        ("delayed", {"fp8_format": "E9M9"}, ValueError, "fp8_format='E9M9'.*HYBRID"),
    ],
    ids=["other-recipe-field", "newer-te-field", "no-such-field", "bad-format"],
)
def test_recipe_options_are_checked_without_te(
    name: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    for call in (te_recipe_options, make_te_policy):
        with pytest.raises(error, match=match):
            call(name, **options)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("block", {"x_block_scaling_dim": 2}, "2D by 2D"),
        ("current", {"fp8_format": "E5M2"}, "Pure E5M2"),
        ("nvfp4", {"fp8_format": "HYBRID"}, "Only E4M3"),
    ],
)
def test_te_refusals_become_value_errors(
    fake_te: FakeTE, name: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=f"TE's .* refuses .*{match}"):
        te_recipe(name, **options)


@pytest.mark.parametrize(
    ("name", "flag", "default"),
    [("current", "use_power_2_scales", False), ("block", "use_f32_scales", True)],
)
def test_scale_flags_reach_the_quantizer_params(
    fake_te: FakeTE, name: str, flag: str, default: bool
) -> None:
    """TE's modules read fp8_quant_*.power_2_scale, fixed at TE's import; the flag is copied in."""
    cls = FAKE_RECIPES[TE_RECIPE_SHORT_NAMES[name]]
    untouched = te_recipe(name)
    assert all(getattr(untouched, q).power_2_scale is default for q in TE_RECIPE_QPARAMS)
    for value in (True, False):
        recipe = te_recipe(name, **{flag: value})
        power_2 = value if name == "current" else not value
        assert getattr(recipe, flag) is value
        assert all(getattr(recipe, q).power_2_scale is power_2 for q in TE_RECIPE_QPARAMS)
    assert all(getattr(cls, q).power_2_scale is default for q in TE_RECIPE_QPARAMS)


def test_te_recipe_objects_pass_through(fake_te: FakeTE) -> None:
    class _Custom(_FakeRecipe):  # e.g. TE's CustomRecipe: passed through, no known kind
        pass

    for short, cls in [(te_recipe_short_name(n), c) for n, c in FAKE_RECIPES.items()]:
        obj = cls()
        assert te_recipe(obj) is obj and te_recipe_kind(obj) == short
    custom = _Custom()
    assert te_recipe(custom) is custom and te_recipe_kind(custom) is None
    with pytest.raises(TypeError, match="go with a recipe name"):
        te_recipe(custom, margin=1)
    with pytest.raises(TypeError, match="go with a recipe name"):
        make_te_policy(_OurRecipe(), margin=1)
    policy = make_te_policy(custom)
    assert policy.check.keywords == {"policy_name": "te-fp8", "recipe": None}  # type: ignore[union-attr]
    assert "custom TE recipe" in policy.description


def test_our_other_recipes_point_to_te_names() -> None:
    class _OurCurrent:
        te_name = "Float8CurrentScaling"

    with pytest.raises(TypeError, match="recipe='Float8CurrentScaling'"):
        make_te_policy(_OurCurrent())


@pytest.mark.parametrize("fused", [False, True], ids=["te-fp8", "te-fp8-fused"])
def test_policy_by_recipe_name(fake_te: FakeTE, fused: bool) -> None:
    policy = make_te_policy("MXFP8BlockScaling", fused=fused, margin=1)
    check = policy.check
    assert isinstance(check, functools.partial) and check.func is check_te_fp8_device
    assert check.keywords == {"recipe": "mxfp8", "policy_name": policy.name}
    assert "MXFP8 GEMMs" in policy.description
    assert policy.extra_context is not None
    for _ in range(2):
        with policy.extra_context():
            pass
    recipes = [kwargs["recipe"] for _, kwargs in fake_te.regions]
    assert recipes[0] is recipes[1] and recipes[0] == _FakeMXFP8BlockScaling(margin=1)
    assert make_te_policy("delayed").check.keywords["recipe"] == "delayed"


# (recipe, compute capability, torch's CUDA, the error or None)
GPU_CASES = [
    ("delayed", (8, 9), "12.4", None),
    ("delayed", (8, 0), "12.4", "Fake GPU is sm_80; DelayedScaling needs sm_89+"),
    ("current", (9, 0), "12.4", None),
    ("block", (9, 0), "12.9", None),
    ("block", (9, 0), "12.8", "built with CUDA 12.8; Float8BlockScaling needs sm_90.*CUDA 12.9"),
    ("block", (8, 9), "13.0", "Fake GPU is sm_89; Float8BlockScaling needs sm_90"),
    ("mxfp8", (9, 0), "12.9", "Fake GPU is sm_90; MXFP8BlockScaling needs sm_100"),
    ("mxfp8", (10, 0), "12.9", None),
    ("mxfp8", (12, 0), "12.9", "Fake GPU is sm_120; MXFP8BlockScaling needs .*no MXFP8 on sm_120"),
    ("nvfp4", (9, 0), "12.9", "Fake GPU is sm_90; NVFP4BlockScaling needs sm_100"),
    ("nvfp4", (12, 0), "12.9", None),
]


@pytest.mark.parametrize(
    ("recipe", "cc", "cuda", "error"),
    GPU_CASES,
    ids=[f"{r}-sm_{cc[0]}{cc[1]}-cuda{cuda}" for r, cc, cuda, _ in GPU_CASES],
)
def test_device_check_per_recipe(
    fake_te: FakeTE,
    monkeypatch: pytest.MonkeyPatch,
    recipe: str,
    cc: tuple[int, int],
    cuda: str,
    error: str | None,
) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cc)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    policy = make_te_policy(recipe)
    if error is None:
        policy.validate("cuda")
    else:
        with pytest.raises(RuntimeError, match=f"'te-fp8'.*{error}"):
            policy.validate("cuda")
    need = TE_GPU_NEEDS[recipe]
    if error is None:  # then TE's verdict counts
        why = (False, "Device compute capability 10.0 or higher required.")
        monkeypatch.setattr(fake_te.pytorch, need.te_check, lambda return_reason=False: why)
        with pytest.raises(RuntimeError, match=f"TE reports no {need.label} support: Device"):
            policy.validate("cuda")


@pytest.mark.parametrize("recipe", list(TE_RECIPE_SHORT_NAMES))
def test_device_check_names_the_gpu_on_the_cpu(recipe: str) -> None:
    need = TE_GPU_NEEDS[recipe]
    with pytest.raises(RuntimeError, match="CUDA GPU") as info:
        make_te_policy(recipe, fused=True).validate("cpu")
    message = str(info.value)
    assert need.text in message and TE_RECIPE_SHORT_NAMES[recipe] in message
    assert "'te-fp8-fused'" in message and "got cpu" in message
    assert ("Transformer Engine is missing" in message) is not TE_OK


# ---- with Transformer Engine and an sm_89+ GPU -------------------------------------------------
# FP8 against BF16 over a short run of the small model: FP8_LOSS_TOLERANCE, measured for our fp8
# policy on the CPU (tutorial_lib/fp8/policy.py); to be confirmed on the first Hopper run.
GPU_STEPS, GPU_BATCH, GPU_HISTORY = 12, 8, 16


def _fp8_gpu_or_skip() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip(f"{torch.cuda.get_device_name(0)} has no FP8 tensor cores (sm_89+)")
    return torch.device("cuda", 0)


def _train(
    policy: PrecisionPolicy, model: nn.Module, data: TokenData, device: torch.device
) -> tuple[list[float], nn.Module, list[dict[str, float]]]:
    """Train a copy of ``model``; returns losses, the trained model and, per step, max|W| of each
    Linear weight as the forward pass saw it."""
    cfg = TrainConfig(
        steps=GPU_STEPS,
        batch_size=GPU_BATCH,
        lr=1e-3,
        warmup_steps=2,
        eval_every=0,
        precision=policy.name,
        progress=False,
        seed=0,
    )
    built = build_model(model.config, precision=policy, weights=model.state_dict(), device=device)
    trainer = Trainer(built, data, cfg, device=device)
    weights = {n: m.weight for n, m in trainer.model.named_modules() if n.endswith(("qkv", "fc"))}
    amaxes = []
    for _ in range(GPU_STEPS):
        amaxes.append({n: w.detach().abs().max().item() for n, w in weights.items()})
        trainer.train_step()
    return [row["loss"] for row in trainer.history], trainer.model, amaxes


def _our_scaling_state(module: nn.Module) -> dict[str, dict[str, torch.Tensor]] | None:
    """Our FP8 Linear's state (an object with ``forward``/``backward`` ScalingMeta), duck-typed."""
    for value in vars(module).values():
        fwd, bwd = getattr(value, "forward", None), getattr(value, "backward", None)
        if all(hasattr(m, "amax_history") and hasattr(m, "scale") for m in (fwd, bwd)):
            return {
                d: {"amax_history": m.amax_history.detach().clone(), "scale": m.scale.clone()}
                for d, m in (("forward", fwd), ("backward", bwd))
            }
    return None


@needs_te
def test_te_gpt_trains_and_keeps_extra_state() -> None:
    device = _fp8_gpu_or_skip()
    torch.manual_seed(0)
    model = convert_to_te(GPT(FP8_CFG).to(device))
    idx = torch.randint(0, 256, (GPU_BATCH, FP8_CFG.block_size), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16), te_autocast(recipe=None):
        _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].attn.qkv.weight.grad is not None
    # TE modules add `_extra_state` entries (their FP8 scaling state), so a plain-PyTorch
    # checkpoint does not load strictly (TE issue #199), and those entries are all that is missing.
    plain = GPT(FP8_CFG).state_dict()
    with pytest.raises(RuntimeError, match="_extra_state"):
        model.load_state_dict(plain)
    extra = [k for k in model.state_dict() if k.endswith("_extra_state")]
    assert extra and set(model.state_dict()) - set(extra) == set(plain)
    result = model.load_state_dict(plain, strict=False)  # torch does not list missing extra state
    assert not result.missing_keys and not result.unexpected_keys


@needs_te
def test_te_fp8_matches_bf16_and_ours(
    data_factory: Callable[..., TokenData], registry: dict[str, PrecisionPolicy]
) -> None:
    device = _fp8_gpu_or_skip()
    torch.manual_seed(0)
    model = GPT(FP8_CFG)  # one set of initial weights for every run

    def data() -> TokenData:  # the same batches for every run
        return data_factory(seed=0, block_size=FP8_CFG.block_size)

    registry[TE_POLICY_NAME] = te_policy = make_te_policy(_OurRecipe(amax_history_len=GPU_HISTORY))
    bf16_losses, _, _ = _train(get_policy("bf16"), model, data(), device)
    te_losses, te_model, seen = _train(te_policy, model, data(), device)
    assert max(abs(a - b) for a, b in zip(te_losses, bf16_losses, strict=True)) < FP8_LOSS_TOLERANCE
    for name in seen[0]:
        _check_te_scaling_state(te_scaling_state(te_model.get_submodule(name)), name, seen)

    ours = get_policy("fp8")
    our_losses, our_model, _ = _train(ours, model, data(), device)
    assert max(abs(a - b) for a, b in zip(te_losses, our_losses, strict=True)) < FP8_LOSS_TOLERANCE
    w = TE_FWD_INDEX["weight"]
    for name in seen[0]:
        our_state = _our_scaling_state(our_model.get_submodule(name))
        if our_state is None:
            pytest.skip(f"cannot find the scaling state of our FP8 layer {name}")
        te_fwd = te_scaling_state(te_model.get_submodule(name))["forward"]
        # The recipes' history lengths may differ: compare the rows both runs filled.
        torch.testing.assert_close(
            our_state["forward"]["amax_history"][-GPU_STEPS:, w].cpu(),
            te_fwd["amax_history"][-GPU_STEPS:, w].cpu(),
            rtol=5e-2,
            atol=0,
        )
        torch.testing.assert_close(
            our_state["forward"]["scale"][w].cpu(), te_fwd["scale"][w].cpu(), rtol=5e-2, atol=0
        )


@needs_te
def test_te_fp8_fused_matches_unfused(
    data_factory: Callable[..., TokenData], registry: dict[str, PrecisionPolicy]
) -> None:
    """``te-fp8-fused`` trains like ``te-fp8`` and BF16, and its fused QKV (a LayerNormLinear:
    one GEMM) keeps the same delayed-scaling state as a ``te.Linear``."""
    device = _fp8_gpu_or_skip()
    torch.manual_seed(0)
    model = GPT(FP8_CFG)

    def data() -> TokenData:
        return data_factory(seed=0, block_size=FP8_CFG.block_size)

    for fused in (False, True):
        policy = make_te_policy(_OurRecipe(amax_history_len=GPU_HISTORY), fused=fused)
        registry[policy.name] = policy
    bf16_losses, _, _ = _train(get_policy("bf16"), model, data(), device)
    te_losses, _, _ = _train(registry[TE_POLICY_NAME], model, data(), device)
    fused_losses, fused_model, seen = _train(registry[TE_FUSED_POLICY_NAME], model, data(), device)
    for other in (bf16_losses, te_losses):
        assert (
            max(abs(a - b) for a, b in zip(fused_losses, other, strict=True)) < FP8_LOSS_TOLERANCE
        )
    assert set(seen[0]) == {f"blocks.{i}.attn.qkv" for i in range(FP8_CFG.n_layer)}
    for name in seen[0]:
        _check_te_scaling_state(te_scaling_state(fused_model.get_submodule(name)), name, seen)


def _check_te_scaling_state(
    state: dict[str, dict[str, torch.Tensor]], name: str, seen: list[dict[str, float]]
) -> None:
    """TE's delayed-scaling state after GPU_STEPS (< GPU_HISTORY - 1) steps, as REFERENCE.md
    describes the update: after each update row 0 is cleared and the newest amax ends the
    window, so the last GPU_STEPS rows hold each step's amax, oldest first."""
    fwd, bwd = state["forward"], state["backward"]
    assert fwd["amax_history"].shape == (GPU_HISTORY, 3), name
    assert bwd["amax_history"].shape == (GPU_HISTORY, 2), name
    weight_rows = fwd["amax_history"][-GPU_STEPS:, TE_FWD_INDEX["weight"]].cpu()
    expected = torch.tensor([step[name] for step in seen])
    torch.testing.assert_close(weight_rows, expected, rtol=1e-2, atol=0)  # FP32 or BF16 max|W|
    for group, fp8_max in ((fwd, 448.0), (bwd, 57344.0)):  # HYBRID: E4M3 forward, E5M2 backward
        history, scale = group["amax_history"].cpu(), group["scale"].cpu()
        assert torch.all(history[0] == 0), name
        amax = history.amax(dim=0)
        # scale = fp8_max * 2^-margin / amax; a tensor never quantized (amax 0) keeps scale 1.
        expected_scale = torch.where(amax > 0, fp8_max / amax, torch.ones_like(amax))
        torch.testing.assert_close(scale, expected_scale, rtol=1e-6, atol=0)
