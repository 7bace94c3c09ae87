"""Tests for tutorial_lib.kernels: every Triton kernel against a float64 PyTorch reference.

Without a GPU the kernels run in Triton's interpreter (``runtime`` switches it on), which costs
milliseconds per program, so the big (1823, 781) shape appears only where it matters: forward
in float32 and bfloat16, and one gradient test. Odd shapes (5 x 123 x 123, 3 x 17, 1 x 1) and
forced small tiles exercise the masked edges and the tails of the reductions.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from tutorial_lib.kernels import layernorm as layernorm_module
from tutorial_lib.kernels import runtime
from tutorial_lib.kernels.bias_gelu import (
    bias_gelu,
    bias_gelu_backward,
    bias_gelu_forward,
    bias_gelu_reference,
)
from tutorial_lib.kernels.cross_entropy import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_forward,
    cross_entropy_reference,
)
from tutorial_lib.kernels.layernorm import (
    add_layer_norm,
    add_layer_norm_forward,
    add_layer_norm_reference,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    layer_norm_reference,
)
from tutorial_lib.kernels.runtime import interpreter_mode, triton_status
from tutorial_lib.kernels.softmax import (
    softmax,
    softmax_backward,
    softmax_forward,
    softmax_reference,
)
from tutorial_lib.kernels.traffic import (
    add_layer_norm_bytes,
    add_layer_norm_unfused_bytes,
    bias_gelu_bytes,
    bias_gelu_unfused_bytes,
    cross_entropy_bytes,
    cross_entropy_unfused_bytes,
    layer_norm_bytes,
    softmax_bytes,
)

Tensor = torch.Tensor
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_mode() else "cpu"

# Tolerances, relative to the largest magnitude in the expected tensor (rtol) plus an absolute
# floor (atol, also scaled by that magnitude, so sums over many rows are judged fairly).
# - float32: the kernels round to float32 after each of a few operations (2**-24 ~ 6e-8
#   each) and reduce over at most ~1000 terms, so 1e-5 leaves a wide margin yet would catch
#   any real mistake (a missing term is an O(1e-2) error).
# - bfloat16: outputs are rounded to 8 significant bits. Round-to-nearest is within half an
#   ulp (2**-8 ~ 3.9e-3 relative), but Triton's CPU interpreter truncates when it converts
#   float32 to bfloat16, which costs up to one ulp (2**-7 ~ 7.8e-3); 1.6e-2 is two ulps.
# - float16: 11 significant bits, half an ulp is 2**-11 ~ 4.9e-4 (NumPy rounds to nearest
#   in the interpreter, as the GPU does); 2e-3 is four half-ulps.
TOL = {F32: (1e-5, 1e-5), BF16: (1.6e-2, 1e-2), F16: (2e-3, 1e-3)}


def assert_close(actual: Tensor, expected: Tensor, dtype: torch.dtype) -> None:
    """``actual`` (any dtype) against a float64 ``expected`` with the tolerance of ``dtype``."""
    rtol, atol = TOL[dtype]
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol * scale)


def leaf(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """A fresh leaf copy of ``t`` (optionally cast) that records gradients."""
    return t.detach().to(dtype or t.dtype).clone().requires_grad_(True)


def randn(*shape: int, dtype: torch.dtype = F32, scale: float = 1.0, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


# ---------------------------------------------------------------------------------------------
# One description per kernel: build its inputs, run the Triton version and the reference.


@dataclass(frozen=True)
class Case:
    """``inputs(shape, dtype)`` -> tensors; ``ours`` / ``ref`` map them to a tuple of outputs."""

    inputs: Callable[[tuple[int, ...], torch.dtype], list[Tensor]]
    ours: Callable[..., tuple[Tensor, ...]]
    ref: Callable[..., tuple[Tensor, ...]]


def _x_and_params(shape: tuple[int, ...], dtype: torch.dtype) -> list[Tensor]:
    n = shape[-1]
    return [randn(*shape, dtype=dtype), randn(n, seed=1), randn(n, seed=2)]


CASES = {
    "bias_gelu": Case(
        lambda shape, dt: [randn(*shape, dtype=dt, scale=2), randn(shape[-1], dtype=dt, seed=1)],
        lambda x, b: (bias_gelu(x, b),),
        lambda x, b: (bias_gelu_reference(x, b),),
    ),
    "layer_norm": Case(
        _x_and_params,
        lambda x, w, b: (layer_norm(x, w, b),),
        lambda x, w, b: (layer_norm_reference(x, w, b),),
    ),
    "add_layer_norm": Case(
        lambda shape, dt: [randn(*shape, dtype=dt, seed=3)] + _x_and_params(shape, dt),
        lambda r, x, w, b: add_layer_norm(x, r, w, b),
        lambda r, x, w, b: add_layer_norm_reference(x, r, w, b),
    ),
    "softmax": Case(
        lambda shape, dt: [randn(*shape, dtype=dt, scale=4)],
        lambda x: (softmax(x),),
        lambda x: (softmax_reference(x),),
    ),
}

SMALL_SHAPES = [(1, 1), (3, 17), (5, 123, 123)]


FORWARD_CASES = [(shape, dt) for shape in SMALL_SHAPES for dt in (F32, BF16, F16)] + [
    ((1823, 781), F32),
    ((1823, 781), BF16),
]


@pytest.mark.parametrize("shape, dtype", FORWARD_CASES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_float64_reference(name: str, shape: tuple[int, ...], dtype) -> None:
    _check_forward(name, shape, dtype)


def _check_forward(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    case = CASES[name]
    inputs = case.inputs(shape, dtype)
    outs = case.ours(*inputs)
    refs = case.ref(*[t.double() for t in inputs])
    for out, ref in zip(outs, refs, strict=True):
        assert out.dtype == dtype and out.shape == shape
        assert_close(out, ref, dtype)


GRAD_CASES = [(n, shape, dt) for n in CASES for shape in SMALL_SHAPES[1:] for dt in (F32, BF16)]


@pytest.mark.parametrize(
    "name, shape, dtype", [*GRAD_CASES, ("layer_norm", (1823, 781), F32)], ids=str
)
def test_gradients_match_reference_autograd(name: str, shape: tuple[int, ...], dtype) -> None:
    _check_gradients(name, shape, dtype)


def _check_gradients(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    case = CASES[name]
    inputs = case.inputs(shape, dtype)
    ours_in = [leaf(t) for t in inputs]
    ref_in = [leaf(t, F64) for t in inputs]
    outs, refs = case.ours(*ours_in), case.ref(*ref_in)
    # A random weighting of every output, so no gradient term can cancel by symmetry.
    weights = [randn(*o.shape, seed=10 + i) for i, o in enumerate(outs)]
    sum((o.float() * w).sum() for o, w in zip(outs, weights, strict=True)).backward()
    sum((r * w.double()).sum() for r, w in zip(refs, weights, strict=True)).backward()
    for mine, theirs in zip(ours_in, ref_in, strict=True):
        assert mine.grad is not None and mine.grad.dtype == mine.dtype
        assert_close(mine.grad, theirs.grad, dtype)  # dy itself was rounded to dtype


# ---------------------------------------------------------------------------------------------
# LayerNorm specifics: parameter combinations, the two-stage reduction, fused residual, autocast


@pytest.mark.parametrize("has_weight, has_bias", [(True, False), (False, True), (False, False)])
def test_layer_norm_optional_parameters(has_weight: bool, has_bias: bool) -> None:
    x, w, b = _x_and_params((7, 33), F32)
    w, b = (w if has_weight else None), (b if has_bias else None)
    xs, ws, bs = leaf(x), *(leaf(t) if t is not None else None for t in (w, b))
    xr, wr, br = leaf(x, F64), *(leaf(t, F64) if t is not None else None for t in (w, b))
    dy = randn(7, 33, seed=5)
    layer_norm(xs, ws, bs).backward(dy)
    layer_norm_reference(xr, wr, br).backward(dy.double())
    for mine, theirs in [(xs, xr), (ws, wr), (bs, br)]:
        if mine is not None:
            assert_close(mine.grad, theirs.grad, F32)


@pytest.mark.parametrize(
    "rows, block_m, programs", [(37, 2, 3), (37, 4, 64), (1, 1, 1), (64, 8, 8)]
)
def test_layer_norm_weight_grads_reduce_over_programs(
    rows: int, block_m: int, programs: int
) -> None:
    """Odd row counts, several row tiles per program, more programs than tiles: the partial
    sums and the second-stage reduction must still add every row exactly once."""
    x, w, b = _x_and_params((rows, 45), F32)
    dy = randn(rows, 45, seed=7)
    y, mean, rstd = layer_norm_forward(x, w, b, block_m=block_m)
    dx, dw, db = layer_norm_backward(
        dy, x, w, mean, rstd, bias=b, block_m=block_m, num_programs=programs
    )
    xr, wr, br = leaf(x, F64), leaf(w, F64), leaf(b, F64)
    layer_norm_reference(xr, wr, br).backward(dy.double())
    assert_close(y, layer_norm_reference(x.double(), w.double(), b.double()), F32)
    for mine, theirs in [(dx, xr.grad), (dw, wr.grad), (db, br.grad)]:
        assert_close(mine, theirs, F32)


def test_add_layer_norm_mixed_dtypes_both_outputs_used() -> None:
    """float32 x + bfloat16 residual -> float32 s and y; each input gets its own dtype back."""
    x, w, b = _x_and_params((37, 45), F32)
    r = randn(37, 45, dtype=BF16, seed=3)
    xs, rs, ws, bs = (leaf(t) for t in (x, r, w, b))
    xr, rr, wr, br = (leaf(t, F64) for t in (x, r, w, b))
    s, y = add_layer_norm(xs, rs, ws, bs)
    assert s.dtype == y.dtype == F32
    sr, yr = add_layer_norm_reference(xr, rr, wr, br)
    assert_close(s, sr, F32)
    assert_close(y, yr, F32)
    a, c = randn(37, 45, seed=8), randn(37, 45, seed=9)
    ((s * a).sum() + (y * c).sum()).backward()
    ((sr * a.double()).sum() + (yr * c.double()).sum()).backward()
    assert rs.grad is not None and rs.grad.dtype == BF16
    assert_close(xs.grad, xr.grad, F32)
    assert_close(rs.grad, rr.grad, BF16)  # the float32 gradient, rounded to the residual's dtype
    assert_close(ws.grad, wr.grad, F32)
    assert_close(bs.grad, br.grad, F32)


@pytest.mark.parametrize("use", ["s", "y"])
def test_add_layer_norm_one_output_used(use: str) -> None:
    x, w, b = _x_and_params((6, 20), F32)
    r = randn(6, 20, seed=3)
    ours, refs = [leaf(t) for t in (x, r, w, b)], [leaf(t, F64) for t in (x, r, w, b)]
    index = 0 if use == "s" else 1
    add_layer_norm(*ours[:2], *ours[2:])[index].sum().backward()
    add_layer_norm_reference(*refs[:2], *refs[2:])[index].sum().backward()
    for mine, theirs in zip(ours, refs, strict=True):
        if theirs.grad is None:  # s alone does not reach the LayerNorm parameters
            assert mine.grad is None or not mine.grad.any()
        else:
            assert_close(mine.grad, theirs.grad, F32)


def test_layer_norm_under_autocast_keeps_weight_dtype() -> None:
    x = randn(9, 40, dtype=BF16)
    w, b = leaf(randn(40, seed=1)), leaf(randn(40, seed=2))
    with torch.autocast(DEVICE, dtype=BF16):
        y = layer_norm(leaf(x), w, b)
    assert y.dtype == BF16
    y.float().sum().backward()
    assert w.grad is not None and w.grad.dtype == F32 and b.grad is not None
    assert_close(y, layer_norm_reference(x.double(), w.double(), b.double()), BF16)


# ---------------------------------------------------------------------------------------------
# Launchers write every element of their outputs: with torch.empty handing out NaN-filled
# buffers, no NaN may come back.


@pytest.fixture
def nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.empty`` (which the launchers allocate with) returns floating buffers full of NaN."""
    empty = torch.empty

    def poisoned(*args: object, **kwargs: object) -> Tensor:
        t = empty(*args, **kwargs)  # type: ignore[call-overload]
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def _assert_filled(out: Tensor, expected: Tensor) -> None:
    assert not out.isnan().any(), "the kernel left elements of the output buffer unwritten"
    assert_close(out, expected, F32)


