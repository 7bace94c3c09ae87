"""FP8 training, from the formats up: E4M3/E5M2, scaled quantization, and TE's delayed scaling.

Modules: ``formats`` (the formats, ``quantize``/``dequantize``), ``scaling`` (the
``DelayedScaling`` recipe, its per-module state and update rule, amax reduction). Each module
lists its public names in ``__all__``; this package re-exports them and concatenates the lists,
so a new module is one import and one ``__all__`` entry away.
"""

from __future__ import annotations

from . import formats, scaling
from .formats import *  # noqa: F403 (names listed in formats.__all__)
from .scaling import *  # noqa: F403 (names listed in scaling.__all__)

__all__ = [*formats.__all__, *scaling.__all__]
