"""tutorial_lib: the companion package of "Fast Transformer Training on Hopper".

Everything the book's notebooks run lives here; the notebooks import it and never redefine it.
"""

import os as _os

import torch as _torch

# Triton picks interpreter or compiled mode when a kernel (or its own library, e.g. tl.sum) is
# decorated, and torch.utils.flop_counter imports Triton's library as a side effect. So the choice
# for a machine without CUDA (kernels run in Triton's CPU interpreter) is made here, before this
# package imports anything that may import Triton, and nowhere else. An explicit TRITON_INTERPRET
# (0 or 1) is left alone. tutorial_lib/kernels/runtime.py copes with Triton imported before this
# package (it re-decorates Triton's library for the interpreter).
if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from . import tokenizer
from .build import build_model
from .config import MODEL_SIZES, PRESETS, GPTConfig, get_preset
from .data import (
    TokenData,
    make_data,
    preset_data,
    preset_tokenizer,
    synthetic_batch,
)
from .hardware import SPECS, describe_device
from .model import GPT
from .notebook import glue, setup_chapter
from .precision import get_policy
from .runs import run_training
from .train import TrainConfig, Trainer

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "GPTConfig",
    "MODEL_SIZES",
    "PRESETS",
    "get_preset",
    "tokenizer",
    "TokenData",
    "make_data",
    "preset_data",
    "preset_tokenizer",
    "synthetic_batch",
    "SPECS",
    "describe_device",
    "GPT",
    "setup_chapter",
    "glue",
    "build_model",
    "get_policy",
    "Trainer",
    "TrainConfig",
    "run_training",
]