@pytest.mark.usefixtures("nan_empty")
def test_every_output_element_is_written_bias_gelu() -> None:
    x, b, dy = randn(37, 45), randn(45, seed=1), randn(37, 45, seed=2)
    y = bias_gelu_forward(x, b, block_m=4)
    dx, db = bias_gelu_backward(dy, x, b, block_m=4)
    assert db is not None
    xr, br = leaf(x, F64), leaf(b, F64)
    bias_gelu_reference(xr, br).backward(dy.double())
    _assert_filled(y, bias_gelu_reference(x.double(), b.double()))
    _assert_filled(dx, xr.grad)
    _assert_filled(db, br.grad)


@pytest.mark.usefixtures("nan_empty")
def test_every_output_element_is_written_layer_norm_and_add() -> None:
    x, w, b = _x_and_params((37, 45), F32)
    r, dy, ds = randn(37, 45, seed=3), randn(37, 45, seed=4), randn(37, 45, seed=5)
    y, mean, rstd = layer_norm_forward(x, w, b, block_m=4)
    dx, dw, _ = layer_norm_backward(dy, x, w, mean, rstd, bias=b, ds=ds, block_m=4)
    xr, wr = leaf(x, F64), leaf(w, F64)
    layer_norm_reference(xr, wr, b.double()).backward(dy.double())
    _assert_filled(y, layer_norm_reference(x.double(), w.double(), b.double()))
    _assert_filled(dx, xr.grad + ds.double())  # the extra incoming gradient is added
    _assert_filled(dw, wr.grad)

    s, y, _, _ = add_layer_norm_forward(x, r, w, b, block_m=4)
    sr, yr = add_layer_norm_reference(x.double(), r.double(), w.double(), b.double())
    _assert_filled(s, sr)
    _assert_filled(y, yr)


