"""Tests for tutorial_lib.model (the GPT) and tutorial_lib.layers (the LayerFactory hook)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping

import pytest
import torch
from torch import nn

from tutorial_lib.config import GPTConfig
from tutorial_lib.layers import LINEAR_ROLES, TorchLayers
from tutorial_lib.model import GPT

# An odd configuration: nothing is a power of two, so shape mix-ups cannot hide.
ODD = GPTConfig(vocab_size=97, block_size=37, n_layer=3, n_head=5, n_embd=40)

# Per-dtype tolerances (atol, rtol).
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}


def _model(cfg: GPTConfig = ODD, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).to(dtype).eval()


def _tokens(b: int, t: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---- anatomy -------------------------------------------------------------------------------


def test_gpt2_124m_parameter_count() -> None:
    cfg = GPTConfig.from_name("gpt2-124m")
    with torch.device("meta"):  # no memory is allocated
        model = GPT(cfg)
    assert next(model.parameters()).is_meta
    assert model.num_params() == 124_439_808  # GPT-2 small, tied LM head
    wte, wpe = cfg.vocab_size * cfg.n_embd, cfg.block_size * cfg.n_embd
    assert model.num_params() - wte - wpe == 85_056_000  # without the embedding tables


def test_lm_head_is_tied_and_counted_once() -> None:
    model = GPT(ODD)
    n_unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert model.num_params() == n_unique
    assert not any("lm_head" in name for name, _ in model.named_parameters())
    # Changing the embedding changes the logits' projection: the head *is* the embedding.
    idx = _tokens(2, 5, ODD.vocab_size)
    model.eval()
    logits, _ = model(idx)
    with torch.no_grad():
        model.tok_emb.weight[7].zero_()
        assert torch.all(model(idx)[0][..., 7] == 0) and not torch.all(logits[..., 7] == 0)


def test_num_params_odd_config_by_hand() -> None:
    c, v, t, layers = ODD.n_embd, ODD.vocab_size, ODD.block_size, ODD.n_layer
    per_block = (
        2 * 2 * c  # two LayerNorms (weight + bias)
        + (c * 3 * c + 3 * c)  # qkv
        + (c * c + c)  # attention projection
        + (c * 4 * c + 4 * c)  # MLP up
        + (4 * c * c + c)  # MLP down
    )
    expected = v * c + t * c + layers * per_block + 2 * c
    assert GPT(ODD).num_params() == expected


def test_num_params_without_bias() -> None:
    with_bias = GPT(ODD).num_params()
    without = GPT(dataclasses.replace(ODD, bias=False)).num_params()
    c, layers = ODD.n_embd, ODD.n_layer
    biases = layers * (2 * c + 3 * c + c + 4 * c + c) + c  # LN biases, Linear biases, ln_f bias
    assert with_bias - without == biases


def _matmul_weights(model: GPT) -> int:
    """Weights that take part in a matmul, counted from the modules: Linear layers + LM head."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return linear + model.tok_emb.weight.numel()  # the tied LM head is a (V, C) matmul


@pytest.mark.parametrize("seq_len", [None, 1, 20, 37])
def test_flops_per_token(seq_len: int | None) -> None:
    model = GPT(ODD)
    n = _matmul_weights(model)
    assert n == 12 * ODD.n_layer * ODD.n_embd**2 + ODD.vocab_size * ODD.n_embd
    t = seq_len or ODD.block_size
    train = 6 * n + 12 * ODD.n_layer * t * ODD.n_embd
    forward = 2 * n + 4 * ODD.n_layer * t * ODD.n_embd
    assert model.flops_per_token(seq_len=seq_len) == train
    assert model.flops_per_token(training=True, seq_len=seq_len) == train
    assert model.flops_per_token(training=False, seq_len=seq_len) == forward
    assert isinstance(model.flops_per_token(), float)


