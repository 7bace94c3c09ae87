"""Tests for tutorial_lib.data: tokenizer, corpus loading and the seeded batch sampler."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib.data import (
    ByteTokenizer,
    TokenData,
    load_corpus,
    make_data,
    stdlib_source_dir,
    synthetic_batch,
)

# ---- tokenizer -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "hello", "naïve café", "日本語のテキスト", "emoji 🚀🔥 mixed\nlines\t", "\x00\x7f"],
)
def test_byte_tokenizer_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids, dtype=torch.long)) == text
    assert tok.decode(torch.tensor(ids, dtype=torch.uint8)) == text


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trip_property(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_byte_tokenizer_multibyte_counts() -> None:
    tok = ByteTokenizer()
    assert ByteTokenizer.vocab_size == 256
    assert tok.encode("é") == [0xC3, 0xA9]
    assert len(tok.encode("🚀")) == 4


def test_byte_tokenizer_decodes_invalid_utf8_without_raising() -> None:
    assert ByteTokenizer().decode([0xFF, ord("a")]) == "\ufffda"


# ---- corpus --------------------------------------------------------------------------------


def test_default_corpus_is_several_mb_and_deterministic() -> None:
    first = load_corpus()
    assert isinstance(first, bytes)
    assert len(first) > 2_000_000
    assert len(first) <= 8_000_000  # the default max_bytes
    second = load_corpus()
    assert first == second
    assert b"def " in first and b"import " in first  # it really is Python source


def test_stdlib_source_dir_exists() -> None:
    root = stdlib_source_dir()
    assert root.is_dir()
    assert (root / "os.py").is_file()


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_folder_corpus_is_read_in_sorted_order(tmp_path: Path) -> None:
    # Written in a scrambled order, with a subfolder and a non-matching file.
    _write(tmp_path / "c.py", b"ccc")
    _write(tmp_path / "a.py", b"aaa")
    _write(tmp_path / "sub" / "z.py", b"zzz")
    _write(tmp_path / "b.py", b"bbb")
    _write(tmp_path / "notes.txt", b"ignored")
    corpus = load_corpus(tmp_path, max_bytes=None, suffix=".py")
    expected_order = sorted([tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"])
    expected_order += [tmp_path / "sub" / "z.py"]
    expected_order = sorted(expected_order)
    assert corpus == b"\n".join(p.read_bytes() for p in expected_order)
    assert b"ignored" not in corpus
    assert corpus == b"aaa\nbbb\nccc\nzzz"


def test_folder_corpus_with_suffix(tmp_path: Path) -> None:
    _write(tmp_path / "b.txt", b"second")
    _write(tmp_path / "a.txt", b"first")
    _write(tmp_path / "x.py", b"code")
    assert load_corpus(tmp_path, suffix=".txt") == b"first\nsecond"


def test_folder_corpus_is_its_text_files_by_default(tmp_path: Path) -> None:
    """Any file whose bytes are text (UTF-8, no NUL byte), whatever its name; not a binary
    file, not invalid UTF-8, nothing hidden (``.git``) and no ``__pycache__``."""
    _write(tmp_path / "b.md", b"markdown")
    _write(tmp_path / "a" / "notes", "caf\u00e9".encode())
    _write(tmp_path / "c.py", b"code")
    _write(tmp_path / "data.bin", b"text, then\x00")
    _write(tmp_path / "latin1.txt", "caf\u00e9".encode("latin-1"))
    _write(tmp_path / ".git" / "config", b"[core]")
    _write(tmp_path / ".env", b"SECRET=1")
    _write(tmp_path / "__pycache__" / "x.txt", b"cache")
    assert load_corpus(tmp_path) == "caf\u00e9\nmarkdown\ncode".encode()
    assert load_corpus(tmp_path, max_bytes=4) == b"caf\xc3"  # a character cut is still text


def test_folder_corpus_max_bytes_truncates(tmp_path: Path) -> None:
    for i in range(5):
        _write(tmp_path / f"{i}.py", bytes([ord("a") + i]) * 100)
    corpus = load_corpus(tmp_path, max_bytes=250)
    assert len(corpus) == 250
    assert corpus == load_corpus(tmp_path, max_bytes=None)[:250]


def test_single_file_corpus(tmp_path: Path) -> None:
    text = "Ein kleiner Korpus. ✓\n" * 10
    path = _write(tmp_path / "corpus.md", text.encode("utf-8"))  # suffix does not matter
    assert load_corpus(path) == text.encode("utf-8")
    assert load_corpus(str(path), max_bytes=5) == text.encode("utf-8")[:5]


def test_missing_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "does_not_exist.txt"
    with pytest.raises(FileNotFoundError, match="does_not_exist.txt"):
        load_corpus(missing)


def test_empty_file_raises(tmp_path: Path) -> None:
    path = _write(tmp_path / "empty.py", b"")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(path)


def test_whitespace_only_folder_raises(tmp_path: Path) -> None:
    _write(tmp_path / "a.py", b"   \n\t")
    _write(tmp_path / "b.py", b"\n\n")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(tmp_path)


def test_folder_without_matching_files_raises(tmp_path: Path) -> None:
    _write(tmp_path / "readme.txt", b"plenty of text here")
    with pytest.raises(ValueError, match=r"no non-blank files ending in '\.py' found"):
        load_corpus(tmp_path, suffix=".py")


def test_empty_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no non-blank text files found"):
        load_corpus(tmp_path)


def test_suffix_without_a_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="picks the files of a corpus folder"):
        load_corpus(_write(tmp_path / "a.txt", b"text"), suffix=".txt")
    with pytest.raises(ValueError, match="the corpus is the standard library"):
        load_corpus(suffix=".py")


# ---- make_data and the sampler -------------------------------------------------------------


def _stream_file(tmp_path: Path, n: int = 4099) -> tuple[Path, torch.Tensor]:
    """A file of n pseudo-random printable bytes; returns it and its byte stream."""
    g = torch.Generator().manual_seed(1234)
    stream = torch.randint(32, 127, (n,), generator=g, dtype=torch.uint8)
    path = _write(tmp_path / "stream.txt", bytes(stream.tolist()))
    return path, stream


def test_make_data_splits_with_val_at_the_end(tmp_path: Path) -> None:
    path, stream = _stream_file(tmp_path, 4099)
    data = make_data(block_size=17, path=path, val_fraction=0.1)
    n_val = int(4099 * 0.1)
    assert len(data.val) == n_val
    assert len(data.train) + len(data.val) == 4099
    assert torch.equal(data.train, stream[: 4099 - n_val])
    assert torch.equal(data.val, stream[4099 - n_val :])
    assert data.train.dtype == torch.uint8 and data.val.dtype == torch.uint8
    assert data.block_size == 17


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, -0.1, 1.5])
def test_make_data_rejects_bad_val_fraction(tmp_path: Path, val_fraction: float) -> None:
    path, _ = _stream_file(tmp_path)
    with pytest.raises(ValueError, match="val_fraction"):
        make_data(block_size=8, path=path, val_fraction=val_fraction)


def test_make_data_tiny_val_fraction_blames_the_val_split(tmp_path: Path) -> None:
    # 100 bytes at 0.5% gives no validation tokens: the error must say so (and must not swap
    # the splits, putting the whole corpus into validation).
    path, _ = _stream_file(tmp_path, 100)
    with pytest.raises(ValueError, match="val split has 0 tokens"):
        make_data(block_size=8, path=path, val_fraction=0.005)


def test_get_batch_shapes_dtype_and_shift(tmp_path: Path) -> None:
    path, _ = _stream_file(tmp_path, 4099)
    data = make_data(block_size=37, path=path, val_fraction=0.1, seed=3)
    for split, source in (("train", data.train), ("val", data.val)):
        x, y = data.get_batch(split, batch_size=5)
        assert x.shape == (5, 37) and y.shape == (5, 37)
        assert x.dtype == torch.long and y.dtype == torch.long
        assert x.device.type == "cpu"
        assert int(x.min()) >= 0 and int(x.max()) < 256 and int(y.max()) < 256
        assert torch.equal(x[:, 1:], y[:, :-1])
        # Each row is a window of the underlying stream, and y is that window shifted by one.
        windows = source.long().unfold(0, 38, 1)  # (N - 37, T + 1): every possible window
        for row in range(5):
            xy = torch.cat([x[row], y[row, -1:]])
            assert (windows == xy).all(dim=1).any(), f"{split} row {row} is not a window"


def test_get_batch_covers_the_last_window() -> None:
    # len = block_size + 1: only one window exists, and it must be the whole split.
    train = torch.arange(38, dtype=torch.uint8)
    data = TokenData(train, torch.arange(100, dtype=torch.uint8), block_size=37)
    x, y = data.get_batch("train", batch_size=3)
    for row in range(3):
        assert torch.equal(x[row], train[:-1].long())
        assert torch.equal(y[row], train[1:].long())


def test_same_seed_same_batches_different_seed_different(tmp_path: Path) -> None:
    path, _ = _stream_file(tmp_path)
    a = make_data(block_size=16, path=path, seed=7)
    b = make_data(block_size=16, path=path, seed=7)
    c = make_data(block_size=16, path=path, seed=8)
    for split in ("train", "val", "train"):
        xa, ya = a.get_batch(split, 6)
        xb, yb = b.get_batch(split, 6)
        xc, _ = c.get_batch(split, 6)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert not torch.equal(xa, xc)


def test_train_and_val_streams_are_independent(tmp_path: Path) -> None:
    # Drawing val batches (e.g. for evaluation) must not shift the train batches.
    path, _ = _stream_file(tmp_path)
    a = make_data(block_size=16, path=path, seed=0)
    b = make_data(block_size=16, path=path, seed=0)
    b.get_batch("val", 4)
    b.get_batch("val", 4)
    assert torch.equal(a.get_batch("train", 4)[0], b.get_batch("train", 4)[0])


def test_state_dict_reproduces_following_batches(tmp_path: Path) -> None:
    path, _ = _stream_file(tmp_path)
    data = make_data(block_size=16, path=path, seed=11)
    data.get_batch("train", 4)
    data.get_batch("val", 4)
    state = data.state_dict()
    assert set(state) == {"train", "val"}
    expected = [data.get_batch(s, 4) for s in ("train", "val", "train", "train")]
    # Restore into the same object ...
    data.load_state_dict(state)
    again = [data.get_batch(s, 4) for s in ("train", "val", "train", "train")]
    # ... and into a fresh one with a different seed (a resumed run).
    fresh = make_data(block_size=16, path=path, seed=99)
    fresh.load_state_dict(state)
    resumed = [fresh.get_batch(s, 4) for s in ("train", "val", "train", "train")]
    for (xe, ye), (x1, y1), (x2, y2) in zip(expected, again, resumed, strict=True):
        assert torch.equal(xe, x1) and torch.equal(ye, y1)
        assert torch.equal(xe, x2) and torch.equal(ye, y2)


def test_state_dict_is_a_snapshot(tmp_path: Path) -> None:
    path, _ = _stream_file(tmp_path)
    data = make_data(block_size=16, path=path)
    state = data.state_dict()
    first = data.get_batch("train", 4)[0]
    data.get_batch("train", 4)  # advancing must not change the saved state
    data.load_state_dict(state)
    assert torch.equal(data.get_batch("train", 4)[0], first)


@pytest.mark.parametrize("split", ["test", "Train", "validation", ""])
def test_bad_split_name_raises(tmp_path: Path, split: str) -> None:
    path, _ = _stream_file(tmp_path)
    data = make_data(block_size=16, path=path)
    with pytest.raises(ValueError, match="split"):
        data.get_batch(split, 2)


def test_block_size_too_large_for_val_split(tmp_path: Path) -> None:
    path, _ = _stream_file(tmp_path, 1000)  # val has 100 tokens
    with pytest.raises(ValueError, match=r"val split has 100 tokens.*block_size=100"):
        make_data(block_size=100, path=path, val_fraction=0.1)
    assert len(make_data(block_size=99, path=path, val_fraction=0.1).val) == 100


def test_block_size_too_large_for_train_split() -> None:
    with pytest.raises(ValueError, match=r"train split has 10 tokens"):
        TokenData(torch.zeros(10, dtype=torch.uint8), torch.zeros(50, dtype=torch.uint8), 10)


# ---- synthetic batches ---------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "block", "vocab"), [(3, 37, 97), (1, 1, 2), (5, 123, 256)])
def test_synthetic_batch_shapes_and_range(batch: int, block: int, vocab: int) -> None:
    x, y = synthetic_batch(batch, block, vocab)
    assert x.shape == (batch, block) and y.shape == (batch, block)
    assert x.dtype == torch.long and y.dtype == torch.long
    assert int(x.min()) >= 0 and int(x.max()) < vocab
    assert int(y.min()) >= 0 and int(y.max()) < vocab
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_synthetic_batch_seed_determinism() -> None:
    a = synthetic_batch(4, 64, 256, seed=1)
    b = synthetic_batch(4, 64, 256, seed=1)
    c = synthetic_batch(4, 64, 256, seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_synthetic_batch_uses_the_whole_vocab() -> None:
    x, _ = synthetic_batch(8, 512, 97)
    assert torch.unique(x).numel() == 97