@pytest.mark.usefixtures("nan_empty")
def test_every_output_element_is_written_softmax() -> None:
    x, dy = randn(37, 45, scale=3), randn(37, 45, seed=1)
    y = softmax_forward(x, block_m=4)
    dx = softmax_backward(dy, y, block_m=4)
    xr = leaf(x, F64)
    softmax_reference(xr).backward(dy.double())
    _assert_filled(y, softmax_reference(x.double()))
    _assert_filled(dx, xr.grad)


@pytest.mark.usefixtures("nan_empty")
def test_every_output_element_is_written_cross_entropy() -> None:
    logits, targets = randn(37, 300, scale=3), _targets(37, 300, ignore_every=5)
    loss, lse, rows, n_valid = cross_entropy_forward(logits, targets, block_v=64, block_m=4)
    dx = cross_entropy_backward(
        torch.tensor(1.0, device=DEVICE), logits, targets, lse, n_valid, block_v=64, block_m=4
    )
    lr = leaf(logits, F64)
    F.cross_entropy(lr, targets).backward()
    _assert_filled(lse, torch.logsumexp(logits.double(), dim=-1))
    _assert_filled(rows, F.cross_entropy(logits.double(), targets, reduction="none"))
    _assert_filled(dx, lr.grad)
    assert n_valid.item() == (targets != -100).sum().item()


