"""A real vocabulary: a byte-level BPE tokenizer trained offline on the corpus, with Hugging Face
``tokenizers``.

Byte-pair encoding starts from the 256 byte values and repeatedly merges the most frequent
adjacent pair into a new token, until the vocabulary has the size asked for (GPT-2: 50,257).
Byte-level means the base alphabet is the bytes themselves (as GPT-2 does it), so any text
encodes, nothing is unknown, and decoding gives the text back exactly (a corpus's invalid UTF-8
bytes are read as U+FFFD first).

``train_bpe(corpus, vocab_size)`` trains one in seconds (the Rust trainer of ``tokenizers``; no
download: the corpus is on this machine). ``BPETokenizer`` encodes and decodes, and saves and
loads itself as ``tokenizer.json``: plain JSON, nothing to unpickle. Its ``padded_vocab_size`` is
its vocabulary rounded up to a multiple of 64, the size the embedding and the LM head get
(GPT-2's 50,257 becomes 50,304, which tiles the GEMMs evenly; the extra rows are never a
target). A corpus can hold fewer pairs seen twice than the merges asked for: the tokenizer then
learns fewer tokens than asked, and the model gets the rows of the tokens it learned (a row past
them could never be a target), so ``tokenizer.json`` alone says the model's shape.
``tokenize(corpus, tokenizer)`` turns the corpus into token ids; ``bits_per_byte`` makes losses
comparable across tokenizers.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "BPETokenizer",
    "END_OF_TEXT",
    "TOKENIZER_FILE",
    "bits_per_byte",
    "pad_vocab",
    "tokenize",
    "train_bpe",
]

END_OF_TEXT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
_CHUNK = 1 << 16  # bytes per training text chunk


def pad_vocab(vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of 64 (50257 -> 50304)."""
    if vocab_size < 1:
        raise ValueError(f"Need a positive vocabulary, got {vocab_size}.")
    return -(-vocab_size // 64) * 64


class BPETokenizer:
    """A trained byte-level BPE tokenizer (a ``tokenizers.Tokenizer``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer can produce (merges, the 256 bytes, the end-of-text token)."""
        return int(self.tokenizer.get_vocab_size())

    @property
    def padded_vocab_size(self) -> int:
        """The embedding's and LM head's rows: ``vocab_size`` rounded up to a multiple of 64."""
        return pad_vocab(self.vocab_size)

    def digest(self) -> str:
        """SHA-256 of the tokenizer's JSON: what a checkpoint records of it (``TokenData``)."""
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        kept = [int(i) for i in ids if int(i) < self.vocab_size]  # padding rows: never targets
        return str(self.tokenizer.decode(kept, skip_special_tokens=False))

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` (a folder gets the file inside it)."""
        path = Path(path)
        if path.suffix != ".json":
            path = path / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        self.tokenizer.save(str(tmp))
        tmp.replace(path)  # atomically: a crash never leaves half a tokenizer
        return path

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Read what ``save`` wrote (a folder: its ``tokenizer.json``)."""
        from tokenizers import Tokenizer

        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"No tokenizer at {path}: train one with tutorial_lib.tokenizer.train_bpe, or "
                "use --tokenizer bytes."
            )
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises its own Exception subclass
            raise ValueError(f"{path} is not a tokenizers JSON file: {err}") from None
        return cls(tokenizer)


def train_bpe(corpus: bytes, vocab_size: int) -> BPETokenizer:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens (256 bytes, one end-of-text token and
    the merges, each of a pair seen at least twice: fewer if the corpus has too few such pairs)
    trained on ``corpus`` (decoded as UTF-8; invalid bytes become U+FFFD)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + 1:
        raise ValueError(
            f"A byte-level BPE vocabulary of {vocab_size} has no room for merges: the 256 bytes "
            "and the end-of-text token come first. Ask for more, or use --tokenizer bytes."
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[END_OF_TEXT],
        show_progress=False,
    )
    text = corpus.decode("utf-8", errors="replace")
    chunks = (text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK))
    tok.train_from_iterator(chunks, trainer=trainer, length=math.ceil(len(text) / _CHUNK))
    return BPETokenizer(tok)


def tokenize(corpus: bytes, tokenizer: BPETokenizer) -> torch.Tensor:
    """The corpus as token ids (int32), encoded in parallel in chunks of about 64K characters
    cut at line ends. A run of whitespace that crosses a cut (a newline and the next line's
    indent) is split there, so a few tokens differ from encoding the text whole; the result is
    the same on every run."""
    text = corpus.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    chunks, current, size = [], [], 0
    for line in lines:
        current.append(line)
        size += len(line)
        if size >= _CHUNK:
            chunks.append("".join(current))
            current, size = [], 0
    if current:
        chunks.append("".join(current))
    encoded = tokenizer.tokenizer.encode_batch(chunks)
    ids = np.fromiter((i for e in encoded for i in e.ids), dtype=np.int32)
    return torch.from_numpy(ids)


def bits_per_byte(loss_per_token: float, tokens: int, n_bytes: int) -> float:
    """A loss in nats per token as bits per byte of text: comparable across tokenizers, since
    a tokenizer with longer tokens has a higher loss per token for the same prediction quality."""
    if tokens < 1 or n_bytes < 1:
        raise ValueError(f"Need positive token and byte counts, got {tokens} and {n_bytes}.")
    return loss_per_token * tokens / n_bytes / math.log(2)
