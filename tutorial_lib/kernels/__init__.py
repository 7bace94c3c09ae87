"""Triton kernels for the memory-bound parts of a transformer step, with everything to check them.

Each kernel module holds, in reading order: a plain-PyTorch ``*_reference`` (the definition the
tests compare against), the ``@triton.jit`` kernels, the launchers ``*_forward`` /
``*_backward``, a ``torch.autograd.Function`` and the user-facing function. The package
re-exports the names the book and the benchmarks call; the rest live in the modules:

===================  =========================================================================
module               user-facing functions
===================  =========================================================================
``bias_gelu``        ``bias_gelu(x, bias)``: GELU (tanh) of ``x + bias`` in one pass
``layernorm``        ``layer_norm(x, w, b, eps)``; ``add_layer_norm(x, residual, w, b, eps)``
                     returning ``(x + residual, LayerNorm(x + residual))`` from one kernel
``softmax``          ``softmax(x)`` over the last dim
``cross_entropy``    ``cross_entropy(logits, targets, ignore_index)``: online logsumexp, the
                     softmax never written to memory
``traffic``          the minimum HBM bytes of each kernel
``wide_rows``        the two-pass chunked kernels that LayerNorm takes for rows wider than
                     ``runtime.MAX_ROW_BLOCK`` (4096)
``runtime``          where kernels run, ``triton_status()``, tile sizes, input checks
``fused``            ``TritonLayers`` (a layer factory: ``AddNormBlock``, ``BiasGELUMLP``)
``compile``          what ``torch.compile`` produced: graph breaks (``count_graph_breaks()``
                     around any code that compiles), generated code and kernel counts
===================  =========================================================================

Without a CUDA device, importing this package switches on Triton's interpreter
(``TRITON_INTERPRET=1``, see :mod:`tutorial_lib.kernels.runtime`): the same kernels run on the
CPU through NumPy, correct but slow, which is how the tests and the ``ci`` preset run them.
"""

from __future__ import annotations

from .attention import flash_attention
from .bias_gelu import bias_gelu, bias_gelu_reference
from .cross_entropy import cross_entropy, cross_entropy_forward, cross_entropy_reference
from .fused import TritonLayers
from .layernorm import (
    add_layer_norm,
    add_layer_norm_reference,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
)
from .runtime import triton_status
from .softmax import softmax, softmax_reference

__all__ = [
    # kernels
    "bias_gelu",
    "layer_norm",
    "add_layer_norm",
    "softmax",
    "cross_entropy",
    "flash_attention",
    # references
    "bias_gelu_reference",
    "add_layer_norm_reference",
    "softmax_reference",
    "cross_entropy_reference",
    # launchers
    "layer_norm_forward",
    "layer_norm_backward",
    "cross_entropy_forward",
    # runtime
    "triton_status",
    # the GPT on these kernels
    "TritonLayers",
]
