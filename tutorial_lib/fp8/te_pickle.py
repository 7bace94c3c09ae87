"""Read the one kind of Transformer Engine ``_extra_state`` pickle that holds nothing to restore,
without running it.

TE 2.9 pickles a module's extra state whenever the module ran in FP8, whatever its recipe
(``get_extra_state``, ``pytorch/module/base.py``): ``{"recipe": <recipe>, "extra_fp8_variables":
{...plain values...}}``, plus the scales and amax histories only for delayed scaling. TE 2.20
saves an empty tensor for a stateless recipe instead. So a TE 2.9 checkpoint of a run under
current, block, MXFP8 or NVFP4 scaling holds a pickle with no state in it, and refusing it (as
``checkpoint.load_model_state_dict`` refuses every pickle) would block a resume for nothing.

``read_te_pickle(data)`` unpickles with an allow-list: only the recipe module's own classes
(``transformer_engine.common.recipe``: the recipes, ``Format``, ``_FormatHelper``, ``QParams``,
``MMParams``), and each of them is replaced by an inert stand-in that only stores fields; any
other global (``os.system``, torch's tensor rebuilders, ...) raises ``pickle.UnpicklingError``
before it is looked up. ``stateless_te_pickle(data)`` is the recipe's class name when the
pickle is such a stateless state, else None.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

__all__ = ["RECIPE_MODULE", "STATELESS_TE_RECIPES", "read_te_pickle", "stateless_te_pickle"]

RECIPE_MODULE = "transformer_engine.common.recipe"
STATELESS_TE_RECIPES = (
    "Float8CurrentScaling",
    "Float8BlockScaling",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
)
_PLAIN = (*STATELESS_TE_RECIPES, "DelayedScaling", "QParams", "MMParams")
# TE's Format members by their _FormatHelper value (max_fwd, max_bwd); TE 2.9 and 2.20 agree
_FORMATS = {(6, 6): "E2M1", (448, 448): "E4M3", (57344, 57344): "E5M2", (448, 57344): "HYBRID"}


class _Fields:
    """Stand-in for a pickled TE dataclass: its fields, nothing else."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({vars(self)})"


class _FormatHelper(tuple[float, ...]):
    def __new__(cls, *values: float) -> _FormatHelper:
        return tuple.__new__(cls, values)


def _format(value: tuple[float, ...]) -> str:
    name = _FORMATS.get(tuple(value))  # type: ignore[arg-type]
    if name is None:
        raise pickle.UnpicklingError(f"Unknown TE Format value {tuple(value)}.")
    return name


_STANDINS: dict[str, Any] = {name: type(name, (_Fields,), {}) for name in _PLAIN}
_STANDINS.update({"_FormatHelper": _FormatHelper, "Format": _format})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == RECIPE_MODULE and name in _STANDINS:
            return _STANDINS[name]
        raise pickle.UnpicklingError(
            f"refused global {module}.{name}: only TE's recipe classes may appear in a "
            "stateless TE extra state"
        )


def read_te_pickle(data: torch.Tensor | bytes) -> dict[str, Any]:
    """The content of a TE ``_extra_state`` pickle, with TE's recipe classes as inert stand-ins
    (``type(content["recipe"]).__name__`` is TE's class name). Raises ``pickle.UnpicklingError``
    for any other global, so nothing outside the allow-list is imported or called."""
    raw = bytes(data.detach().cpu().numpy().tobytes()) if isinstance(data, torch.Tensor) else data
    content = _Unpickler(io.BytesIO(raw)).load()
    if not isinstance(content, dict):
        raise pickle.UnpicklingError(f"a TE extra state is a dict, got {type(content).__name__}")
    return content


def stateless_te_pickle(data: torch.Tensor | bytes) -> str | None:
    """The recipe's class name if ``data`` is TE's pickled extra state of a stateless recipe
    (the recipe and plain values, nothing to restore); None for anything else, a pickle that
    needs a refused global included (a delayed-scaling state holds tensors)."""
    try:
        content = read_te_pickle(data)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None
    name = type(content.get("recipe")).__name__
    extra = content.get("extra_fp8_variables", {})
    plain = all(isinstance(v, (bool, int, float, str, tuple, list)) for v in extra.values())
    if name in STATELESS_TE_RECIPES and set(content) <= {"recipe", "extra_fp8_variables"}:
        return name if plain else None
    return None
