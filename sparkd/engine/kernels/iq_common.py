"""Steps the i-quant families (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) share: the ksigns sign table
computed instead of looked up, unaligned 32-bit loads, signs applied as a bit, and the GEMV
`dot` accumulator.

Their dots all lay a 256-value group out as [BN, 8, 4, 2, 4]: value v = 32a + 8l + 4h + b, i.e.
32-value sub-block a, 8-value grid entry (or sign group) l, half h of the entry, value b. Per-entry
work (index, scale, sign byte) then happens once per [BN, 8, 4, ...] element, not once per value,
and both the grid values and x are read in contiguous runs of 4 (vector loads).

Offline sm_90 SASS of the GEMV loop (4 rows, 1 warp, elementwise; bench/kernels_sass_iq.py), warp
instructions per 1024 values, dot vs dequant-then-multiply under triton 3.6: IQ2_XXS 292 vs 523,
IQ2_XS 311 vs 506, IQ3_XXS 331 vs 525, IQ1_S 252 vs 449; with byte tables and the 2^23 mantissa
trick instead of float tables, IQ2_XXS's dot took 466 (triton 3.9; now 327 there).
"""

import triton
import triton.language as tl

_SIGN_BIT = tl.constexpr(-2147483648)  # 0x80000000 as int32


@triton.jit
def ksigns(idx):
    """ksigns[idx] for 7-bit idx (int32): bits 0..6 are idx, bit 7 makes the parity even."""
    p = idx ^ (idx >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return idx | ((p & 1) << 7)


@triton.jit
def load_u32(ptr, mask):
    """A little-endian uint32 at a 2-aligned byte address, as int32 (two 16-bit loads)."""
    lo = tl.load(ptr.to(tl.pointer_type(tl.uint16)), mask=mask, other=0).to(tl.int32)
    hi = tl.load((ptr + 2).to(tl.pointer_type(tl.uint16)), mask=mask, other=0).to(tl.int32)
    return lo | (hi << 16)


@triton.jit
def negate(v, signs, k):
    """v (float32) negated where bit k of signs is set: the bit moved into the float's sign bit
    (a shift and one and-xor), no multiply."""
    bit = (signs << (31 - k)) & _SIGN_BIT
    return (v.to(tl.int32, bitcast=True) ^ bit).to(tl.float32, bitcast=True)


@triton.jit
def acc0(rmask, EW: tl.constexpr):
    if EW:
        acc = tl.zeros((rmask.shape[0], 8, 4, 2, 4), tl.float32)
    else:
        acc = tl.zeros(rmask.shape, tl.float32)
    return acc


@triton.jit
def total(acc, EW: tl.constexpr):
    if EW:
        acc = tl.sum(tl.sum(tl.sum(tl.sum(acc, 4), 3), 2), 1)
    return acc


@triton.jit
def accumulate(acc, q, x, scale, EW: tl.constexpr):
    """acc += sum of q * x * scale, q and x [BN, 8, 4, 2, 4], scale [BN, 8, 1 or 4, 1, 1] (one
    per sub-block or per entry): elementwise (EW) or with the scale applied to entry sums."""
    if EW:  # masked rows have scale 0
        acc += (q * x) * scale
    else:
        acc += tl.sum(tl.sum(tl.sum(tl.sum(q * x, 4), 3) * tl.sum(tl.sum(scale, 4), 3), 2), 1)
    return acc
