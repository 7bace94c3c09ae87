"""Swapping a model's ``nn.Linear`` layers for ``FP8Linear``: which layers, the shape rule, and
the swap itself (``convert_to_fp8``), for every recipe of ``fp8.recipes``."""

from __future__ import annotations

from torch import nn

from .ddp import exclude_fp8_from_ddp
from .linear import FP8_SHAPE_RULE, FP8Linear, weight_problems

__all__ = ["convert_to_fp8", "convertible_linears", "fp8_layer_problems"]


def convertible_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The ``nn.Linear`` layers an FP8 backend swaps: not a weight tied to another module (the
    GPT's LM head is the token embedding) and not a module named ``lm_head``."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    shared = {pid for pid, n in counts.items() if n > 1}
    return [
        (name, m)
        for name, m in model.named_modules()
        if type(m) is nn.Linear
        and id(m.weight) not in shared
        and name.rsplit(".", 1)[-1] != "lm_head"
    ]


def fp8_layer_problems(model: nn.Module) -> list[str]:
    """``"name: in -> out (why)"`` for every Linear ``convert_to_fp8`` would swap but whose weight
    breaks TE's shape rule (``FP8_SHAPE_RULE``: in_features % 16, out_features % 8)."""
    return [
        f"{name}: {m.in_features} -> {m.out_features} ({'; '.join(problems)})"
        for name, m in convertible_linears(model)
        if (problems := weight_problems(m.in_features, m.out_features))
    ]


def convert_to_fp8(
    model: nn.Module,
    emulate: bool | None = None,
    amax_history_len: int = 1024,
    recipe: object = None,
) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` (in place) for an ``FP8Linear``; returns ``model``.

    The new layers hold the old Parameter objects (no copy; ties stay tied). Not swapped:
    embeddings, subclasses of nn.Linear, and a Linear whose weight is shared or that is named
    ``lm_head`` (the GPT's tied head is ``F.linear`` on the embedding, so it is never a module).
    All layers with illegal shapes are listed in one ValueError.
    A module with a ``to_fp8(**kwargs)`` method (a tensor-parallel layer) is replaced by what
    it returns: its own FP8 variant, whose local shapes meet the rule at its first FP8 forward.
    ``recipe`` (optional): the recipe the model will train with; one that rounds stochastically
    (NVFP4) gives each layer its seeded generator now, so checkpoints hold it from step 0.
    The FP8 buffers go on ``model``'s DDP ignore list (``fp8.ddp``), so ``DDP(model)`` keeps
    each rank's scaling state; ranks share amaxes through the autocast's amax reduction.
    """
    targets: list[tuple[str, nn.Module]] = list(convertible_linears(model))
    targets += [  # layers that know their FP8 variant (the tensor-parallel ones: parallel.tp_fp8)
        (name, m)
        for name, m in model.named_modules()
        if callable(getattr(m, "to_fp8", None)) and not isinstance(m, FP8Linear)
    ]
    problems = fp8_layer_problems(model)
    if problems:
        raise ValueError(
            f"convert_to_fp8: {FP8_SHAPE_RULE}, so a Linear's in_features must be a multiple "
            "of 16 and its out_features a multiple of 8; these layers break it: "
            + "; ".join(problems)
            + ". Choose widths that are multiples of 16 (e.g. n_embd 32, 64, 128) or pad."
        )
    kwargs = {"emulate": emulate, "amax_history_len": amax_history_len}
    stochastic = bool(getattr(recipe, "uses_stochastic_rounding", False))
    swaps: list[tuple[str, FP8Linear]] = []
    for name, old in targets:
        to_fp8 = getattr(old, "to_fp8", None)
        new = to_fp8(**kwargs) if callable(to_fp8) else FP8Linear.from_linear(old, **kwargs)
        if to_fp8 is not None and (bad := weight_problems(new.in_features, new.out_features)):
            problems.append(
                f"{name}: {new.in_features} -> {new.out_features} on this rank ({'; '.join(bad)})"
            )
        swaps.append((name, new))
    if problems:  # a tensor-parallel layer's local shapes break the rule
        raise ValueError(
            f"convert_to_fp8: {FP8_SHAPE_RULE}; these tensor-parallel shards break it: "
            + "; ".join(problems)
            + ". Choose a TP degree that leaves each rank multiples of 16 features, or a wider model."
        )
    for name, new in swaps:
        new.fp8_name = name
        if stochastic:
            new.sr_generator(new.weight.device)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    exclude_fp8_from_ddp(model)  # DDP(model) must not broadcast rank 0's FP8 state (fp8.ddp)
    return model
