"""Transformer Engine (TE) modules in a GPT: the ``TELayers`` factory and ``convert_to_te``.

    - ``TELayers``: a ``LayerFactory`` (see ``layers.py``) that returns ``te.Linear`` and
      ``te.LayerNorm``, so ``GPT(cfg, layers=TELayers())`` is built from TE modules;
    - ``convert_to_te``: swaps the ``nn.Linear``/``nn.LayerNorm`` layers of an existing model
      for TE modules with the same weights (the tied embedding/LM head stays as it is); with
      ``fused=True`` it also merges each block's LayerNorms into the layers they feed
      (``te.LayerNormLinear``, ``te.LayerNormMLP``, see ``fuse_blocks``).

Importing this module never imports TE (``te_contract.import_te`` does, when a function needs
it); every TE call here is declared in ``te_contract.TE_API_USED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

import torch
from torch import nn

from ..layers import LINEAR_ROLES, TorchLayers
from ..model import Block
from .convert import convertible_linears, fp8_layer_problems
from .te_contract import import_te

__all__ = ["TELayers", "TEFusedMLP", "fp8_shape_problems", "convert_to_te"]

_M = TypeVar("_M", bound=nn.Module)


# ---- layers ------------------------------------------------------------------------------------
def _gpt2_normal_init(weight: torch.Tensor) -> None:
    """GPT-2's Linear init, N(0, 0.02); TE's own default is N(0, 0.023)."""
    nn.init.normal_(weight, mean=0.0, std=0.02)


# What a TE module's parameter gets: a tensor is copied (and keeps its requires_grad); a number
# fills a parameter TE cannot drop and keeps it out of training (a LayerNorm's missing bias is 0,
# a missing gain 1); None leaves a parameter the source does not have (a Linear without bias).
_Sources = dict[str, torch.Tensor | float | None]


def _copy_into(new: nn.Module, sources: _Sources) -> nn.Module:
    """The one place weights enter a TE module: ``new.<name>`` from ``sources[name]``."""
    with torch.no_grad():
        for name, source in sources.items():
            param = getattr(new, name)
            if isinstance(source, torch.Tensor):
                param.copy_(source)
                param.requires_grad_(source.requires_grad)
            elif source is not None:
                param.fill_(source)
                param.requires_grad_(False)
    return new


def _norm_sources(norm: nn.LayerNorm, prefix: str = "") -> _Sources:
    return {
        f"{prefix}weight": 1.0 if norm.weight is None else norm.weight,
        f"{prefix}bias": 0.0 if norm.bias is None else norm.bias,
    }


def _linear_sources(linear: nn.Linear, prefix: str = "") -> _Sources:
    return {f"{prefix}weight": linear.weight, f"{prefix}bias": linear.bias}


@dataclass
class TELayers(TorchLayers):
    """A ``LayerFactory`` returning ``te.Linear`` and ``te.LayerNorm``.

    ``GPT.__init__`` only re-initialises ``nn.Linear``, so the Linear layers get GPT-2's
    N(0, 0.02) here (through TE's ``init_method``); the ``proj`` rescaling still applies by
    name. TE's LayerNorm cannot drop its bias: with ``bias=False`` it is pinned to zero and
    frozen. A factory builds one layer at a time, so it cannot return TE's fused
    ``LayerNormLinear``/``LayerNormMLP`` (a LayerNorm merged into the layer it feeds): build the
    GPT, then ``convert_to_te(model, fused=True)``, as the ``te-fp8-fused`` policy does.

    Placement:
        device: where parameters are allocated; None means the current CUDA device.
        params_dtype: parameter (master weight) dtype; None means torch's default (FP32).
    """

    device: torch.device | str | None = None
    params_dtype: torch.dtype | None = None

    def _device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda", torch.cuda.current_device())

    def _dtype(self) -> torch.dtype:
        return self.params_dtype or torch.get_default_dtype()

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        if role not in LINEAR_ROLES:
            raise ValueError(f"Unknown linear role {role!r}; expected one of {LINEAR_ROLES}.")
        te = import_te()
        return te.Linear(
            in_features=in_features,
            out_features=out_features,
            bias=bias,
            params_dtype=self._dtype(),
            device=self._device(),
            init_method=_gpt2_normal_init,
        )

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        te = import_te()
        norm = te.LayerNorm(
            normalized_shape=features, eps=1e-5, dtype=self._dtype(), device=self._device()
        )
        return norm if bias else _copy_into(norm, {"bias": 0.0})


# ---- converting a built model ------------------------------------------------------------------
def fp8_shape_problems(model: nn.Module) -> list[str]:
    """Linear layers ``convert_to_te`` would swap whose shapes TE's FP8 GEMMs refuse
    (``assert_dim_for_fp8_exec`` on the weight: in_features divisible by 16, out_features by 8;
    the token count, divisible by 8, only the input shows). The same rule and wording as our own
    ``fp8_layer_problems`` (``FP8_SHAPE_RULE``)."""
    return fp8_layer_problems(model)


def _te_linear_like(te: ModuleType, old: nn.Linear, device: torch.device) -> nn.Module:
    new = te.Linear(
        in_features=old.in_features,
        out_features=old.out_features,
        bias=old.bias is not None,
        params_dtype=old.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
    )
    return _copy_into(new, _linear_sources(old))


def _te_layernorm_like(te: ModuleType, old: nn.LayerNorm, device: torch.device) -> nn.Module:
    dtype = old.weight.dtype if old.weight is not None else torch.get_default_dtype()
    new = te.LayerNorm(
        normalized_shape=tuple(old.normalized_shape), eps=old.eps, dtype=dtype, device=device
    )
    return _copy_into(new, _norm_sources(old))


def convert_to_te(
    model: nn.Module, device: torch.device | str | None = None, fused: bool = False
) -> nn.Module:
    """Swap ``nn.Linear`` -> ``te.Linear`` and ``nn.LayerNorm`` -> ``te.LayerNorm`` in place.

    Weights, biases and eps are copied. Subclasses of those types and Linear layers whose weight
    is shared (a tied LM head) are left alone. TE modules are allocated on ``device`` (default:
    the old layer's device if it is a GPU, else the current CUDA device). Returns ``model``.

    ``fused=True`` first merges, in every GPT ``Block``, each LayerNorm into what it feeds:
        ``ln1`` + ``attn.qkv`` -> ``te.LayerNormLinear`` as ``attn.qkv``, ``ln1`` -> Identity;
        ``ln2`` + ``mlp`` -> ``TEFusedMLP`` (``te.LayerNormMLP`` + the MLP's dropout) as ``mlp``,
        ``ln2`` -> Identity.
    The rest (``attn.proj``, ``ln_f``) is swapped as above. The function is the same: TE's
    ``"gelu"`` is GPT-2's tanh approximation (see ``_te_layernorm_mlp_like``). What fusion buys:
    the normalised activation goes from the LayerNorm kernel straight into the GEMM (under FP8,
    TE's LayerNorm can write it in FP8 directly), and TE's GELU kernel can write FC2's FP8 input
    directly; under delayed scaling the backward pass can fuse GELU's derivative with FC1's bias
    gradient (``module/layernorm_linear.py``, ``module/layernorm_mlp.py`` in TE 2.9 and 2.20).
    The state dict changes names (``attn.qkv.layer_norm_weight``, ``mlp.layernorm_mlp.fc1_weight``
    ...), so checkpoints of the fused and unfused models do not load into each other.

    We stop there. ``te.TransformerLayer`` would fuse the whole block, attention included (TE's
    ``DotProductAttention``: flash or cuDNN kernels, and the residual adds and dropouts inside),
    but it replaces our attention with TE's, defaults to sequence-first inputs
    (``attn_input_format="sbhd"``) and interleaves Q, K and V per head in a fused QKV weight
    (``qkv_weight_interleaved=True``). Keeping our ``CausalSelfAttention`` keeps one attention
    implementation in the book and a state we can compare layer by layer with the other policies.
    """
    te = import_te()
    problems = fp8_shape_problems(model)
    if problems:
        raise ValueError(
            "TE's FP8 GEMMs need a Linear's in_features divisible by 16 and its out_features "
            "divisible by 8 (TE's assert_dim_for_fp8_exec); these layers are not: "
            + "; ".join(problems)
            + ". Pick n_embd as a multiple of 16 (e.g. GPTConfig.from_name('tiny'))."
        )
    if fused:
        fuse_blocks(te, model, device)
    linears = {id(m): m for _, m in convertible_linears(model)}
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            linear = linears.get(id(child))
            if linear is not None:
                new = _te_linear_like(te, linear, _target_device(linear.weight, device))
            elif type(child) is nn.LayerNorm:
                new = _te_layernorm_like(te, child, _target_device(child.weight, device))
            else:
                continue
            _install(parent, child_name, new)
    return model


def _install(parent: nn.Module, name: str, new: nn.Module) -> None:
    new.train(getattr(parent, name).training)
    setattr(parent, name, new)


# ---- fused blocks: TE's LayerNormLinear and LayerNormMLP -----------------------------------
class TEFusedMLP(nn.Module):
    """``te.LayerNormMLP`` (LayerNorm, FC1, GELU, FC2 in one module) and then the MLP's dropout,
    which TE's module does not have. ``convert_to_te(fused=True)`` installs it as ``Block.mlp``."""

    def __init__(self, layernorm_mlp: nn.Module, dropout: float) -> None:
        super().__init__()
        self.layernorm_mlp = layernorm_mlp
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.layernorm_mlp(x))  # (B, T, C): the residual stream, not normalised


_FUSED_PARTS = {
    "ln1": nn.LayerNorm,
    "attn.qkv": nn.Linear,
    "ln2": nn.LayerNorm,
    "mlp.fc": nn.Linear,
    "mlp.proj": nn.Linear,
}


def _fusion_problems(name: str, block: nn.Module) -> list[str]:
    """Why ``block`` is not the plain-PyTorch ``Block`` that fusion expects (empty: it is)."""
    problems = []
    for part, kind in _FUSED_PARTS.items():
        module = _submodule_or_none(block, part)
        if type(module) is not kind:
            found = "missing" if module is None else type(module).__name__
            problems.append(f"{name}.{part} is {found}, not {kind.__name__}")
    if not problems:
        fc, proj = _part(block, "mlp.fc", nn.Linear), _part(block, "mlp.proj", nn.Linear)
        if (fc.bias is None) != (proj.bias is None):
            problems.append(f"{name}.mlp: fc and proj must both have a bias or neither")
    return problems


def _submodule_or_none(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _part(module: nn.Module, path: str, kind: type[_M]) -> _M:
    """The submodule at ``path``, which must be a ``kind`` (``_fusion_problems`` checked it)."""
    part = module.get_submodule(path)
    if not isinstance(part, kind):
        raise TypeError(f"{path} is {type(part).__name__}, not {kind.__name__}")
    return part


def fuse_blocks(te: ModuleType, model: nn.Module, device: torch.device | str | None) -> None:
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, Block)]
    problems = [p for name, block in blocks for p in _fusion_problems(name, block)]
    if not blocks or problems:
        raise ValueError(
            "convert_to_te(fused=True) fuses the LayerNorms of plain-PyTorch GPT blocks "
            "(nn.LayerNorm, nn.Linear) into TE's LayerNormLinear/LayerNormMLP; "
            + ("; ".join(problems) if problems else "this model has no Block")
            + ". Convert a GPT built with the default TorchLayers, or use fused=False."
        )
    for _, block in blocks:
        qkv = _part(block, "attn.qkv", nn.Linear)
        target = _target_device(qkv.weight, device)
        ln1 = _part(block, "ln1", nn.LayerNorm)
        _install(block.attn, "qkv", _te_layernorm_linear_like(te, ln1, qkv, target))
        ln2 = _part(block, "ln2", nn.LayerNorm)
        _install(block, "mlp", _te_layernorm_mlp_like(te, ln2, block.mlp, target))
        block.ln1, block.ln2 = nn.Identity(), nn.Identity()


def _te_layernorm_linear_like(
    te: ModuleType, norm: nn.LayerNorm, linear: nn.Linear, device: torch.device
) -> nn.Module:
    new = te.LayerNormLinear(
        in_features=linear.in_features,
        out_features=linear.out_features,
        eps=norm.eps,
        bias=linear.bias is not None,
        normalization="LayerNorm",
        params_dtype=linear.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
    )
    return _copy_into(new, {**_norm_sources(norm, "layer_norm_"), **_linear_sources(linear)})


def _te_layernorm_mlp_like(
    te: ModuleType, norm: nn.LayerNorm, mlp: nn.Module, device: torch.device
) -> nn.Module:
    fc, proj = _part(mlp, "fc", nn.Linear), _part(mlp, "proj", nn.Linear)
    # TE's "gelu" is the tanh approximation, GPT-2's: transformer_engine/common/util/math.h
    # computes x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 * x^2))), i.e. sqrt(2/pi) and
    # sqrt(2/pi) * 0.044715; the Python side agrees (ops/basic/activation.py's GELU docstring,
    # jit.py's bias_gelu_fused_, LayerNormMLP's ONNX path: F.gelu(approximate="tanh")).
    # "qgelu" is a different function, x * sigmoid(1.702 x).
    new = te.LayerNormMLP(
        hidden_size=fc.in_features,
        ffn_hidden_size=fc.out_features,
        eps=norm.eps,
        bias=fc.bias is not None,
        normalization="LayerNorm",
        activation="gelu",
        params_dtype=fc.weight.dtype,
        device=device,
        init_method=_gpt2_normal_init,
        output_layer_init_method=_gpt2_normal_init,
    )
    sources = {
        **_norm_sources(norm, "layer_norm_"),
        **_linear_sources(fc, "fc1_"),
        **_linear_sources(proj, "fc2_"),
    }
    dropout = getattr(_submodule_or_none(mlp, "drop"), "p", 0.0)
    return TEFusedMLP(_copy_into(new, sources), dropout)


def _target_device(ref: torch.Tensor | None, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if ref is not None and ref.device.type == "cuda":
        return ref.device
    return torch.device("cuda", torch.cuda.current_device())
