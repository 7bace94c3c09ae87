"""Our Triton FlashAttention (``kernels.attention``), in the interpreter on a CPU: forward and
backward against the naive attention in float64 and against PyTorch's
``scaled_dot_product_attention``, on odd lengths and head sizes; what it keeps for
the backward; and ``perf.tensor_peak_bytes``, which the chapter's memory figure uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tutorial_lib.kernels.attention import attention_reference, flash_attention
from tutorial_lib.perf import tensor_peak_bytes

# (B, H, T, D): T = 1, odd, one past a block of 64, several blocks; D not a power of two too
SHAPES = [(1, 2, 1, 16), (2, 2, 17, 16), (1, 3, 65, 24), (1, 1, 150, 32)]
# largest error relative to the reference's largest value: FP32 is held to 1e-5 against SDPA
# (the bar), BF16 and FP16 to two of their ulps at 1 (the output's rounding, one more
# for P rounded before P V; the interpreter truncates to BF16 where a GPU rounds)
REL = {torch.float32: 1e-5, torch.bfloat16: 2 * 2.0**-7, torch.float16: 2 * 2.0**-10}


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype).requires_grad_() for _ in range(3)]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    err = (got.detach().double() - want.detach()).abs().max()
    return float(err / want.detach().abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_float64_and_sdpa_in_float32(shape: tuple[int, ...]) -> None:
    q, k, v = _inputs(shape, torch.float32, seed=sum(shape))
    do = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    out = flash_attention(q, k, v)  # T = 150: blocks of 64, 64 and 22
    out.backward(do)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*ref_in)
    ref.backward(do.double())
    sdpa = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    assert _rel(out, ref.detach()) < REL[torch.float32]
    assert float((out.detach() - sdpa).abs().max()) <= 1e-5
    for name, t, r in zip("qkv", (q, k, v), ref_in, strict=True):
        assert t.grad is not None and r.grad is not None
        assert float((t.grad.double() - r.grad).abs().max()) <= 1e-5, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_within_two_ulps(dtype: torch.dtype) -> None:
    q, k, v = _inputs((1, 2, 45, 24), dtype, seed=3)
    do = torch.randn(1, 2, 45, 24, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = flash_attention(q, k, v)
    out.backward(do)
    assert out.dtype == dtype and q.grad is not None and q.grad.dtype == dtype
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*ref_in)
    ref.backward(do.double())
    assert _rel(out, ref.detach()) < REL[dtype]
    for t, r in zip((q, k, v), ref_in, strict=True):
        assert t.grad is not None and r.grad is not None
        assert _rel(t.grad, r.grad) < 2 * REL[dtype]  # through two more roundings of P and dS


def test_it_keeps_o_and_the_logsumexp_not_the_scores() -> None:
    """What autograd holds for the backward: q, k, v, O and one float32 per query row; the
    naive attention holds (T, T) matrices."""
    T, D = 64, 16
    q, k, v = _inputs((1, 1, T, D), torch.float32, seed=5)
    saved: list[torch.Size] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        flash_attention(q, k, v)
    assert sorted(saved) == sorted([torch.Size([1, 1, T, D])] * 4 + [torch.Size([1, 1, T])])
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        attention_reference(q, k, v)
    assert torch.Size([1, 1, T, T]) in saved


def test_bad_inputs_name_the_problem() -> None:
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"same shape \(B, H, T, D\)"):
        flash_attention(q, q[:, :, :4], q)
    with pytest.raises(TypeError, match="dtypes differ"):
        flash_attention(q, q.half(), q)
    with pytest.raises(ValueError, match="head dim 300"):
        wide = torch.randn(1, 1, 4, 300)
        flash_attention(wide, wide, wide)


def test_tensor_peak_bytes_counts_live_storages() -> None:
    """Two 1 MiB temporaries alive at once, then freed, then one 3 MiB result: peak 3 MiB; a
    view adds nothing; what autograd saves stays counted until the backward frees it."""
    mib = 2**20 // 4  # float32 elements in 1 MiB

    def temporaries() -> None:
        a = torch.ones(mib)
        b = a * 2
        c = b[: mib // 2]  # a view of b: no new storage
        del a, b, c
        torch.zeros(3 * mib)

    assert tensor_peak_bytes(temporaries) == 3 * 2**20
    x = torch.randn(mib, requires_grad=True)

    def saved_for_backward() -> None:
        y = x.exp()  # exp saves its result for the backward: 1 MiB kept
        z = y * 3  # 1 MiB more
        del y
        z.sum().backward()  # the gradients: 1 MiB each, while exp's result is still held

    assert tensor_peak_bytes(saved_for_backward) >= 3 * 2**20


def test_attention_memory_grows_as_t_squared_only_when_naive() -> None:
    from tutorial_lib.bench.attention_bench import attention_memory

    rows = attention_memory([64, 128, 256], heads=2, head_dim=16, max_len={"ours (Triton)": 128})
    peak = {(r["kind"], r["seq"]): r["peak_bytes"] for r in rows}
    assert (("ours (Triton)", 256)) not in peak  # max_len
    assert peak["naive", 256] / peak["naive", 128] > 3.5  # (T, T) matrices: x4 per doubling
    assert peak["sdpa", 256] / peak["sdpa", 128] < 2.5  # O, logsumexp, gradients: x2
    assert peak["ours (Triton)", 128] / peak["ours (Triton)", 64] < 2.5


def test_sdpa_backend_rows_time_what_runs_and_say_why_not() -> None:
    from tutorial_lib.bench.attention_bench import sdpa_backend_rows

    rows = {r["backend"]: r for r in sdpa_backend_rows(1, 2, 64, 16, torch.float32, "cpu", 1)}
    assert set(rows) == {"math", "memory-efficient", "flash", "cuDNN", "ours (Triton)"}
    assert rows["math"]["time_ms"] > 0 and rows["math"]["tflops"] > 0  # runs everywhere
    for name in ("memory-efficient", "cuDNN"):  # CUDA-only kernels
        assert "CUDA GPUs only" in rows[name]["skipped"]
    assert "interpreter" in rows["ours (Triton)"]["skipped"]
