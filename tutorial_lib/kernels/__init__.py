"""Triton kernels for the memory-bound parts of a transformer step, with everything to check them.

Each kernel module holds, in reading order: a plain-PyTorch ``*_reference`` (the definition the
tests compare against), the ``@triton.jit`` kernels, the launchers ``*_forward`` /
``*_backward`` (which take optional preallocated outputs), a ``torch.autograd.Function`` and the
user-facing function:

===================  =========================================================================
module               user-facing functions
===================  =========================================================================
``bias_gelu``        ``bias_gelu(x, bias)``: GELU (tanh) of ``x + bias`` in one pass
``layernorm``        ``layer_norm(x, w, b, eps)``; ``add_layer_norm(x, residual, w, b, eps)``
                     returning ``(x + residual, LayerNorm(x + residual))`` from one kernel
``softmax``          ``softmax(x)`` over the last dim
``cross_entropy``    ``cross_entropy(logits, targets, ignore_index)``: online logsumexp, the
                     softmax never written to memory
``traffic``          the minimum HBM bytes of each kernel, and achieved bandwidth
``wide_rows``        the two-pass chunked kernels that LayerNorm and softmax take for rows
                     wider than ``runtime.MAX_ROW_BLOCK`` (4096)
``runtime``          where kernels run, ``triton_status()``, tile sizes, input checks
``fused``            ``TritonLayers`` (a layer factory: ``AddNormBlock``, ``BiasGELUMLP``)
``compile``          ``torch.compile`` with compile time, graph breaks and kernel counts;
                     ``count_graph_breaks()`` around any code that compiles
===================  =========================================================================

Without a CUDA device, importing this package switches on Triton's interpreter
(``TRITON_INTERPRET=1``, see :mod:`tutorial_lib.kernels.runtime`): the same kernels run on the
CPU through NumPy, correct but slow, which is how the tests and the ``ci`` preset run them.
"""

from __future__ import annotations

from .attention import attention_reference, flash_attention, flash_attention_forward
from .bias_gelu import bias_gelu, bias_gelu_backward, bias_gelu_forward, bias_gelu_reference
from .compile import (
    CompileReport,
    GraphBreaks,
    compile_model,
    count_eager_ops,
    count_graph_breaks,
    count_kernels,
    generated_code,
    kernel_excerpt,
    kernel_names,
    measure_compile,
)
from .cross_entropy import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_forward,
    cross_entropy_reference,
)
from .fused import (
    AddNormBlock,
    BiasGELUMLP,
    TritonCrossEntropy,
    TritonGELU,
    TritonLayerNorm,
    TritonLayers,
)
from .layernorm import (
    add_layer_norm,
    add_layer_norm_forward,
    add_layer_norm_reference,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    layer_norm_reference,
)
from .runtime import check_kernel_inputs, interpreter_mode, triton_status
from .softmax import softmax, softmax_backward, softmax_forward, softmax_reference
from .traffic import (
    achieved_bandwidth,
    add_layer_norm_bytes,
    add_layer_norm_unfused_bytes,
    bandwidth_fraction,
    bias_gelu_bytes,
    bias_gelu_unfused_bytes,
    cross_entropy_bytes,
    cross_entropy_unfused_bytes,
    layer_norm_bytes,
    softmax_bytes,
)

__all__ = [
    # kernels
    "bias_gelu",
    "layer_norm",
    "add_layer_norm",
    "softmax",
    "cross_entropy",
    "flash_attention",
    # references
    "attention_reference",
    "bias_gelu_reference",
    "layer_norm_reference",
    "add_layer_norm_reference",
    "softmax_reference",
    "cross_entropy_reference",
    # launchers
    "bias_gelu_forward",
    "bias_gelu_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "add_layer_norm_forward",
    "softmax_forward",
    "softmax_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "flash_attention_forward",
    # runtime
    "triton_status",
    "interpreter_mode",
    "check_kernel_inputs",
    # traffic
    "bias_gelu_bytes",
    "bias_gelu_unfused_bytes",
    "layer_norm_bytes",
    "add_layer_norm_bytes",
    "add_layer_norm_unfused_bytes",
    "softmax_bytes",
    "cross_entropy_bytes",
    "cross_entropy_unfused_bytes",
    "achieved_bandwidth",
    "bandwidth_fraction",
    # the GPT on these kernels
    "TritonLayers",
    "TritonLayerNorm",
    "TritonGELU",
    "TritonCrossEntropy",
    "AddNormBlock",
    "BiasGELUMLP",
    # torch.compile
    "compile_model",
    "measure_compile",
    "CompileReport",
    "count_graph_breaks",
    "GraphBreaks",
    "generated_code",
    "count_kernels",
    "count_eager_ops",
    "kernel_names",
    "kernel_excerpt",
]