# ---------------------------------------------------------------------------------------------
# Cross-entropy


def _targets(m: int, v: int, ignore_every: int = 0, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, v, (m,), generator=g)
    if ignore_every:
        t[::ignore_every] = -100
    return t.to(DEVICE)


@pytest.mark.parametrize(
    "m, v, block_v, dtype",
    [
        (1823, 781, None, F32),
        (1823, 781, None, BF16),
        (97, 5000, 1024, F32),
        (97, 5000, 1000, BF16),
        (3, 17, 4, F32),
        (1, 1, None, F32),
    ],
    ids=str,
)
def test_cross_entropy_matches_torch(m: int, v: int, block_v: int | None, dtype) -> None:
    """Against F.cross_entropy in float64, with ignored rows; block_v < V makes the online
    logsumexp run over several chunks (1000 is rounded up to a power of two, 1024)."""
    ignore_every = 7 if m > 7 else 0  # keep a valid row in the tiny cases
    logits, targets = randn(m, v, dtype=dtype, scale=3), _targets(m, v, ignore_every)
    loss, lse, _, _ = cross_entropy_forward(logits, targets, block_v=block_v)
    expected = F.cross_entropy(logits.double(), targets)
    assert loss.dtype == F32 and loss.dim() == 0
    assert_close(loss, expected, F32)  # math in float32 whatever the logits' dtype
    assert_close(lse, torch.logsumexp(logits.double(), dim=-1), F32)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_cross_entropy_gradient(dtype: torch.dtype) -> None:
    logits, targets = randn(61, 300, dtype=dtype, scale=3), _targets(61, 300, ignore_every=4)
    mine, ref = leaf(logits), leaf(logits, F64)
    (2.5 * cross_entropy(mine, targets)).backward()
    (2.5 * F.cross_entropy(ref, targets)).backward()
    assert mine.grad is not None and mine.grad.dtype == dtype
    assert not mine.grad[::4].any(), "ignored rows must get zero gradient"
    assert_close(mine.grad, ref.grad, dtype)