def test_flops_per_token_gpt2_124m_is_about_6n() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig.from_name("gpt2-124m"))
    flops = model.flops_per_token()
    # 6 x (12 L C^2 Linear weights + V C LM head) + attention (12 L T C); biases, LayerNorms and
    # the position table do no matmuls.
    assert flops == 6 * (12 * 12 * 768**2 + 50257 * 768) + 12 * 12 * 1024 * 768
    assert 0.8e9 < flops < 0.9e9


# ---- forward -------------------------------------------------------------------------------


@pytest.mark.parametrize(("b", "t"), [(3, 37), (1, 1), (5, 13)])
def test_forward_shapes(b: int, t: int) -> None:
    model = _model()
    idx = _tokens(b, t, ODD.vocab_size)
    logits, loss = model(idx)
    assert logits.shape == (b, t, ODD.vocab_size)
    assert logits.dtype == torch.float32
    assert loss is None
    logits2, loss2 = model(idx, _tokens(b, t, ODD.vocab_size, seed=1))
    assert loss2 is not None and loss2.shape == () and torch.isfinite(loss2)
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(logits2, logits, atol=atol, rtol=rtol)


def test_loss_matches_cross_entropy() -> None:
    model = _model()
    idx, tgt = _tokens(3, 37, 97), _tokens(3, 37, 97, seed=1)
    logits, loss = model(idx, tgt)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), tgt.reshape(-1))
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)


def test_batch_rows_are_independent() -> None:
    model = _model(dtype=torch.float64)
    idx = _tokens(3, 37, 97)
    full = model(idx)[0]
    for row in range(3):
        atol, rtol = TOL[torch.float64]
        torch.testing.assert_close(model(idx[row : row + 1])[0][0], full[row], atol=atol, rtol=rtol)


@pytest.mark.parametrize("t", [0, 1, 17, 35, 36])
def test_causal_masking(t: int) -> None:
    model = _model(dtype=torch.float64)
    idx = _tokens(3, 37, 97)
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1 + torch.arange(3)) % 97
    before, after = model(idx)[0], model(changed)[0]
    # The past never sees the future: positions < t are bit-for-bit unchanged.
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=0.0, rtol=0.0)
    # Every position >= t does see the change.
    diff = (after - before).abs().amax(dim=-1)  # (B, T)
    assert torch.all(diff[:, t:] > 1e-9), diff[:, t:].min()


def test_prefix_logits_match_full_sequence() -> None:
    # A consequence of causality: the logits of a prefix equal the first logits of the whole.
    model = _model(dtype=torch.float64)
    idx = _tokens(2, 37, 97)
    full = model(idx)[0]
    for t in (1, 10, 36):
        atol, rtol = TOL[torch.float64]
        torch.testing.assert_close(model(idx[:, :t])[0], full[:, :t], atol=atol, rtol=rtol)


def test_loss_at_init_is_log_vocab() -> None:
    cfg = GPTConfig.from_name("tiny")
    model = _model(cfg)
    idx, tgt = _tokens(4, cfg.block_size, 256), _tokens(4, cfg.block_size, 256, seed=1)
    with torch.no_grad():
        _, loss = model(idx, tgt)
    assert abs(loss.item() - math.log(256)) < 0.1, loss.item()


def test_sequence_longer_than_block_size_raises() -> None:
    model = _model()
    model(_tokens(2, ODD.block_size, 97))  # exactly block_size is fine
    with pytest.raises(ValueError, match=r"38 exceeds block_size=37"):
        model(_tokens(2, ODD.block_size + 1, 97))


def test_dropout_is_active_only_in_training() -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(ODD, dropout=0.2))
    idx = _tokens(2, 11, 97)
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


def test_model_without_bias_runs() -> None:
    model = _model(dataclasses.replace(ODD, bias=False))
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    logits, loss = model(_tokens(3, 7, 97), _tokens(3, 7, 97, seed=1))
    assert logits.shape == (3, 7, 97) and torch.isfinite(loss)


