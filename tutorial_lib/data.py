"""Bytes in, token ids out: a corpus that needs no download, and a seeded batch sampler.

The default corpus is the Python standard library's own ``.py`` sources on this machine: several
MB of real, structured text that every Python install has. Files are read in sorted order, so
the corpus (and every batch drawn from it with a given seed) is the same on every run.

``make_data`` tokenizes it with bytes or a given BPE tokenizer. ``preset_data(preset)`` is what
the notebooks use: the tokenizer the preset names (``preset_tokenizer``: bytes at ``ci``, a BPE
of GPT-2's size trained on the corpus at ``hopper``), at the preset model's context length.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .tokenizer import BPETokenizer, tokenize, train_bpe

if TYPE_CHECKING:
    from .config import RunPreset

__all__ = [
    "ByteTokenizer",
    "stdlib_source_dir",
    "load_corpus",
    "TokenData",
    "make_data",
    "preset_data",
    "preset_tokenizer",
    "train_split_bytes",
    "synthetic_batch",
]


class ByteTokenizer:
    """The simplest tokenizer there is: one token per byte, 256 symbols, lossless for UTF-8."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def stdlib_source_dir() -> Path:
    """The folder holding the standard library's ``.py`` files (``sysconfig``'s ``stdlib``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path) -> list[Path]:
    # Skip site-packages (it varies per machine) and the test suite (huge, and full of odd bytes).
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not (skip & set(p.relative_to(root).parts[:-1])))


def _folder_files(root: Path, suffix: str | None) -> list[Path]:
    """The files under ``root`` in sorted path order, those ending in ``suffix`` if given;
    hidden files and folders (``.git``) and ``__pycache__`` left out."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        names = [n for n in names if not n.startswith(".")]
        files += [Path(folder, n) for n in names if suffix is None or n.endswith(suffix)]
    return sorted(f for f in files if f.is_file())


def _read(path: Path, limit: int | None, text_only: bool) -> bytes | None:
    """The first ``limit`` bytes of ``path`` (None: all); None if it cannot be read or, with
    ``text_only``, is not text: a NUL byte, or bytes that do not decode as UTF-8."""
    try:
        with path.open("rb") as f:
            data = f.read(-1 if limit is None else limit)
    except OSError:
        return None  # unreadable (permissions, a broken link): not part of the corpus
    if text_only:
        whole = limit is None or len(data) < limit  # else a character cut there is no error
        try:
            codecs.getincrementaldecoder("utf-8")().decode(data, final=whole)
        except UnicodeDecodeError:
            return None
        if b"\0" in data:
            return None
    return data


def load_corpus(
    path: str | Path | None = None,
    max_bytes: int | None = 8_000_000,
    suffix: str | None = None,
) -> bytes:
    """Read a corpus: a text file; a folder's text files (the files whose bytes decode as UTF-8
    and hold no NUL byte), or its files ending in ``suffix``; or (default) the stdlib's ``.py``.

    Files are concatenated in sorted path order, separated by a newline; a folder's hidden files
    and folders (``.git``) and ``__pycache__`` are left out. Reading stops after ``max_bytes``
    (None reads everything).
    """
    p = None if path is None else Path(path).expanduser()
    if p is not None and not p.exists():
        raise FileNotFoundError(
            f"Corpus path {str(p)!r} does not exist. Pass an existing text file or folder, "
            "or leave it unset (None) for the Python standard library's sources."
        )
    if suffix is not None and (p is None or not p.is_dir()):
        raise ValueError(
            f"A suffix ({suffix!r}, --data-suffix) picks the files of a corpus folder, but the "
            f"corpus is {'the standard library' if p is None else f'the file {p}'}: pass a "
            "folder, or drop the suffix."
        )
    text_only = False  # a folder without a suffix: its files that hold text
    if p is None:
        files, searched = _stdlib_files(stdlib_source_dir()), "'.py' files"
        where = f"the standard library at {stdlib_source_dir()}"
    elif p.is_dir():
        files, where, text_only = _folder_files(p, suffix), str(p), suffix is None
        searched = "text files" if suffix is None else f"files ending in {suffix!r}"
    else:
        files, searched, where = [p], "text", str(p)
    chunks: list[bytes] = []
    total = 0
    for f in files:
        limit = None if max_bytes is None else max_bytes - total
        data = _read(f, limit, text_only)
        if data is None:
            continue
        chunks.append(data)
        total += len(data) + 1
        if max_bytes is not None and total >= max_bytes:
            break
    corpus = b"\n".join(chunks)[:max_bytes] if max_bytes is not None else b"\n".join(chunks)
    if not corpus.strip():
        raise ValueError(
            f"The corpus from {where} is empty: no non-blank {searched} found. Point --data "
            "(`path`) at a non-empty text file, or at a folder of text files"
            + ("." if suffix is None else " (or change --data-suffix).")
        )
    return corpus


