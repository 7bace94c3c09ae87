"""E2M1, the 4-bit element format of NVFP4, and the 16-point random Hadamard transform.

E2M1 (OCP FP4): 1 sign | 2 exponent | 1 mantissa bit, bias 1, no inf and no NaN. Its eight
magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4 and 6; code ``c`` (0..15) is magnitude ``c & 7`` with the
sign in bit 3, the layout ``ml_dtypes.float4_e2m1fn`` and ``torch.float4_e2m1fn_x2`` use.

Codes are kept *unpacked* here, one per uint8 in the low four bits, so a code tensor has the
shape of the values it encodes. TE stores them packed, two codes per byte, the element with
the even index in the low nibble (TE's ``cast_to_fp4x2``).
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E2M1_MAGNITUDES",
    "e2m1_codes",
    "e2m1_codes_stochastic",
    "decode_e2m1",
    "RHT_SIZE",
    "TE_RHT_SIGNS",
    "rht_matrix",
]

E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of codes 0..7
_SIGN_BIT = 8


def _grid(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)


def _with_sign(v: torch.Tensor, magnitude_code: torch.Tensor) -> torch.Tensor:
    """Attach the sign (bit 3) for ``v < 0`` and map NaN to code 0.

    Signs follow TE's reference (``cast_to_fp4x2``): a negative value that rounds to zero keeps
    its sign (code 8, -0), ``-0.0`` itself gives code 0, and NaN, which E2M1 cannot hold,
    becomes code 0 (+0): none of the reference's interval tests holds for NaN.
    """
    code = magnitude_code + torch.where(v < 0, _SIGN_BIT, 0)
    return torch.where(torch.isnan(v), 0, code).to(torch.uint8)


def _position(a: torch.Tensor) -> torch.Tensor:
    """Where a magnitude ``a`` (0..6) lies on the line of E2M1 indices, in float64: the grid
    points 0, 0.5, ..., 6 map to 0, 1, ..., 7 and each gap between them linearly, so a midpoint
    maps to ``k + 0.5``. Exact: every step is exact in float64 for a float32 ``a``."""
    a = a.to(torch.float64)
    return torch.where(a < 2, 2 * a, torch.where(a < 4, a + 2, a / 2 + 4))


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Round ``v`` (float32, already scaled) to E2M1 codes: nearest, ties to even, saturating.

    A tie lies halfway between two neighbours, one of them with mantissa bit 0 (an even
    magnitude index); that one wins, so 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 2.5 -> 2, 5 -> 4.
    Magnitudes above 6 saturate to 6 (TE's ``satfinite``; inf too). The index is the position
    (``_position``) rounded half to even, which is exactly that rule.
    """
    a = v.abs().clamp(max=E2M1_MAX)
    return _with_sign(v, torch.round(_position(a)).to(torch.int64))


def e2m1_codes_stochastic(v: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Round ``v`` to one of its two E2M1 neighbours at random, unbiased for ``|v| <= 6``.

    The magnitude rounds up with probability ``(|v| - lo) / (hi - lo)`` (the fractional part
    of its position, exact), so the expected code value equals ``v``; values on the grid never
    move. Magnitudes above 6 saturate to 6 (TE's ``cvt.rs.satfinite``). ``generator`` (a seeded
    ``torch.Generator`` on ``v``'s device) makes the draw reproducible; None uses torch's global
    generator.
    """
    a = v.abs().clamp(max=E2M1_MAX)
    position = _position(a)
    lo = torch.floor(position)
    p_up = (position - lo).to(torch.float32)
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=torch.float32)
    index = (lo.to(torch.int64) + (u < p_up).to(torch.int64)).clamp(max=len(E2M1_MAGNITUDES) - 1)
    return _with_sign(v, index)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of unpacked E2M1 codes (uint8, 0..15)."""
    grid = _grid(codes.device)
    c = codes.to(torch.long)
    value = grid[c & 7]
    return torch.where((c & _SIGN_BIT) != 0, -value, value)


# ---- the random Hadamard transform (RHT) ------------------------------------------------------
RHT_SIZE = 16  # TE applies it to blocks of 16 elements, the NVFP4 block
# The fixed signs TE puts on the diagonal of its 16x16 transform (``get_wgrad_sign_vector`` in
# ``transformer_engine/pytorch/tensor/nvfp4_tensor.py``): a fact needed to reproduce TE's result.
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def rht_matrix(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16x16 orthogonal matrix ``T = diag(TE_RHT_SIGNS) @ H / 4`` (float32).

    ``H`` is the Sylvester Hadamard matrix (``H_1 = [1]``, ``H_2n = [[H, H], [H, -H]]``), whose
    rows are orthogonal with squared norm 16, so ``T @ T.T = I``: a block ``b`` (a row vector)
    becomes ``b @ T`` and comes back as ``(b @ T) @ T.T``. Every entry is +-1/4, exact in
    float32 and bfloat16 (TE stores the matrix in bfloat16).
    """
    h = torch.ones(1, 1, dtype=torch.float32, device=device)
    while h.shape[0] < RHT_SIZE:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    signs = torch.tensor(TE_RHT_SIGNS, dtype=torch.float32, device=device)
    return signs[:, None] * h / 4.0