def test_backward_gives_every_parameter_a_finite_gradient() -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(ODD, dropout=0.1)).train()
    _, loss = model(_tokens(3, 37, 97), _tokens(3, 37, 97, seed=1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.shape == p.shape, name
        assert torch.isfinite(p.grad).all(), name
    assert model.tok_emb.weight.grad.abs().sum() > 0


def test_residual_projection_init_is_scaled() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=97, block_size=37, n_layer=8, n_head=4, n_embd=128)
    model = GPT(cfg)
    scaled = 0.02 / math.sqrt(2 * cfg.n_layer)
    for block in model.blocks:
        for layer in (block.attn.proj, block.mlp.proj):
            assert layer.weight.std().item() == pytest.approx(scaled, rel=0.15)
            assert torch.all(layer.bias == 0)
        assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


# ---- generate ------------------------------------------------------------------------------


def test_generate_length_and_range() -> None:
    model = _model()
    prompt = _tokens(3, 5, 97)
    out = model.generate(prompt, max_new_tokens=11, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 16)
    assert out.dtype == torch.long
    assert torch.equal(out[:, :5], prompt)
    assert int(out.min()) >= 0 and int(out.max()) < 97


def test_generate_zero_new_tokens_returns_prompt() -> None:
    prompt = _tokens(2, 4, 97)
    assert torch.equal(_model().generate(prompt, max_new_tokens=0), prompt)


def test_generate_prompt_longer_than_block_size_is_cropped() -> None:
    model = _model()
    prompt = _tokens(2, ODD.block_size + 9, 97)
    out = model.generate(prompt, max_new_tokens=4, top_k=1)
    assert out.shape == (2, ODD.block_size + 13)
    # The first new token depends on the last block_size tokens only.
    cropped = model.generate(prompt[:, -ODD.block_size :], max_new_tokens=1, top_k=1)
    assert torch.equal(out[:, ODD.block_size + 9], cropped[:, -1])


def test_generate_is_deterministic_with_a_seeded_generator() -> None:
    model = _model()
    prompt = _tokens(3, 5, 97)

    def sample(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return model.generate(prompt, max_new_tokens=20, temperature=1.5, generator=gen)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_generate_top_k_1_is_greedy() -> None:
    model = _model()
    prompt = _tokens(3, 5, 97)
    out = model.generate(prompt, max_new_tokens=12, top_k=1, temperature=0.7)
    idx = prompt
    with torch.no_grad():
        for _ in range(12):
            logits = model(idx[:, -ODD.block_size :])[0][:, -1, :]
            idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(out, idx)


def test_generate_top_k_restricts_the_support() -> None:
    model = _model()
    prompt = _tokens(1, 5, 97)
    with torch.no_grad():
        top3 = set(torch.topk(model(prompt)[0][0, -1], 3).indices.tolist())
    gen = torch.Generator().manual_seed(0)
    firsts = {
        int(model.generate(prompt, 1, temperature=5.0, top_k=3, generator=gen)[0, -1])
        for _ in range(40)
    }
    assert firsts <= top3


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_generate_rejects_non_positive_temperature(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        _model().generate(_tokens(1, 3, 97), max_new_tokens=2, temperature=temperature)


@pytest.mark.parametrize("training", [True, False])
def test_generate_restores_training_mode(training: bool) -> None:
    model = _model()
    model.train(training)
    model.generate(_tokens(2, 3, 97), max_new_tokens=3)
    assert model.training is training
    assert all(m.training is training for m in model.modules())


def test_generate_uses_eval_mode() -> None:
    # With dropout on, generate must still be deterministic (it switches to eval internally).
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(ODD, dropout=0.5)).train()
    prompt = _tokens(2, 3, 97)
    a = model.generate(prompt, max_new_tokens=8, top_k=1)
    b = model.generate(prompt, max_new_tokens=8, top_k=1)
    assert torch.equal(a, b)


# ---- Hugging Face parity -------------------------------------------------------------------


def from_hf_state_dict(state_dict: Mapping[str, torch.Tensor], config: GPTConfig) -> GPT:
    """A GPT from a ``transformers`` GPT-2 state dict (``GPT2LMHeadModel``/``GPT2Model``).

    GPT-2 stores its Linear layers as ``Conv1D`` with weights of shape (in, out); ours are
    ``nn.Linear`` with (out, in), so those weights are transposed.
    """
    model = GPT(config)
    model.load_state_dict(hf_to_tutorial_state_dict(state_dict, config))
    return model


_CONV1D = {
    "attn.c_attn": "attn.qkv",
    "attn.c_proj": "attn.proj",
    "mlp.c_fc": "mlp.fc",
    "mlp.c_proj": "mlp.proj",
}
_NORMS = {"ln_1": "ln1", "ln_2": "ln2"}


def hf_to_tutorial_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> dict[str, torch.Tensor]:
    """Rename (and transpose Conv1D weights of) a Hugging Face GPT-2 state dict for ``GPT``."""
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    sd = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    wte = sd.get("wte.weight")
    if wte is None:
        raise KeyError("Not a GPT-2 state dict: no 'transformer.wte.weight' (or 'wte.weight').")
    expected = (config.vocab_size, config.n_embd)
    if tuple(wte.shape) != expected:
        raise ValueError(
            f"wte.weight has shape {tuple(wte.shape)} but the config expects {expected}; pass a "
            "GPTConfig with the checkpoint's vocab_size and n_embd."
        )
    out: dict[str, torch.Tensor] = {
        "tok_emb.weight": wte,
        "pos_emb.weight": sd["wpe.weight"][: config.block_size],
        "ln_f.weight": sd["ln_f.weight"],
    }
    if config.bias:
        out["ln_f.bias"] = sd["ln_f.bias"]
    for i in range(config.n_layer):
        for hf, ours in _NORMS.items():
            for p in ("weight", "bias") if config.bias else ("weight",):
                out[f"blocks.{i}.{ours}.{p}"] = sd[f"h.{i}.{hf}.{p}"]
        for hf, ours in _CONV1D.items():
            out[f"blocks.{i}.{ours}.weight"] = sd[f"h.{i}.{hf}.weight"].t().contiguous()
            if config.bias:
                out[f"blocks.{i}.{ours}.bias"] = sd[f"h.{i}.{hf}.bias"]
    lm_head = sd.get("lm_head.weight")
    if lm_head is not None and not torch.equal(lm_head, wte):
        raise ValueError("lm_head.weight differs from wte.weight; this GPT ties the two.")
    return out


HF_KW = dict(vocab_size=97, n_positions=41, n_embd=60, n_layer=3, n_head=5)


def _hf_model() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(
        **HF_KW,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    # HF initialises biases to 0 and LayerNorms to (1, 0); randomise everything so that a
    # mis-mapped bias, LayerNorm or transpose cannot go unnoticed.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return hf


def _ours_cfg(block_size: int = 41) -> GPTConfig:
    return GPTConfig(vocab_size=97, block_size=block_size, n_layer=3, n_head=5, n_embd=60)


@pytest.fixture(scope="module")
def hf_model() -> nn.Module:
    return _hf_model()


@pytest.mark.parametrize(("b", "t"), [(3, 41), (1, 1), (5, 23)])
def test_hf_parity_lm_head_model(hf_model: nn.Module, b: int, t: int) -> None:
    ours = from_hf_state_dict(hf_model.state_dict(), _ours_cfg()).eval()
    idx = _tokens(b, t, 97, seed=b * 100 + t)
    with torch.no_grad():
        expected = hf_model(idx).logits
        got = ours(idx)[0]
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_hf_parity_without_transformer_prefix(hf_model: nn.Module) -> None:
    sd = hf_model.transformer.state_dict()  # GPT2Model: no 'transformer.' prefix, has ln_f
    assert "wte.weight" in sd and "ln_f.weight" in sd
    ours = from_hf_state_dict(sd, _ours_cfg()).eval()
    idx = _tokens(3, 29, 97)
    with torch.no_grad():
        expected = hf_model(idx).logits
        got = ours(idx)[0]
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_hf_parity_with_shorter_block_size(hf_model: nn.Module) -> None:
    # A shorter context than the checkpoint's n_positions crops the position table.
    ours = from_hf_state_dict(hf_model.state_dict(), _ours_cfg(block_size=37)).eval()
    assert ours.pos_emb.weight.shape == (37, 60)
    idx = _tokens(3, 37, 97)
    with torch.no_grad():
        expected = hf_model(idx).logits
        got = ours(idx)[0]
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_hf_conversion_transposes_conv1d(hf_model: nn.Module) -> None:
    sd = hf_to_tutorial_state_dict(hf_model.state_dict(), _ours_cfg())
    hf_sd = hf_model.state_dict()
    w = hf_sd["transformer.h.1.attn.c_attn.weight"]
    assert w.shape == (60, 180)  # Conv1D: (in, out)
    assert torch.equal(sd["blocks.1.attn.qkv.weight"], w.t())
    assert set(sd) == set(GPT(_ours_cfg()).state_dict())


def test_hf_wrong_vocab_raises(hf_model: nn.Module) -> None:
    cfg = dataclasses.replace(_ours_cfg(), vocab_size=96)
    with pytest.raises(ValueError, match=r"\(97, 60\).*\(96, 60\)"):
        from_hf_state_dict(hf_model.state_dict(), cfg)


def test_hf_missing_wte_raises(hf_model: nn.Module) -> None:
    sd = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("wte.weight")}
    with pytest.raises(KeyError, match="wte"):
        from_hf_state_dict(sd, _ours_cfg())


def test_hf_untied_lm_head_raises(hf_model: nn.Module) -> None:
    sd = dict(hf_model.state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="lm_head"):
        from_hf_state_dict(sd, _ours_cfg())


# ---- the LayerFactory hook -----------------------------------------------------------------


class CountingLayers(TorchLayers):
    """TorchLayers that records every request, by role."""

    def __init__(self) -> None:
        self.linear_roles: Counter[str] = Counter()
        self.layernorms = 0

    def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
        self.linear_roles[role] += 1
        return super().linear(in_features, out_features, bias, role)

    def layernorm(self, features: int, bias: bool) -> nn.Module:
        self.layernorms += 1
        return super().layernorm(features, bias)


def test_custom_layer_factory_is_called_per_role() -> None:
    factory = CountingLayers()
    model = GPT(ODD, layers=factory)
    assert factory.linear_roles == {role: ODD.n_layer for role in LINEAR_ROLES}
    assert factory.layernorms == 2 * ODD.n_layer + 1
    logits, _ = model(_tokens(2, 9, 97))
    assert logits.shape == (2, 9, 97)


def test_custom_layer_factory_modules_are_used() -> None:
    class TaggedLinear(nn.Linear):
        pass

    class TaggedLayers(TorchLayers):
        def linear(self, in_features: int, out_features: int, bias: bool, role: str) -> nn.Module:
            super().linear(in_features, out_features, bias, role)  # validates the role
            return TaggedLinear(in_features, out_features, bias=bias)

    model = GPT(ODD, layers=TaggedLayers())
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * ODD.n_layer
    assert all(isinstance(m, TaggedLinear) for m in linears)


def test_default_factory_matches_torch_layers() -> None:
    torch.manual_seed(0)
    a = GPT(ODD)
    torch.manual_seed(0)
    b = GPT(ODD, layers=TorchLayers())
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.parametrize("role", ["attn.out", "mlp", "", "lm_head"])
def test_torch_layers_reject_unknown_role(role: str) -> None:
    with pytest.raises(ValueError, match="Unknown linear role") as excinfo:
        TorchLayers().linear(4, 4, True, role=role)
    for known in LINEAR_ROLES:
        assert known in str(excinfo.value)


def test_torch_layers_build_plain_modules() -> None:
    layers = TorchLayers()
    lin = layers.linear(5, 7, bias=False, role="mlp.fc")
    assert isinstance(lin, nn.Linear) and lin.bias is None and lin.weight.shape == (7, 5)
    ln = layers.layernorm(5, bias=True)
    assert isinstance(ln, nn.LayerNorm) and ln.eps == 1e-5 and ln.bias is not None
