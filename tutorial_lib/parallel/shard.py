"""Shard maps: which attention heads and which MLP hidden units each tensor-parallel rank owns.

Megatron-style tensor parallelism splits a transformer block along two *unit* axes:

- attention **heads** (``n_head`` units): ``attn.qkv`` is column-parallel (a rank computes the
  Q, K and V columns of its heads) and ``attn.proj`` row-parallel (it takes the same heads'
  rows of the output projection);
- MLP **hidden units**, the FFN columns (``4 * n_embd`` units): ``mlp.fc`` column-parallel,
  ``mlp.proj`` row-parallel over the same units.

Every TP codebase we know splits both axes into equal contiguous blocks and asserts divisibility.
A ``ShardMap`` instead lists each rank's units explicitly, so shards may be uneven (12 heads on 5
ranks) and non-contiguous (nonuniform TP hands a failed rank's units round-robin to the
survivors, see ``ntp.py``). Even contiguous splits are the special case ``ShardMap.even``.

A map is validated against the model: every unit owned by exactly one rank, every rank owning at
least one head and one hidden unit. The errors name the problem and the fix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..config import GPTConfig

__all__ = [
    "ShardMap",
    "split_evenly",
    "UnitSpec",
    "unit_specs",
    "VOCAB_SPEC",
    "global_index",
    "split_by_unit",
    "join_units",
    "rank_units",
    "param_spec",
]

Units = tuple[tuple[int, ...], ...]


def split_evenly(n: int, parts: int) -> Units:
    """``n`` units in ``parts`` contiguous blocks whose sizes differ by at most one (the first
    ``n % parts`` blocks get the extra unit): ``split_evenly(12, 5)`` has sizes 3, 3, 2, 2, 2."""
    if parts < 1:
        raise ValueError(f"Need at least one part, got {parts}.")
    if n < parts:
        raise ValueError(
            f"Cannot split {n} units over {parts} ranks: each rank needs at least one."
        )
    base, extra = divmod(n, parts)
    out, start = [], 0
    for r in range(parts):
        size = base + (1 if r < extra else 0)
        out.append(tuple(range(start, start + size)))
        start += size
    return tuple(out)


@dataclass(frozen=True)
class ShardMap:
    """Per TP rank, the attention heads and the MLP hidden units it owns.

    Fields:
        heads: ``heads[r]`` are rank r's head indices in [0, n_head), in the order its local
            tensors hold them.
        ffn: ``ffn[r]`` are rank r's hidden-unit indices in [0, ffn_size).
        n_head, ffn_size: the model's totals (``cfg.n_head``, ``4 * cfg.n_embd``).
        vocab: for a vocabulary-parallel embedding and LM head, ``vocab[r]`` are the token ids
            whose embedding rows rank r holds (contiguous); None: replicated on every rank.
        vocab_size: the model's vocabulary (with ``vocab``).
    """

    heads: Units
    ffn: Units
    n_head: int
    ffn_size: int
    vocab: Units | None = None
    vocab_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(tuple(int(i) for i in h) for h in self.heads))
        object.__setattr__(self, "ffn", tuple(tuple(int(i) for i in f) for f in self.ffn))
        if len(self.heads) != len(self.ffn):
            raise ValueError(
                f"The shard map lists {len(self.heads)} ranks for heads but {len(self.ffn)} for "
                "FFN columns; give both axes one entry per TP rank."
            )
        _check_cover("heads", self.heads, self.n_head)
        _check_cover("FFN columns", self.ffn, self.ffn_size)
        if self.vocab is not None:
            object.__setattr__(self, "vocab", tuple(tuple(int(i) for i in v) for v in self.vocab))
            if len(self.vocab) != len(self.heads):
                raise ValueError(
                    f"The shard map lists {len(self.vocab)} ranks for the vocabulary but "
                    f"{len(self.heads)} for heads; give every axis one entry per TP rank."
                )
            _check_cover("vocabulary rows", self.vocab, self.vocab_size)
            contiguous = all(list(v) == list(range(v[0], v[0] + len(v))) for v in self.vocab)
            ascending = all(a[-1] < b[0] for a, b in zip(self.vocab, self.vocab[1:], strict=False))
            if not (contiguous and ascending):
                raise ValueError(
                    "Each rank's vocabulary rows must be one contiguous range of token ids, in "
                    "rank order (the embedding and loss test id ranges, and gathered logits are "
                    "put together in rank order); use split_evenly."
                )

    @property
    def tp(self) -> int:
        """The TP degree: how many ranks share the layer."""
        return len(self.heads)

    @classmethod
    def even(cls, cfg: GPTConfig, tp: int, vocab_parallel: bool = False) -> ShardMap:
        """Contiguous blocks, as even as possible (equal when ``tp`` divides both axes); with
        ``vocab_parallel`` the vocabulary too."""
        if not 1 <= tp <= cfg.n_head:
            raise ValueError(
                f"TP degree {tp} needs 1 <= tp <= n_head={cfg.n_head}: every rank must own at "
                "least one attention head. Use a smaller TP degree or a model with more heads."
            )
        ffn = 4 * cfg.n_embd
        heads, ffn_units = split_evenly(cfg.n_head, tp), split_evenly(ffn, tp)
        vocab = split_evenly(cfg.vocab_size, tp) if vocab_parallel else None
        return cls(heads, ffn_units, cfg.n_head, ffn, vocab, cfg.vocab_size if vocab else 0)

    def vocab_range(self, rank: int) -> tuple[int, int]:
        """The token ids [start, end) whose rows rank ``rank`` holds (vocabulary-parallel)."""
        if self.vocab is None:
            raise ValueError(
                "This shard map does not split the vocabulary (ShardMap.even(..., "
                "vocab_parallel=True))."
            )
        rows = self.vocab[rank]
        return rows[0], rows[-1] + 1

    @classmethod
    def from_units(
        cls, cfg: GPTConfig, heads: Sequence[Sequence[int]], ffn: Sequence[Sequence[int]]
    ) -> ShardMap:
        """A map with explicit units per rank, checked against ``cfg``."""
        return cls(tuple(map(tuple, heads)), tuple(map(tuple, ffn)), cfg.n_head, 4 * cfg.n_embd)

    def check_model(self, cfg: GPTConfig) -> None:
        """Raise ``ValueError`` if this map was made for another model's head or FFN count."""
        if self.vocab is not None and self.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"This shard map splits a vocabulary of {self.vocab_size}, the model has "
                f"{cfg.vocab_size}; build it from the same GPTConfig (ShardMap.even(cfg, tp, "
                "vocab_parallel=True))."
            )
        if (self.n_head, self.ffn_size) != (cfg.n_head, 4 * cfg.n_embd):
            raise ValueError(
                f"This shard map splits {self.n_head} heads and {self.ffn_size} FFN columns, "
                f"but the model has {cfg.n_head} heads and {4 * cfg.n_embd} FFN columns; build "
                "the map from the same GPTConfig (ShardMap.even(cfg, tp))."
            )

    def head_counts(self) -> list[int]:
        return [len(h) for h in self.heads]

    def ffn_counts(self) -> list[int]:
        return [len(f) for f in self.ffn]


