"""Tests for tutorial_lib.config: model sizes, validation and run presets."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tutorial_lib import config
from tutorial_lib.config import MODEL_SIZES, PRESETS, GPTConfig, RunPreset, get_preset
from tutorial_lib.model import GPT

# ---- named sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODEL_SIZES))
def test_every_named_size_builds_and_is_valid(name: str) -> None:
    cfg = GPTConfig.from_name(name)
    assert cfg == MODEL_SIZES[name]
    for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        value = getattr(cfg, field)
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0
    assert cfg.n_embd % cfg.n_head == 0
    assert cfg.head_dim * cfg.n_head == cfg.n_embd
    assert 0.0 <= cfg.dropout < 1.0
    # Rebuilding from the fields runs validation again and gives an equal config.
    assert GPTConfig(**dataclasses.asdict(cfg)) == cfg


def test_there_is_a_wide_size_for_fp8() -> None:
    # FP8 only pays off on wide GEMMs; the book needs at least one size with hidden >= 2048.
    wide = [name for name, cfg in MODEL_SIZES.items() if cfg.n_embd >= 2048]
    assert wide, f"no size with n_embd >= 2048 among {list(MODEL_SIZES)}"


def test_tiny_and_gpt2_124m_shapes() -> None:
    tiny = GPTConfig.from_name("tiny")
    assert tiny.vocab_size == 256
    gpt2 = GPTConfig.from_name("gpt2-124m")
    assert (gpt2.vocab_size, gpt2.block_size, gpt2.n_layer, gpt2.n_head, gpt2.n_embd) == (
        50257,
        1024,
        12,
        12,
        768,
    )
    assert gpt2.head_dim == 64


def test_from_name_applies_overrides_without_mutating_the_table() -> None:
    before = MODEL_SIZES["tiny"]
    cfg = GPTConfig.from_name("tiny", vocab_size=97, block_size=37)
    assert (cfg.vocab_size, cfg.block_size) == (97, 37)
    assert cfg.n_layer == before.n_layer
    assert MODEL_SIZES["tiny"] is before
    assert MODEL_SIZES["tiny"].vocab_size == 256


def test_from_name_overrides_are_validated() -> None:
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig.from_name("tiny", n_head=7)


def test_from_name_unknown_lists_available_names() -> None:
    with pytest.raises(KeyError) as excinfo:
        GPTConfig.from_name("gpt5-nano")
    message = str(excinfo.value)
    assert "gpt5-nano" in message
    for name in MODEL_SIZES:
        assert name in message


def test_replace_returns_validated_copy() -> None:
    cfg = GPTConfig.from_name("tiny")
    wider = dataclasses.replace(cfg, n_embd=256)
    assert wider.n_embd == 256 and cfg.n_embd == 128
    with pytest.raises(ValueError):
        dataclasses.replace(cfg, n_embd=130)  # 130 % 4 != 0


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_model_config_is_its_named_size_with_its_overrides(name: str) -> None:
    """``model_config()`` is the size the preset names, field by field, except the fields the
    preset overrides (which must be GPTConfig fields); the result validates."""
    preset = PRESETS[name]
    base = dataclasses.asdict(MODEL_SIZES[preset.model])
    assert set(preset.model_overrides) <= set(base), preset.model_overrides
    cfg = preset.model_config()
    expected = {**base, **preset.model_overrides}
    if preset.tokenizer == "bpe":  # the rows asked for, padded to a multiple of 64
        expected["vocab_size"] = -(-preset.bpe_vocab // 64) * 64
    assert dataclasses.asdict(cfg) == expected
    assert GPTConfig(**dataclasses.asdict(cfg)) == cfg  # validation passes on the result


# ---- validation ----------------------------------------------------------------------------


def test_n_embd_not_divisible_by_n_head_suggests_a_divisor() -> None:
    with pytest.raises(ValueError) as excinfo:
        GPTConfig(n_embd=100, n_head=7)
    message = str(excinfo.value)
    assert "n_embd=100" in message and "n_head=7" in message
    # The nearest divisor of 100 to 7 is 5 (distance 2; 10 is at distance 3).
    assert "n_head=5" in message


@pytest.mark.parametrize("field", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
@pytest.mark.parametrize("bad", [0, -1, -384])
def test_non_positive_sizes_raise(field: str, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"GPTConfig\.{field} must be a positive integer"):
        GPTConfig(**{field: bad})


@pytest.mark.parametrize("field", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
@pytest.mark.parametrize("bad", [True, False, 4.0, "4", None])
def test_non_int_sizes_raise(field: str, bad: object) -> None:
    # bool is a subclass of int, so True would otherwise pass as 1.
    with pytest.raises(ValueError, match=rf"GPTConfig\.{field}"):
        GPTConfig(**{field: bad})


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), float("inf")])
def test_dropout_out_of_range_raises(bad: float) -> None:
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=bad)


@pytest.mark.parametrize("ok", [0.0, 0.1, 0.999])
def test_dropout_in_range_is_accepted(ok: float) -> None:
    assert GPTConfig(dropout=ok).dropout == ok


def test_odd_but_valid_config() -> None:
    cfg = GPTConfig(vocab_size=97, block_size=37, n_layer=3, n_head=5, n_embd=40, bias=False)
    assert cfg.head_dim == 8
    assert cfg.bias is False


# ---- presets -------------------------------------------------------------------------------


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def test_get_preset_by_name() -> None:
    ci = get_preset("ci")
    assert isinstance(ci, RunPreset) and ci.name == "ci" and ci.model == "tiny"
    hopper = get_preset("hopper")
    assert hopper.name == "hopper" and hopper.model == "gpt2-124m"
    assert ci is PRESETS["ci"] and hopper is PRESETS["hopper"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_fields_are_sane(name: str) -> None:
    preset = PRESETS[name]
    assert preset.name == name
    assert preset.model in MODEL_SIZES
    for field in ("batch_size", "grad_accum", "steps", "eval_every", "eval_iters"):
        assert getattr(preset, field) > 0, field
    assert preset.bench_iters > 0 and preset.bench_warmup >= 0
    assert 0 < preset.warmup_steps < preset.steps
    assert 0 < preset.lr < 1
    assert preset.sample_tokens > 0


def test_preset_vocabularies_follow_their_tokenizers() -> None:
    # ci trains on bytes (256 rows); hopper is GPT-2 124M: a BPE of GPT-2's 50,257 tokens
    # padded to 50,304 rows, about 124M parameters with the tied embedding.
    ci, hopper = get_preset("ci"), get_preset("hopper")
    assert (ci.tokenizer, ci.model_config().vocab_size) == ("bytes", 256)
    assert (hopper.tokenizer, hopper.bpe_vocab) == ("bpe", 50257)
    cfg = hopper.model_config()
    base = MODEL_SIZES["gpt2-124m"]
    assert cfg.vocab_size == 50304 and cfg.vocab_size % 64 == 0
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size) == (
        base.n_layer,
        base.n_head,
        base.n_embd,
        base.block_size,
    )
    # 12 blocks of 12h^2 + 13h, the tied 50,304 x 768 embedding, 1024 positions, final LN
    h, L = cfg.n_embd, cfg.n_layer
    expected = L * (12 * h * h + 13 * h) + 50304 * h + 1024 * h + 2 * h
    assert GPT(cfg).num_params() == expected
    assert 123e6 < expected < 126e6


@pytest.mark.parametrize(
    ("changes", "words"),
    [({"tokenizer": "words"}, "'bytes' or 'bpe'"), ({"bpe_vocab": 257}, "258 or more")],
)
def test_preset_rejects_a_bad_tokenizer(changes: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        dataclasses.replace(PRESETS["ci"], **changes)


def test_preset_model_config_call_overrides_win() -> None:
    hopper = get_preset("hopper")
    cfg = hopper.model_config(vocab_size=97, n_layer=2)
    assert (cfg.vocab_size, cfg.n_layer) == (97, 2)
    # The preset itself is untouched.
    assert hopper.model_config().vocab_size == 50304
    ci_cfg = get_preset("ci").model_config(block_size=37)
    assert ci_cfg.block_size == 37 and ci_cfg.n_embd == MODEL_SIZES["tiny"].n_embd


def test_preset_model_config_validates_overrides() -> None:
    with pytest.raises(ValueError):
        get_preset("ci").model_config(n_head=3)  # 128 % 3 != 0


@pytest.mark.parametrize("value", ["hopper", "HOPPER", "  hopper  ", "ci"])
def test_env_var_selects_preset(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    _no_cuda(monkeypatch)
    monkeypatch.setenv("TUTORIAL_PRESET", value)
    assert get_preset().name == value.strip().lower()


def test_env_var_overrides_auto_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, (9, 0))
    monkeypatch.setenv("TUTORIAL_PRESET", "ci")
    assert get_preset().name == "ci"


def test_explicit_name_beats_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "hopper")
    assert get_preset("ci").name == "ci"


def test_empty_env_var_falls_back_to_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    monkeypatch.setenv("TUTORIAL_PRESET", "   ")
    assert get_preset().name == "ci"


def test_unknown_preset_name_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)
    with pytest.raises(ValueError) as excinfo:
        get_preset("a100-cluster")
    message = str(excinfo.value)
    assert "a100-cluster" in message
    for name in PRESETS:
        assert name in message


def test_unknown_preset_from_env_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "laptop")
    with pytest.raises(ValueError, match="laptop.*TUTORIAL_PRESET"):
        get_preset()


def test_auto_detection_is_ci_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a real CUDA device is present; the simulated cases below cover detection")
    assert config.detect_preset_name() == "ci"
    assert get_preset().name == "ci"


def test_auto_detection_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)
    _no_cuda(monkeypatch)

    def fail(*args: object, **kwargs: object) -> tuple[int, int]:
        raise AssertionError("must not query the capability without CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_capability", fail)
    assert config.detect_preset_name() == "ci"
    assert get_preset().name == "ci"


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((9, 0), "hopper"), ((8, 0), "ci"), ((8, 9), "ci"), ((7, 5), "ci"), ((10, 0), "ci")],
)
def test_auto_detection_with_simulated_gpu(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], expected: str
) -> None:
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)
    _fake_cuda(monkeypatch, capability)
    assert config.detect_preset_name() == expected
    assert get_preset().name == expected