def test_cross_entropy_is_stable_for_large_logits() -> None:
    """Logits of +-80: exp(80) ~ 5e34 overflows bfloat16's and float16's range, and a naive
    sum of such terms overflows float32 too; the running max keeps every exponent <= 0."""
    logits = torch.where(randn(40, 2000) > 0, 80.0, -80.0) + randn(40, 2000, seed=1)
    targets = _targets(40, 2000, ignore_every=9)
    for dtype in (F32, BF16):
        mine, ref = leaf(logits, dtype), leaf(logits.to(dtype), F64)
        loss, lse, _, _ = cross_entropy_forward(mine.detach(), targets, block_v=256)
        assert torch.isfinite(lse).all()
        assert_close(loss, F.cross_entropy(ref.detach(), targets), F32)
        cross_entropy(mine, targets).backward()
        F.cross_entropy(ref, targets).backward()
        assert mine.grad is not None and torch.isfinite(mine.grad).all()
        assert_close(mine.grad, ref.grad, dtype)


def test_cross_entropy_with_a_chunk_of_only_minus_inf() -> None:
    """A row whose first vocabulary chunk is all -inf (masked logits): the running max is still
    -inf after that chunk, and rescaling by exp(-inf - -inf) would turn the sum into NaN."""
    logits = randn(3, 37)
    logits[0, :16] = -float("inf")  # row 0's first chunk of 16 (block_v below)
    logits[1, 20:] = -float("inf")  # row 1's later chunks
    targets = torch.tensor([20, 3, 7])
    loss, lse, _, _ = cross_entropy_forward(logits, targets, block_v=16)
    assert_close(lse, torch.logsumexp(logits.double(), dim=-1).float(), F32)
    assert_close(loss, F.cross_entropy(logits.double(), targets).float(), F32)


def test_cross_entropy_all_rows_ignored_gives_zero() -> None:
    logits = leaf(randn(4, 10))
    loss = cross_entropy(logits, torch.full((4,), -100, device=DEVICE))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None and not logits.grad.any()
    all_ignored = torch.full((4,), -100, device=DEVICE)
    assert cross_entropy_reference(logits.detach(), all_ignored).item() == 0.0


def test_cross_entropy_custom_ignore_index() -> None:
    logits, targets = randn(9, 12), _targets(9, 12)
    targets[2] = 7
    expected = F.cross_entropy(logits.double(), targets, ignore_index=7)
    assert_close(cross_entropy(logits, targets, ignore_index=7), expected, F32)


