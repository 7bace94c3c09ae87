"""Hopper's FP8 tensor-core accumulation, emulated: ``mma_accumulate`` and ``mma_block_scaled``.

An H100 does not sum the products of an FP8 GEMM the way IEEE float32 does. Its tensor cores,
as cuBLASLt's sm_90 FP8 kernels drive them (the older ``mma.sync`` instruction differs), add a
dot product's products 32 at a time, and each of those steps works in fixed point:

    one step: 32 products p_i = a_i * b_i (exact) and the running sum c (a float32 value)
      1. each product gets the exponent e(a_i) + e(b_i), where e(x) = floor(log2 |x|) and a
         subnormal counts as the format's smallest normal exponent (E4M3 -6, E5M2 -14); zero
         products take no part;
      2. E, the largest of those exponents and c's own, is where the step aligns its terms;
      3. every product, and c, is cut to a multiple of 2^(E - 13): the bits more than 13 places
         below 2^E fall off the adder (truncated toward zero, not rounded);
      4. the cut terms add exactly, and the sum keeps 14 significant bits (it is truncated to
         13 fraction bits of its own exponent); a zero comes out as +0.
    fast accumulation (``fast_accum=True``; TE's forward GEMM): one chain of such steps over
      all of K, each step's result the next one's c (K is padded with zeros, which change
      nothing);
    split accumulation (``fast_accum=False``, cuBLASLt's default; TE's dgrad and wgrad): a new
      chain from zero every 128 elements of K (four steps; DeepSeek-V3: four WGMMAs), and the
      chains' results added into a float32 accumulator in K order, each addition rounded to
      nearest.

So a long fast sum keeps about 14 bits, whatever the products: small products sink below the
alignment point of a large running sum. DeepSeek-V3 (arXiv 2412.19437, section 3.3.2) measured
close to 2% maximum relative error at K = 4096 and promotes every 128 elements for that reason.
The block-scaled GEMM of their recipe (``Float8BlockScaling``, 128-element tiles along K, each
with a float32 scale) promotes at the same points: ``mma_block_scaled`` multiplies each 128-wide
tile's chain by the two operands' tile scales and adds it into float32, in K order.

Sources: Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores" (PeerJ
CS 2021: alignment to the largest exponent and truncation inside the tensor cores); Khattak and
Mikaitis, "Accurate Models of NVIDIA Tensor Cores" (ACM TACO 2026, arXiv 2512.07004: bit-exact
models of the H100's MMA); mmaemu 0.1.0 (the GEMM level of cuBLASLt 12.8 on an H100 PCIe, checked
there bit for bit). ``tests/test_fp8_mma.py`` checks ``mma_accumulate`` against mmaemu bit for bit.

Not modelled here:
    cuBLASLt's split-K: for some shapes cuBLASLt cuts K over several thread blocks and adds
        their results in an order of its own; these functions compute an unsplit GEMM.
    the H200 and the H100 SXM at the GEMM level: the same sm_90 tensor cores, but the recorded
        evidence is an H100 PCIe's, and cuBLASLt may choose other kernels or splits elsewhere.
    the epilogue: scales, bias and the rounding to the output dtype are the caller's
        (``fp8.gemm``).
    row-wise scales: torch runs them on sm_90 through a CUTLASS kernel, not cuBLASLt; the
        package applies this model there too (the same tensor cores, the scales multiplying
        the result), without a GPU check of that kernel's promotion points.
    the block recipe's kernel: ``mma_block_scaled`` follows DeepSeek-V3's description (tile
        results scaled on the CUDA cores and added in float32); cuBLAS's blockwise kernel has
        not been checked bit for bit against it. With power-of-two scales (the recipe's
        default) the scaling is exact, so only the order of the float32 additions matters.

How it is computed: each step's largest product exponent for every output at once by a float64
matmul (of 2^(8 e) per element, whose block sums pin the largest term), then the step's products
materialized for a tile of outputs, divided by the grid and truncated (exact: powers of two), and
summed (integers below 2^21: exact in float32). Vectorized over outputs and, under split
accumulation, over the 128-element chains: only the steps of one chain loop in Python. Tiles
keep temporaries within ``TILE_PRODUCTS`` float32 values. It reads and writes each product a few
times where a float32 matmul reads each operand once: on the book's 2-core CPU a GEMM of the
``ci`` model costs 8 to 15 float32 matmuls, and a ``ci`` training step 4 to 9 exact-emulation
steps (``benchmarks/fp8_accumulation.py`` records it).
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "PROMOTION", "TILE_PRODUCTS", "mma_accumulate", "mma_block_scaled"]

BLOCK = 32  # products one tensor-core step adds
PROMOTION = 128  # elements of K per chain under split accumulation (and per block-recipe tile)
KEPT_BITS = 13  # fraction bits below the alignment point, and of each step's result
TILE_PRODUCTS = 1 << 21  # products held at once (8 MB of float32)
_MIN_EXP = {torch.float8_e4m3fn: -6, torch.float8_e5m2: -14}  # subnormals align here
_GROUP_BLOCKS = 4  # blocks whose alignment grids are computed together (one matmul)
_CANONICAL_NAN = 0x7FFFFFFF


def mma_accumulate(a: torch.Tensor, b: torch.Tensor, *, fast_accum: bool) -> torch.Tensor:
    """The float32 accumulator an H100 computes for ``a @ b^T`` (module docstring).

    ``a`` (M, K) and ``b`` (N, K): ``float8_e4m3fn`` or ``float8_e5m2``, mixed allowed. Returns
    float32 (M, N), before any scale: ``fast_accum=True`` is one tensor-core chain over K,
    ``False`` promotes to float32 every 128 elements (cuBLASLt without fast accumulation). An
    unsplit GEMM (no cuBLASLt split-K), without bias or row-wise scales, as an H100 PCIe's
    cuBLASLt 12.8 computes it (the H200's GEMM level is not modelled). Where the IEEE sum of an
    output's products is not finite (a NaN or infinite operand), the output is that value, NaN
    as 0x7FFFFFFF."""
    _check(a, b)
    chain = _padded(a.shape[1], BLOCK) if fast_accum else PROMOTION
    return _accumulate(a, b, chain, None)


def mma_block_scaled(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor
) -> torch.Tensor:
    """``a @ b^T`` with one float32 scale per row and 128-wide tile of K, as Hopper runs the
    block recipe's GEMMs: each tile's tensor-core chain (module docstring), times
    ``a_scales[m, t] * b_scales[n, t]``, added into a float32 accumulator in K order.

    ``a`` (M, K), ``b`` (N, K) FP8; ``a_scales`` (M, ceil(K / 128)), ``b_scales`` (N, ...).
    Returns float32 (M, N)."""
    _check(a, b)
    tiles = -(-a.shape[1] // PROMOTION)
    for name, x, s in (("a", a, a_scales), ("b", b, b_scales)):
        if tuple(s.shape) != (x.shape[0], tiles):
            raise ValueError(
                f"mma_block_scaled: {name}_scales must be ({x.shape[0]}, {tiles}), one per row "
                f"and 128-wide tile of K = {x.shape[1]}; got {tuple(s.shape)}."
            )
    return _accumulate(a, b, PROMOTION, (a_scales.float(), b_scales.float()))


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    for name, x in (("a", a), ("b", b)):
        if x.dtype not in _MIN_EXP or x.dim() != 2:
            raise TypeError(
                f"mma: {name} must be a 2-D float8_e4m3fn or float8_e5m2 tensor, got a "
                f"{x.dim()}-D {x.dtype} one."
            )
    if a.shape[1] != b.shape[1] or a.device != b.device:
        raise ValueError(
            f"mma: a {tuple(a.shape)} on {a.device} and b {tuple(b.shape)} on {b.device} need "
            "the same K (their last dimension) and the same device."
        )


def _padded(k: int, multiple: int) -> int:
    return max(multiple, -(-k // multiple) * multiple)


def _accumulate(
    a: torch.Tensor,
    b: torch.Tensor,
    chain: int,
    scales: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """Chains of ``chain`` elements over K, combined in float32 in K order: added (split
    accumulation), scaled and added (``scales``, per row and chain), or the one chain (fast)."""
    (m, k), n = a.shape, b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    if m == 0 or n == 0 or k == 0:
        return out
    width = _padded(k, chain)
    chains, steps = width // chain, chain // BLOCK
    a_vals, a_weights = _operand(a, width, chains, steps, left=True)
    b_vals, b_weights = _operand(b, width, chains, steps, left=False)
    tile_m, tile_n = _tile_shape(m, n, chains)
    for m0 in range(0, m, tile_m):
        rows = slice(m0, m0 + tile_m)
        for n0 in range(0, n, tile_n):
            cols = slice(n0, n0 + tile_n)
            parts = _chains(
                a_vals[..., rows], b_vals[..., cols], a_weights[:, rows], b_weights[..., cols]
            )
            if scales is None and chains == 1:  # fast accumulation: the one chain
                out[rows, cols] = parts[0]
                continue
            total = out[rows, cols]  # +0
            for q in range(chains):  # float32 additions, rounded to nearest, in K order
                if scales is None:
                    total = total + parts[q]
                else:
                    total = total + parts[q] * (scales[0][rows, q, None] * scales[1][cols, q])
            out[rows, cols] = total
    return _non_finite(out, a, b)


def _operand(
    x: torch.Tensor, width: int, chains: int, steps: int, left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """An operand (rows, K) as the chains read it, zero-padded to ``width`` along K: its values
    as float32 (chains, steps, 32, rows), NaN and infinity as zeros (``_non_finite`` handles
    them); and each element's float64 weight 2^(8 e(x)) (0 for a zero), whose sums over a block
    give the step's largest exponent (``_step_grids``): (blocks, rows, 32) for the ``left``
    operand of that matmul, (blocks, 32, rows) for the right one."""
    values, weights = _code_table(x.dtype, x.device)
    codes = torch.nn.functional.pad(x.view(torch.uint8), (0, width - x.shape[1])).long()
    blocks = codes.reshape(x.shape[0], -1, BLOCK)
    by_block = blocks.permute(1, 0, 2) if left else blocks.permute(1, 2, 0)
    by_step = codes.reshape(x.shape[0], chains, steps, BLOCK).permute(1, 2, 3, 0)
    return torch.take(values, by_step), torch.take(weights, by_block)  # contiguous


_TABLES: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _code_table(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For the 256 codes of an FP8 format: the value as float32 (NaN and infinity as 0) and
    the weight 2^(8 e(x)) as float64 (0 for a zero), e(x) at least the format's ``_MIN_EXP``."""
    key = (dtype, device)
    if key not in _TABLES:
        values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        values = torch.where(torch.isfinite(values), values, 0.0)
        exponent = (torch.frexp(values).exponent - 1).clamp_min(_MIN_EXP[dtype])
        weights = torch.where(values != 0, _pow2_64(8 * exponent), 0.0)
        _TABLES[key] = values.to(device), weights.to(device)
    return _TABLES[key]


def _tile_shape(m: int, n: int, chains: int) -> tuple[int, int]:
    """Output tile (rows, columns) whose per-step products stay within ``TILE_PRODUCTS``."""
    budget = max(1, TILE_PRODUCTS // (chains * BLOCK))
    tile_n = min(n, max(1, budget // min(m, budget)))
    return min(m, max(1, budget // tile_n)), tile_n


def _chains(
    a: torch.Tensor, b: torch.Tensor, a_weights: torch.Tensor, b_weights: torch.Tensor
) -> torch.Tensor:
    """Every chain's result for one output tile: float32 (chains, tm, tn), each chain run from
    +0 over its steps (module docstring). ``a`` (chains, steps, 32, tm) and ``b`` (chains,
    steps, 32, tn) hold the values; ``a_weights`` (blocks, tm, 32) and ``b_weights`` (blocks,
    32, tn) the exponent weights, block = chain * steps + step."""
    chains, steps, _, tm = a.shape
    tn = b.shape[-1]
    c = torch.zeros(chains, tm, tn, dtype=torch.float32, device=a.device)
    terms = torch.empty(chains, BLOCK, tm, tn, dtype=torch.float32, device=a.device)
    group = steps if chains > 1 else min(steps, _GROUP_BLOCKS)  # contiguous runs of blocks
    for s in range(steps):
        if s % group == 0:  # the alignment grids of the products of the next steps
            first, last = (0, chains * steps) if chains > 1 else (s, s + group)
            grids = _step_grids(a_weights[first:last], b_weights[first:last])
            grids = grids.view(chains, -1, tm, tn)
        c_grid = (c.view(torch.int32) & 0x7F800000).view(torch.float32) * 2.0**-KEPT_BITS
        grid = torch.maximum(grids[:, s % group], c_grid)  # 2^(E - 13), E from products or c
        torch.mul(a[:, s, :, :, None], b[:, s, :, None, :], out=terms)  # exact products
        torch.div(terms, grid[:, None], rounding_mode="trunc", out=terms)  # cut to the grid
        total = terms.sum(1).add_(torch.div(c, grid, rounding_mode="trunc"))  # ints < 2^21
        total.mul_(grid).view(torch.int32).bitwise_and_(-(1 << (23 - KEPT_BITS)))  # 14 bits
        c = total
    return c  # a zero is +0: only x + (-x) makes one (the largest product survives its cut)


def _step_grids(a_weights: torch.Tensor, b_weights: torch.Tensor) -> torch.Tensor:
    """2^(E_p - 13) as float32 (blocks, tm, tn), E_p the largest product exponent of each
    block, by a matmul: the block's sum of 2^(8 e) lies in [2^(8 E_p), 32 * 2^(8 E_p)] (exact
    bounds: float64 holds these powers, and adding positive terms never falls below the largest),
    so E_p is floor(log2(sum) / 8). A block without a nonzero product gets 2^-100."""
    biased = torch.bmm(a_weights, b_weights).view(torch.int64).bitwise_right_shift_(52)
    top = biased.to(torch.int32).sub_(1023).bitwise_right_shift_(3)  # floor(log2(sum) / 8)
    top.clamp_min_(KEPT_BITS - 100).add_(127 - KEPT_BITS).bitwise_left_shift_(23)
    return top.view(torch.float32)


def _pow2_64(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float64, exactly (built from its bits)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def _non_finite(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out`` with the IEEE value of the sum of products written where that is not finite:
    NaN for a NaN operand, inf * 0 or inf - inf, else +-inf. Every output whose row of ``a`` or
    of ``b`` holds a NaN or an infinity is such an output, and its class is decided by the
    columns of K that hold one (the others only add finite products)."""
    bad_a, bad_b = (_not_finite(x) for x in (a, b))
    rows, cols = bad_a.any(1), bad_b.any(1)
    if not (rows.any() or cols.any()):
        return out
    ks = (bad_a.any(0) | bad_b.any(0)).nonzero()[:, 0]  # the columns of K that decide
    a64, b64 = a[:, ks].double(), b[:, ks].double()
    out[rows] = _ieee_sums(a64[rows], b64)
    others = (~rows).nonzero()[:, 0]
    out[others[:, None], cols.nonzero()[:, 0]] = _ieee_sums(a64[others], b64[cols])
    return out


def _not_finite(x: torch.Tensor) -> torch.Tensor:
    """Where ``x`` holds a NaN (E4M3: S.1111.111) or, in E5M2, an infinity or NaN (S.11111.xx)."""
    field = 0x7F if x.dtype == torch.float8_e4m3fn else 0x7C
    return (x.view(torch.uint8) & field) == field


def _ieee_sums(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` in IEEE float64 from elementwise products (a BLAS may skip inf * 0), as
    float32 with NaN canonical; a few rows of ``a`` at a time."""
    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
    step = max(1, TILE_PRODUCTS // max(1, b.numel()))
    for m0 in range(0, a.shape[0], step):
        out[m0 : m0 + step] = (a[m0 : m0 + step, None, :] * b[None]).sum(-1).float()
    canonical = torch.tensor(_CANONICAL_NAN, dtype=torch.int32, device=a.device)
    return torch.where(torch.isnan(out), canonical.view(torch.float32), out)