def _check_cover(axis: str, units: Units, total: int) -> None:
    """Every unit in [0, total) owned by exactly one rank, and no rank empty."""
    empty = [r for r, u in enumerate(units) if not u]
    if empty:
        raise ValueError(
            f"TP rank(s) {empty} own no {axis}: every rank needs at least one. Use a smaller TP "
            "degree, or move units to those ranks."
        )
    counts = Counter(i for u in units for i in u)
    outside = sorted(i for i in counts if not 0 <= i < total)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(total)) - set(counts))
    problems = []
    if outside:
        problems.append(f"indices outside [0, {total}): {outside[:8]}")
    if duplicated:
        problems.append(f"owned by more than one rank: {duplicated[:8]}")
    if missing:
        problems.append(f"owned by no rank: {missing[:8]}")
    if problems:
        raise ValueError(
            f"Invalid shard map for the {axis}: " + "; ".join(problems) + ". Each of the "
            f"{total} {axis} must belong to exactly one rank."
        )


# ---- how a sharded parameter is laid out in units ----------------------------------------------
@dataclass(frozen=True)
class UnitSpec:
    """How one parameter of a TP layer is cut into units.

    axis: ``"heads"`` or ``"ffn"``: which ``ShardMap`` axis owns it.
    dim: the tensor dimension that is split (0: a column-parallel layer's output rows, and its
        bias; 1: a row-parallel layer's input columns).
    groups: blocks along ``dim`` that are each split by units: 3 for ``attn.qkv`` (all Q rows,
        then all K rows, then all V rows), else 1.
    width: elements per unit along ``dim`` within a group: ``head_dim`` for heads, 1 for FFN.

    A full tensor's index along ``dim`` for (group g, unit u, offset k) is
    ``g * total * width + u * width + k``; a shard holding units ``U`` stores, per group, the
    units of ``U`` in that order: ``g * len(U) * width + position_of_u * width + k``.
    """

    axis: str
    dim: int
    groups: int
    width: int