@pytest.mark.parametrize(
    "targets, error, match",
    [
        (torch.tensor([0, 1, 10]), ValueError, r"target 10 is outside \[0, 10\)"),
        (torch.tensor([0, -1, 2]), ValueError, r"target -1 .* not ignore_index \(-100\)"),
        (torch.tensor([[0, 1, 2]]), ValueError, r"shape \(3,\)"),
        (torch.tensor([0.0, 1.0, 2.0]), TypeError, "integer class ids"),
    ],
    ids=["too-big", "negative", "shape", "float"],
)
def test_cross_entropy_rejects_bad_targets(targets: Tensor, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        cross_entropy(randn(3, 10), targets.to(DEVICE))


# ---------------------------------------------------------------------------------------------
# Softmax specifics


def test_softmax_is_stable_for_large_values() -> None:
    x = randn(6, 300, scale=1e4)  # exp(1e4) overflows everything; max-subtraction saves it
    x[0, :] = 3e4
    x[1, 5] = -float("inf")  # a masked-out position (as in attention) gets probability 0
    y = softmax_forward(x)
    assert torch.isfinite(y).all() and y[1, 5] == 0
    assert_close(y, softmax_reference(x.double()), F32)
    assert_close(y[0], torch.full((300,), 1 / 300, dtype=F64), F32)


# ---------------------------------------------------------------------------------------------
# Rows wider than one tile: LayerNorm walks them in chunks, in two passes (wide_rows.py);
# softmax refuses them. Few rows each: the interpreter's cost grows with programs and chunks.

ROW_WISE = ["layer_norm", "add_layer_norm"]
CAP = runtime.MAX_ROW_BLOCK


def test_row_block_is_one_tile_up_to_the_cap_then_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CAP == 4096
    assert runtime.row_block(1) == (1, False)
    assert runtime.row_block(CAP - 1) == (CAP, False) and runtime.row_block(CAP) == (CAP, False)
    assert runtime.row_block(CAP + 1) == (CAP, True)
    assert runtime.row_block(10**6) == (CAP, True)  # no upper limit on the width any more
    monkeypatch.setattr(runtime, "MAX_ROW_BLOCK", 64)  # read at every call
    assert runtime.row_block(200) == (64, True) and runtime.row_block(64) == (64, False)


# Just below the cap (one tile, padded to 4096) and just above (4096 + 1: a last chunk of one
# column), odd row counts; forward and gradients against float64.
WIDE = [((3, CAP - 1), F32), ((3, CAP + 1), F32), ((5, CAP + 1), BF16)]


@pytest.mark.parametrize("shape, dtype", WIDE, ids=str)
@pytest.mark.parametrize("name", ROW_WISE)
def test_rows_around_the_cap_match_float64_reference(
    name: str, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    _check_forward(name, shape, dtype)
    _check_gradients(name, shape, dtype)


SMALL_CAP = 32  # a lowered cap: many chunks per row at interpreter-friendly widths
SMALL_CAP_CASES = [
    ((7, SMALL_CAP - 1), F32),  # one tile
    ((7, SMALL_CAP + 1), F32),  # two chunks, the last of one column
    ((1, 3, 3 * SMALL_CAP + 5), F32),  # 3-D, four chunks, ragged last chunk
    ((1, 3, 3 * SMALL_CAP + 5), BF16),
    ((3, 2 * SMALL_CAP + 7), F16),
]


@pytest.mark.parametrize("shape, dtype", SMALL_CAP_CASES, ids=str)
@pytest.mark.parametrize("name", ROW_WISE)
def test_chunked_kernels_with_a_lowered_cap(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "MAX_ROW_BLOCK", SMALL_CAP)  # read at every launch
    _check_forward(name, shape, dtype)
    if dtype != F16:
        _check_gradients(name, shape, dtype)


def test_softmax_refuses_rows_wider_than_one_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "MAX_ROW_BLOCK", SMALL_CAP)
    x = randn(3, SMALL_CAP)
    assert_close(softmax(x), softmax_reference(x.double()), F32)
    with pytest.raises(ValueError, match=f"rows of at most {SMALL_CAP} values"):
        softmax(randn(3, SMALL_CAP + 1))


class _LaunchSpy:
    """Stands in for a kernel: records that it was launched, then launches the real one."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
        self.launches += 1
        return self.kernel[grid]  # type: ignore[index]


@pytest.mark.parametrize("width, chunked", [(SMALL_CAP, False), (SMALL_CAP + 1, True)])
def test_the_launchers_pick_the_chunked_kernels_only_above_the_cap(
    width: int, chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tutorial_lib.kernels import wide_rows

    monkeypatch.setattr(runtime, "MAX_ROW_BLOCK", SMALL_CAP)
    spies = {}
    for module, name in [
        (layernorm_module, "layer_norm_fwd_chunked_kernel"),
        (wide_rows, "layer_norm_bwd_row_means_kernel"),
        (wide_rows, "layer_norm_bwd_chunked_kernel"),
    ]:
        spies[name] = _LaunchSpy(getattr(module, name))
        monkeypatch.setattr(module, name, spies[name])
    x, w, b = _x_and_params((3, width), F32)
    y, mean, rstd = layer_norm_forward(x, w, b)
    layer_norm_backward(randn(3, width, seed=5), x, w, mean, rstd, bias=b)
    assert {name: spy.launches for name, spy in spies.items()} == dict.fromkeys(spies, int(chunked))


def test_chunked_layer_norm_keeps_precision_when_the_mean_is_large() -> None:
    """Rows of 300 + N(0, 1): float32 sum(x^2) / N - mean^2 loses about 2% of the variance to
    cancellation here (measured); merging each chunk's centred sum of squares (Chan et al.)
    keeps rstd as accurate as the one-tile kernel's, to float32 rounding."""
    x = randn(3, CAP + 1) + 300.0
    y, mean, rstd = layer_norm_forward(x, None, None)
    x64 = x.double()
    rstd64 = 1 / torch.sqrt(x64.var(-1, unbiased=False) + 1e-5)
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-6, atol=0)
    torch.testing.assert_close(mean.double(), x64.mean(-1), rtol=1e-6, atol=0)
    # x - mean is rounded where float32's spacing is 2**-15 ~ 3e-5 (values near 300)
    ref = layer_norm_reference(x64, None, None)
    torch.testing.assert_close(y.double(), ref, rtol=0, atol=1e-4)


