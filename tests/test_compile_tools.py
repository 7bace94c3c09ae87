"""Tests for ``kernels.compile``: graph breaks from Dynamo's own records, generated code and
kernel counts, and the eager op count they are compared with."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from tutorial_lib.kernels.compile import (
    count_eager_ops,
    count_graph_breaks,
    count_kernels,
    generated_code,
    kernel_excerpt,
    kernel_names,
    short_break_reason,
)


def _bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b, approximate="tanh")


def test_count_kernels_reads_definitions_launches_and_library_calls() -> None:
    code = """
cpp_fused_add_gelu_0 = async_compile.cpp_pybinding(['float*'], '''...''')
def call(args):
        assert_size_stride(primals_1, (4, 4), (4, 1), 'torch.ops.aten.mm.default')
        cpp_fused_add_gelu_0(buf0, buf1)
        extern_kernels.addmm(b, x, w, alpha=1, beta=1, out=buf2)
        cpp_fused_add_gelu_0(buf2, buf3)
        buf4 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)
        extern_kernels.mm(buf2, w2, out=buf3)
"""
    assert count_kernels(code) == {"generated": 1, "launches": 2, "library": 3}
    gpu = """
triton_poi_fused_mul_1 = async_compile.triton('triton_poi_fused_mul_1', '''...''')
        triton_poi_fused_mul_1.run(buf0, buf1, 16, stream=stream0)
"""
    assert count_kernels([code, gpu]) == {"generated": 2, "launches": 3, "library": 3}


def test_eager_counts_two_ops_where_compile_generates_one_kernel() -> None:
    x, b = torch.randn(37, 53), torch.randn(53)
    ops = count_eager_ops(_bias_gelu, x, b)
    assert ops == {"aten.add": 1, "aten.gelu": 1}
    code = generated_code(torch.compile(_bias_gelu, dynamic=False), x, b)
    assert count_kernels(code) == {"generated": 1, "launches": 1, "library": 0}  # add + GELU


def test_kernel_names_and_excerpt() -> None:
    code = """
cpp_fused_mul_0 = async_compile.cpp_pybinding(['float*'], '''
#include "prefix.h"
extern "C" void kernel(float* out) { out[0] = 2; }
''')
cpp_fused_add_gelu_1 = async_compile.cpp_pybinding(['float*'], '''
#include "prefix.h"
extern "C" void kernel(float* out) { out[0] = gelu(out[0]); }
''')
def call(args):
        assert_size_stride(a, (4,), (1,), 'torch.ops.aten.mm.default')
        extern_kernels.mm(a, b, out=buf0)
        cpp_fused_add_gelu_1(buf0, buf1)
"""
    assert kernel_names(code) == ["cpp_fused_mul_0", "cpp_fused_add_gelu_1"]
    text = kernel_excerpt(code)
    assert text.startswith('extern "C" void kernel(float* out) { out[0] = gelu(out[0]); }')
    assert text.endswith("extern_kernels.mm(a, b, out=buf0)\ncpp_fused_add_gelu_1(buf0, buf1)")
    assert "assert_size_stride" not in text and "#include" not in text
    assert "out[0] = 2" in kernel_excerpt(code, name_contains="mul")
    with pytest.raises(ValueError, match="No generated kernel"):
        kernel_excerpt("def call(args): pass")


def test_eager_op_count_excludes_views() -> None:
    ops = count_eager_ops(lambda t: t.view(-1).t().sum(), torch.randn(3, 4))
    assert ops == {"aten.sum": 1}


def _one_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x)
    print("a known graph break")  # Dynamo cannot trace print: a graph break
    return torch.cos(y)


def _break_in_loop(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = x + 1
        torch._dynamo.graph_break()
    return x


@pytest.mark.parametrize(
    ("fn", "breaks", "graphs", "skipped"),
    [
        (lambda x: torch.cos(torch.sin(x)), 0, 1, 0),
        (_one_break, 1, 2, 0),
        (_break_in_loop, 0, 0, 1),  # Dynamo gives up on the frame: it runs eagerly
    ],
)
def test_count_graph_breaks(
    fn: Callable[[torch.Tensor], torch.Tensor], breaks: int, graphs: int, skipped: int
) -> None:
    torch._dynamo.reset()
    with count_graph_breaks() as counted:
        torch.compile(fn, backend="eager")(torch.randn(8))  # Dynamo only: fast
    assert (counted.breaks, counted.graphs, counted.skipped_frames) == (breaks, graphs, skipped)
    assert sum(counted.reasons.values()) == sum(counted.sites.values()) == breaks
    if breaks:
        ((reason, n),) = counted.reasons.items()
        assert n == 1 and "print" in reason.lower()
        ((site, _),) = counted.sites.items()
        assert site.startswith("test_compile_tools.py:") and 'print("a known graph break"' in site
    if skipped:  # the nested reason once, not again on its own
        ((reason, n),) = counted.skip_reasons.items()
        assert n == 1 and "graph_break()" in reason and " -> graph break in loop" in reason
    # Compiled already, guards hold: nothing compiles, nothing is counted.
    with count_graph_breaks() as again:
        torch.compile(fn, backend="eager")(torch.randn(8))
    assert (again.breaks, again.graphs) == (0, 0)


def test_short_break_reason_is_one_line_without_addresses() -> None:
    text = (
        "Skip inlining `torch.compiler.disable()`d function\n"
        "  Explanation: Skip inlining function <function f at 0x7f66a3e160> since it was "
        "wrapped\n  Hint: Remove it\n\n*** While handling this graph break, another graph "
        "break occurred: ***\n\ngraph break in loop\n  Explanation: Skipping the frame.\n"
    )
    assert short_break_reason(text) == (
        "Skip inlining `torch.compiler.disable()`d function: Skip inlining function "
        "<function f> since it was wrapped -> graph break in loop: Skipping the frame."
    )
