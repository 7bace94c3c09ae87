"""The byte-level BPE tokenizer (``tutorial_lib.tokenizer``): trained offline in seconds,
lossless on any text, saved as JSON and reloaded; the data and the command line on top of it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from cli_runner import train_argv

from tutorial_lib.__main__ import main
from tutorial_lib.config import PRESETS
from tutorial_lib.data import (
    ByteTokenizer,
    load_corpus,
    make_data,
    preset_data,
    preset_tokenizer,
    train_split_bytes,
)
from tutorial_lib.tokenizer import (
    BPETokenizer,
    bits_per_byte,
    pad_vocab,
    tokenize,
    train_bpe,
)


@pytest.fixture(scope="module")
def corpus() -> bytes:
    return load_corpus(max_bytes=300_000)


@pytest.fixture(scope="module")
def bpe(corpus: bytes) -> BPETokenizer:
    return train_bpe(corpus, 400)


def test_vocabulary_size_and_padding(bpe: BPETokenizer) -> None:
    assert bpe.vocab_size == 400 and bpe.padded_vocab_size == 448
    assert pad_vocab(50257) == 50304 and pad_vocab(256) == 256 and pad_vocab(1) == 64
    with pytest.raises(ValueError, match="positive"):
        pad_vocab(0)
    with pytest.raises(ValueError, match="no room for merges"):
        train_bpe(b"abc", 257)


@pytest.mark.parametrize(
    "text",
    ["def f(x):\n    return x ** 2\n", "naïve café, 東京, 🙂", "\t\x00\x7f odd bytes", "", " " * 9],
)
def test_any_text_round_trips(bpe: BPETokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text
    assert bpe.decode(torch.tensor(ids)) == text


def test_merges_make_tokens_longer_than_a_byte(bpe: BPETokenizer, corpus: bytes) -> None:
    ids = tokenize(corpus, bpe)
    assert ids.dtype == torch.int32 and int(ids.max()) < bpe.vocab_size
    assert len(corpus) / len(ids) > 1.5  # common Python words and indents became single tokens
    assert bpe.decode(ids).encode() == corpus  # lossless over the whole corpus


def test_save_and_load_give_the_same_tokenizer(bpe: BPETokenizer, tmp_path: Path) -> None:
    path = bpe.save(tmp_path / "run")
    assert path == tmp_path / "run" / "tokenizer.json"
    assert json.loads(path.read_text())["model"]["type"] == "BPE"  # plain JSON, no pickle
    again = BPETokenizer.load(tmp_path / "run")
    text = "for i in range(10):\n    print(i)\n"
    assert again.encode(text) == bpe.encode(text) and again.vocab_size == bpe.vocab_size
    with pytest.raises(FileNotFoundError, match="No tokenizer"):
        BPETokenizer.load(tmp_path / "nowhere")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a tokenizers JSON file"):
        BPETokenizer.load(tmp_path / "bad.json")


def test_training_is_deterministic(corpus: bytes, bpe: BPETokenizer) -> None:
    """Every rank of a torchrun job trains its own: they must agree."""
    assert train_bpe(corpus, 400).tokenizer.to_str() == bpe.tokenizer.to_str()


def test_bits_per_byte() -> None:
    assert bits_per_byte(math.log(256), 100, 100) == pytest.approx(8.0)  # uniform over bytes
    assert bits_per_byte(2.0, 50, 100) == pytest.approx(1.0 / math.log(2))
    with pytest.raises(ValueError, match="positive"):
        bits_per_byte(1.0, 0, 10)


def test_make_data_with_bpe_splits_token_ids(bpe: BPETokenizer) -> None:
    data = make_data(32, max_bytes=300_000, tokenizer=bpe)
    x, y = data.get_batch("train", 3)
    assert x.shape == (3, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < bpe.vocab_size
    assert train_split_bytes(b"0123456789", 0.2) == b"01234567"


_cli = train_argv


def test_cli_trains_with_bpe_and_resumes_with_the_saved_tokenizer(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bpe"
    assert main(_cli(out, text_file, 2, "--tokenizer", "bpe", "--vocab-size", "300")) == 0
    first = capsys.readouterr().out
    assert "byte-level BPE, 300 tokens; the model gets 320 rows; saved as" in first
    saved = BPETokenizer.load(out)
    assert saved.vocab_size == 300
    stamp = (out / "tokenizer.json").stat().st_mtime_ns
    assert main(_cli(out, text_file, 3, "--tokenizer", "bpe", "--resume")) == 0
    assert "resumed from" in capsys.readouterr().out
    assert (out / "tokenizer.json").stat().st_mtime_ns == stamp  # loaded, not retrained
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert main(_cli(out, text_file, 4, "--tokenizer", "bpe", "--resume", "--vocab-size", "280"))
    assert "saved a tokenizer of 300 tokens" in capsys.readouterr().err
    assert main(_cli(tmp_path / "b", text_file, 1, "--vocab-size", "512")) == 1
    assert "--vocab-size sets the BPE vocabulary" in capsys.readouterr().err


def test_rows_follow_the_tokens_learned_when_the_corpus_has_fewer_pairs(tmp_path: Path) -> None:
    # 2,000 bytes of one repeated line cannot supply 1,000 merges at min_frequency 2
    small = train_bpe(b"def f(x):\n    return x + 1\n" * 80, 1000)
    assert small.vocab_size < 1000
    assert small.padded_vocab_size == pad_vocab(small.vocab_size) < 1024  # not the rows asked
    small.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]  # all it takes
    assert BPETokenizer.load(tmp_path).padded_vocab_size == small.padded_vocab_size


def test_preset_tokenizer_and_data_follow_the_preset(text_file: Path) -> None:
    ci = PRESETS["ci"]
    assert isinstance(preset_tokenizer(ci), ByteTokenizer)
    byte_data = preset_data(ci, path=text_file)
    assert byte_data.block_size == ci.model_config().block_size
    assert byte_data.train.dtype == torch.uint8

    bpe_preset = dataclasses.replace(ci, tokenizer="bpe", bpe_vocab=300)
    tok = preset_tokenizer(bpe_preset, path=text_file)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size <= 300
    assert preset_tokenizer(bpe_preset, path=text_file) is tok  # trained once per process
    data = preset_data(bpe_preset, seed=3, path=text_file, block_size=16)
    assert data.block_size == 16 and data.seed == 3
    again = preset_data(bpe_preset, seed=4, path=text_file, block_size=16)
    assert again.train is data.train  # tokenized once per process, shared read-only
    assert not torch.equal(again.get_batch("train", 4)[0], data.get_batch("train", 4)[0])
    ids = torch.cat([data.train, data.val]).long()
    assert int(ids.max()) < tok.vocab_size <= bpe_preset.vocab_size == 320
    text = text_file.read_bytes()
    assert tok.decode(data.train[:50]) in text.decode("utf-8", errors="replace")


def test_run_training_refuses_a_vocabulary_no_tokenizer_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tutorial_lib import config
    from tutorial_lib.config import GPTConfig
    from tutorial_lib.runs import run_training
    from tutorial_lib.train import TrainConfig

    original = PRESETS["ci"]
    bpe_preset = dataclasses.replace(original, tokenizer="bpe", bpe_vocab=2000)
    monkeypatch.setitem(config.PRESETS, "ci", bpe_preset)
    monkeypatch.setenv("TUTORIAL_PRESET", "ci")
    cfg = GPTConfig(vocab_size=1024, block_size=8, n_layer=1, n_head=2, n_embd=16)
    with pytest.raises(ValueError, match="no tokenizer for a 1024-row vocabulary"):
        run_training(cfg, TrainConfig(steps=1, batch_size=2, progress=False))
    monkeypatch.setitem(config.PRESETS, "ci", original)  # bytes: only 256 rows fit
    with pytest.raises(ValueError, match="has 256"):
        run_training(cfg, TrainConfig(steps=1, batch_size=2, progress=False))
