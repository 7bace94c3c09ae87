"""Transformer Engine (TE) modules in a GPT: ``convert_to_te``.

``convert_to_te`` swaps the ``nn.Linear``/``nn.LayerNorm`` layers of a built model for TE
modules with the same weights (the tied embedding/LM head stays as it is); with ``fused=True`` it
also merges each block's LayerNorms into the layers they feed (``te.LayerNormLinear``,
``te.LayerNormMLP``, see ``fuse_blocks``). The ``te-fp8`` policies build the plain GPT and then
convert it.

Importing this module never imports TE (``te_contract.import_te`` does, when a function needs
it); every TE call here is declared in ``TE_API_USED`` (``tests/te_contract_tables.py``).
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

import torch
from torch import nn

from ..model import Block
from .convert import convertible_linears, fp8_layer_problems
from .te_contract import import_te

__all__ = ["TEFusedMLP", "convert_to_te"]

_M = TypeVar("_M", bound=nn.Module)


# ---- weights into TE modules ---------------------------------------------------------------------
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


# ---- converting a built model ------------------------------------------------------------------
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
    # TE's FP8 GEMMs check the weight (assert_dim_for_fp8_exec: in_features % 16,
    # out_features % 8) as ours do (FP8_SHAPE_RULE); the token count only the input shows
    problems = fp8_layer_problems(model)
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


def _submodule_or_none(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _part(module: nn.Module, path: str, kind: type[_M]) -> _M:
    """The submodule at ``path``, which must be a ``kind`` (``fuse_blocks`` checked it)."""
    part = module.get_submodule(path)
    if not isinstance(part, kind):
        raise TypeError(f"{path} is {type(part).__name__}, not {kind.__name__}")
    return part


def fuse_blocks(te: ModuleType, model: nn.Module, device: torch.device | str | None) -> None:
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, Block)]
    problems: list[str] = []
    for name, block in blocks:  # each must be the plain-PyTorch Block that fusion expects
        wrong = [
            f"{name}.{part} is {'missing' if m is None else type(m).__name__}, not {kind.__name__}"
            for part, kind in _FUSED_PARTS.items()
            if type(m := _submodule_or_none(block, part)) is not kind
        ]
        if not wrong:
            fc, proj = _part(block, "mlp.fc", nn.Linear), _part(block, "mlp.proj", nn.Linear)
            if (fc.bias is None) != (proj.bias is None):
                wrong.append(f"{name}.mlp: fc and proj must both have a bias or neither")
        problems += wrong
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