def test_non_contiguous_inputs_are_made_contiguous() -> None:
    x = randn(45, 37).t()  # (37, 45), last dim strided
    assert not x.is_contiguous()
    assert_close(softmax(x), softmax_reference(x.double()), F32)
    assert_close(bias_gelu(x, None), bias_gelu_reference(x.double()), F32)


# ---------------------------------------------------------------------------------------------
# Runtime: where the kernels run and what they refuse


def test_triton_status_reports_interpreter_on_cpu() -> None:
    available, reason = triton_status()
    assert available, reason
    if not torch.cuda.is_available():
        assert interpreter_mode() and "interpreter" in reason and "CPU" in reason


def test_float64_input_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match=r"got torch.float64; cast with .float\(\)"):
        layer_norm(torch.zeros(2, 3, dtype=F64, device=DEVICE), None, None)


def test_wrong_parameter_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        layer_norm(randn(2, 8), randn(7), None)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        bias_gelu(randn(2, 8), randn(9))


def test_missing_triton_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_TRITON_IMPORT_ERROR", "ModuleNotFoundError: no 'triton'")
    assert triton_status() == (
        False,
        "triton is not installed (ModuleNotFoundError: no 'triton'): pip install triton",
    )
    with pytest.raises(RuntimeError, match="pip install triton"):
        softmax(randn(2, 3))


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "interpreter_mode", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"need CUDA tensors.*\.cuda\(\)"):
        softmax(torch.zeros(2, 3))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
        softmax(torch.zeros(2, 3))