@dataclass
class TokenData:
    """Train and validation token streams and a seeded sampler of (input, target) batches."""

    train: torch.Tensor  # (N_train,) token ids: uint8 bytes, or int32 BPE tokens
    val: torch.Tensor  # (N_val,) token ids
    block_size: int
    seed: int = 0
    tokenizer: str = "bytes"  # "bytes", or the SHA-256 of the BPE tokenizer (``digest``)

    def __post_init__(self) -> None:
        for name, split in (("train", self.train), ("val", self.val)):
            if len(split) <= self.block_size:
                raise ValueError(
                    f"The {name} split has {len(split)} tokens, not more than block_size="
                    f"{self.block_size}. Use a larger corpus, a smaller block_size, or a "
                    "different val_fraction."
                )
        self._tokens_digest: str | None = None  # (fingerprint)
        self._gens = {
            "train": torch.Generator().manual_seed(self.seed),
            "val": torch.Generator().manual_seed(self.seed + 1),
        }

    def get_batch(
        self,
        split: str,
        batch_size: int,
        device: torch.device | str = "cpu",
        rows: slice | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: x is (B, T) token ids, y is x shifted left by one (next token).
        ``rows``: only these rows of the batch (a data-parallel rank's share of it)."""
        if split not in self._gens:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}.")
        data = self.train if split == "train" else self.val
        starts = torch.randint(
            len(data) - self.block_size, (batch_size,), generator=self._gens[split]
        )
        idx = starts[:, None] + torch.arange(self.block_size + 1)[None, :]  # (B, T+1)
        window = data[idx].long()
        x, y = window[:, :-1], window[:, 1:]
        if rows is not None:
            x, y = x[rows], y[rows]
        device = torch.device(device)
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
                device, non_blocking=True
            )
        return x, y

    def fingerprint(self) -> dict[str, str]:
        """What a checkpoint records of the data it was trained on: the tokenizer's digest and
        the SHA-256 of both token streams (another corpus, or the same one tokenized by another
        tokenizer, changes it). Hashed once: every checkpoint records it."""
        if self._tokens_digest is None:
            digest = hashlib.sha256()
            for split in (self.train, self.val):
                digest.update(f"{split.dtype}{len(split)}:".encode())
                digest.update(split.contiguous().view(torch.uint8).numpy().data)
            self._tokens_digest = digest.hexdigest()
        return {"tokenizer": self.tokenizer, "tokens": self._tokens_digest}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Sampler RNG state, so a resumed run draws the same batches."""
        return {k: g.get_state() for k, g in self._gens.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k, g in self._gens.items():
            g.set_state(state[k])


def make_data(
    block_size: int,
    path: str | Path | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    max_bytes: int | None = 8_000_000,
    tokenizer: BPETokenizer | None = None,
    suffix: str | None = None,
) -> TokenData:
    """Tokenize a corpus (see ``load_corpus``, which takes ``path``, ``max_bytes`` and
    ``suffix``): one token per byte, or with a trained BPE ``tokenizer``
    (``tokenizer.train_bpe``); then split it: the last part is validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}.")
    corpus = load_corpus(path, max_bytes=max_bytes, suffix=suffix)
    if tokenizer is not None:
        train, val = _bpe_splits(corpus, tokenizer, val_fraction)
        return TokenData(train, val, block_size, seed, tokenizer=tokenizer.digest())
    tokens = torch.from_numpy(np.frombuffer(corpus, dtype=np.uint8).copy())
    n_train = len(tokens) - int(len(tokens) * val_fraction)  # not tokens[:-n_val]: n_val may be 0
    return TokenData(tokens[:n_train], tokens[n_train:], block_size=block_size, seed=seed)


def _bpe_splits(
    corpus: bytes, tokenizer: BPETokenizer, val_fraction: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the text first, then tokenize: validation is text the tokenizer never saw."""
    train_text = train_split_bytes(corpus, val_fraction)
    return tokenize(train_text, tokenizer), tokenize(corpus[len(train_text) :], tokenizer)


def train_split_bytes(corpus: bytes, val_fraction: float = 0.1) -> bytes:
    """The part of ``corpus`` that ``make_data`` trains on (the rest is validation): what a
    tokenizer should be trained on, so validation text stays unseen."""
    return corpus[: len(corpus) - int(len(corpus) * val_fraction)]


@functools.lru_cache(maxsize=4)
def _trained_bpe(path: str | None, vocab: int) -> BPETokenizer:
    return train_bpe(train_split_bytes(load_corpus(path)), vocab)


@functools.lru_cache(maxsize=4)
def _bpe_tokens(path: str | None, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus tokenized once per process (read-only; every TokenData samples its own)."""
    return _bpe_splits(load_corpus(path), _trained_bpe(path, vocab))


def preset_tokenizer(
    preset: RunPreset, path: str | Path | None = None
) -> ByteTokenizer | BPETokenizer:
    """The tokenizer ``preset`` trains with: ``ByteTokenizer``, or a BPE of ``preset.bpe_vocab``
    tokens trained on the training split of the corpus (``load_corpus(path)``), once per
    process: later calls with the same arguments return the same tokenizer."""
    if preset.tokenizer == "bytes":
        return ByteTokenizer()
    where = None if path is None else str(Path(path).expanduser().resolve())
    return _trained_bpe(where, preset.bpe_vocab)


def preset_data(
    preset: RunPreset,
    seed: int = 0,
    path: str | Path | None = None,
    block_size: int | None = None,
) -> TokenData:
    """``make_data`` with the preset's tokenizer (``preset_tokenizer``) at its model's context
    length (or ``block_size``): the data a notebook trains on, at either preset. A BPE corpus is
    tokenized once per process and shared; each call gets its own seeded sampler."""
    block = block_size or preset.model_config().block_size
    if preset.tokenizer == "bytes":
        return make_data(block, path, seed=seed)
    where = None if path is None else str(Path(path).expanduser().resolve())
    train, val = _bpe_tokens(where, preset.bpe_vocab)
    digest = _trained_bpe(where, preset.bpe_vocab).digest()
    return TokenData(train, val, block_size=block, seed=seed, tokenizer=digest)


def synthetic_batch(
    batch_size: int,
    block_size: int,
    vocab_size: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random tokens, generated on the device: for throughput benchmarks, not learning."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(vocab_size, (batch_size, block_size + 1), generator=g, device=device)
    return x[:, :-1], x[:, 1:]