VOCAB_SPEC = UnitSpec("vocab", 0, 1, 1)  # tok_emb.weight under a vocabulary-parallel map


def unit_specs(cfg: GPTConfig) -> dict[str, UnitSpec]:
    """Per parameter name inside a ``Block``, its ``UnitSpec`` (parameters not listed are
    replicated on every TP rank: LayerNorms, the row-parallel layers' biases, embeddings)."""
    hs = cfg.head_dim
    return {
        "attn.qkv.weight": UnitSpec("heads", 0, 3, hs),
        "attn.qkv.bias": UnitSpec("heads", 0, 3, hs),
        "attn.proj.weight": UnitSpec("heads", 1, 1, hs),
        "mlp.fc.weight": UnitSpec("ffn", 0, 1, 1),
        "mlp.fc.bias": UnitSpec("ffn", 0, 1, 1),
        "mlp.proj.weight": UnitSpec("ffn", 1, 1, 1),
    }


def global_index(spec: UnitSpec, units: Sequence[int], total: int) -> torch.Tensor:
    """Indices into the full tensor (along ``spec.dim``) of a shard's elements, in shard order:
    ``full.index_select(spec.dim, global_index(...))`` is the shard."""
    u = torch.as_tensor(list(units), dtype=torch.long)
    k = torch.arange(spec.width)
    per_group = (u[:, None] * spec.width + k[None, :]).reshape(-1)  # (len(U) * width,)
    return torch.cat([g * total * spec.width + per_group for g in range(spec.groups)])


def split_by_unit(
    shard: torch.Tensor, spec: UnitSpec, units: Sequence[int]
) -> dict[int, torch.Tensor]:
    """A shard (holding ``units`` in order) cut into one piece per unit; each piece keeps the
    groups stacked along ``spec.dim`` (shape ``groups * width`` there)."""
    n = len(units)
    if shard.shape[spec.dim] != spec.groups * n * spec.width:
        raise ValueError(
            f"A shard of {n} units needs size {spec.groups * n * spec.width} along dim "
            f"{spec.dim}, got shape {tuple(shard.shape)}."
        )
    blocks = shard.split(n * spec.width, dim=spec.dim)  # one per group
    return {
        u: torch.cat([b.narrow(spec.dim, p * spec.width, spec.width) for b in blocks], spec.dim)
        for p, u in enumerate(units)
    }


def join_units(
    pieces: Mapping[int, torch.Tensor], spec: UnitSpec, units: Sequence[int]
) -> torch.Tensor:
    """The inverse of ``split_by_unit``: a shard holding ``units`` in that order."""
    missing = [u for u in units if u not in pieces]
    if missing:
        raise ValueError(f"No piece for units {missing[:8]}.")
    groups = [
        torch.cat([pieces[u].split(spec.width, dim=spec.dim)[g] for u in units], spec.dim)
        for g in range(spec.groups)
    ]
    return torch.cat(groups, spec.dim)


def rank_units(shard_map: ShardMap, spec: UnitSpec, rank: int) -> tuple[tuple[int, ...], int]:
    """The units of ``rank`` on ``spec``'s axis, and that axis's total."""
    if spec.axis == "heads":
        return shard_map.heads[rank], shard_map.n_head
    if spec.axis == "vocab" and shard_map.vocab is not None:
        return shard_map.vocab[rank], shard_map.vocab_size
    return shard_map.ffn[rank], shard_map.ffn_size


def param_spec(
    name: str, specs: Mapping[str, UnitSpec], shard_map: ShardMap | None = None
) -> UnitSpec | None:
    """The UnitSpec of a model parameter name ("blocks.3.attn.qkv.weight"), None if replicated
    (the token embedding is sharded when ``shard_map`` splits the vocabulary)."""
    if name == "tok_emb.weight" and shard_map is not None and shard_map.vocab is not None:
        return VOCAB_SPEC
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks":
        return specs.get(parts[2])
    return None