def test_package_imports_without_triton() -> None:
    """With triton unimportable, the kernel modules still import and fail only when called."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from tutorial_lib.kernels import softmax, triton_status\n"
        "ok, reason = triton_status(); assert not ok and 'pip install triton' in reason\n"
        "try:\n    softmax(torch.zeros(2, 3))\n"
        "except RuntimeError as e:\n    assert 'pip install triton' in str(e); print('clear')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and "clear" in result.stdout, result.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter set-up")
@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("0", "0"), ("1", "1")])
def test_import_chooses_the_interpreter_without_cuda(given: str | None, expected: str) -> None:
    """``import tutorial_lib`` sets TRITON_INTERPRET=1 before Triton is imported, and leaves an
    explicit setting alone; importing the kernels afterwards changes nothing."""
    code = (
        "import os, sys\n"
        "import tutorial_lib\n"
        "assert 'triton' not in sys.modules or 'TRITON_INTERPRET' in os.environ\n"
        "first = os.environ['TRITON_INTERPRET']\n"
        "import tutorial_lib.kernels\n"
        "print(first, os.environ['TRITON_INTERPRET'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if given is not None:
        env["TRITON_INTERPRET"] = given
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [expected, expected]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter set-up")
def test_interpreter_works_when_triton_was_imported_first() -> None:
    """``tl.sum`` and friends were decorated before TRITON_INTERPRET was set; runtime must
    re-decorate them, or every kernel that reduces fails in the interpreter."""
    code = (
        "import triton.language as tl, torch\n"
        "from tutorial_lib.kernels import softmax\n"
        "x = torch.randn(3, 10)\n"
        "assert torch.allclose(softmax(x), torch.softmax(x, -1), atol=1e-6); print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_kernel_sources_are_printable() -> None:
    """The book prints kernels with inspect.getsource; the jit wrapper keeps the function."""
    kernel = layernorm_module.layer_norm_fwd_kernel
    source = inspect.getsource(kernel.fn)
    assert source.lstrip().startswith("@triton.jit") and "tl.load" in source


# ---------------------------------------------------------------------------------------------
# HBM traffic, counted by hand for M = 4 rows, N = 8 columns (V = 10)


def test_traffic_counts_by_hand() -> None:
    M, N, V = 4, 8, 10
    # bias+GELU bf16: x 32 + bias 8 + y 32 elements, 2 bytes each.
    assert bias_gelu_bytes(M, N, BF16) == (32 + 8 + 32) * 2
    assert bias_gelu_bytes(M, N, BF16, backward=True) == (32 + 32 + 8 + 32 + 8) * 2  # dy x b dx db
    assert bias_gelu_unfused_bytes(M, N, BF16) == (32 + 8 + 32 + 32 + 32) * 2  # add, then GELU
    assert bias_gelu_unfused_bytes(M, N, BF16, backward=True) == (3 * 32 + 32 + 8) * 2
    # LayerNorm bf16 activations, fp32 weight and bias, fp32 mean and rstd.
    assert layer_norm_bytes(M, N, BF16) == (32 + 32) * 2 + (8 + 8) * 4 + (4 + 4) * 4
    assert layer_norm_bytes(M, N, BF16, backward=True) == 3 * 32 * 2 + 8 * 4 + 8 * 4 + 16 * 4
    assert add_layer_norm_bytes(M, N, BF16) == 4 * 32 * 2 + 16 * 4 + 8 * 4
    assert add_layer_norm_bytes(M, N, BF16, backward=True) == 4 * 32 * 2 + 8 * 4 + 8 * 4 + 16 * 4
    assert add_layer_norm_unfused_bytes(M, N, BF16) == 3 * 32 * 2 + layer_norm_bytes(M, N, BF16)
    assert softmax_bytes(M, N, F32) == 2 * 32 * 4
    assert softmax_bytes(M, N, F32, backward=True) == 3 * 32 * 4
    # Cross-entropy bf16 logits (40 elements), int64 targets, fp32 lse and loss.
    assert cross_entropy_bytes(M, V, BF16) == 40 * 2 + 4 * 8 + 8 * 4
    assert cross_entropy_bytes(M, V, BF16, backward=True) == 80 * 2 + 4 * 8 + 4 * 4
    # Eager: bf16 -> fp32 copy (40*2 + 40*4), log_softmax (40*4 in, 40*4 out), NLL gather.
    assert cross_entropy_unfused_bytes(M, V, BF16) == 240 + 320 + 4 * 8 + 4 * 4
    assert cross_entropy_unfused_bytes(M, V, F32) == 320 + 4 * 8 + 4 * 4  # no cast needed
    assert cross_entropy_unfused_bytes(M, V, BF16, backward=True) == 32 + 160 + 480 + 240


def test_layer_norm_frozen_parameters_get_no_grad() -> None:
    x, w, b = _x_and_params((5, 24), F32)
    xs, xr = leaf(x), leaf(x, F64)
    dy = randn(5, 24, seed=6)
    layer_norm(xs, w, b).backward(dy)  # w and b do not require grad
    layer_norm_reference(xr, w.double(), b.double()).backward(dy.double())
    assert w.grad is None and b.grad is None
    assert_close(xs.grad, xr.grad, F32)
