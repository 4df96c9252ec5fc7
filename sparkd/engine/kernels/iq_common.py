"""Steps the i-quant families (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) share: the ksigns sign table
computed instead of looked up, unaligned 32-bit loads, signs applied as a bit, and the GEMV
`dot` accumulator; for their integer steps (session 22, idot, behind $SPARKD_<type>_INT, off by
default until timed on a GPU) the signs applied to int8 grid bytes in 32-bit words (sign_nibbles,
negate_bytes, signed_dot) and the float step (iadd).

Their dots all lay a 256-value group out as [BN, 8, 4, 2, 4]: value v = 32a + 8l + 4h + b, i.e.
32-value sub-block a, 8-value grid entry (or sign group) l, half h of the entry, value b. Per-entry
work (index, scale, sign byte) then happens once per [BN, 8, 4, ...] element, not once per value,
and both the grid values and x are read in contiguous runs of 4 (vector loads).

Offline sm_90 SASS of the GEMV loop (4 rows, 1 warp, elementwise; bench/kernels_sass_iq.py), warp
instructions per 1024 values, dot vs dequant-then-multiply under triton 3.6: IQ2_XXS 292 vs 523,
IQ2_XS 311 vs 506, IQ3_XXS 331 vs 525, IQ1_S 252 vs 449; with byte tables and the 2^23 mantissa
trick instead of float tables, IQ2_XXS's dot took 466 (triton 3.9; now 327 there).

The integer steps lay a group out as [BN, 8] instead: one thread a (row, 32 values), its header words
loaded once in that layout (a [BN, 8, 4] tile with [BN, 8, 1] header loads had Triton convert them through
shared memory: 4 barriers a group), its 4 sign groups unrolled into one dp4a chain, one scale multiply and
one float step; a grid entry's two words and a sign group's two x words in one 64-bit load each (load_pair;
x's words repeat across the rows: the cache serves them). Offline sm_90 SASS as above under triton 3.9, int
vs dot: IQ2_XXS 147 vs 327, IQ3_XXS 167 vs 322, IQ2_XS 153 vs 367, IQ1_S 83 vs 272
(bench/results/iq50_sass_s22.txt).

Their integer prefill GEMM's iblocks (session 23) build a 32-value sub-block as 8 words [BN, 8] the same way
(grid words from the codebook, signed_words), turned into the int8 tile tl.dot takes (word_bytes); igroup_d is
their igroup (iq4_xs's iblock shares word_bytes).
"""

import triton
import triton.language as tl

from sparkd.engine.kernels.act_quant import dp4a_add

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
def sign_nibbles(idx):
    """ksigns[idx] for 7-bit idx (int32) as the sign bits of an 8-value entry's two words: (idx itself, whose
    bits 0-3 are the low word's; bits 4-6 of idx with the parity bit as bit 3: the high word's), each below 128
    as negate_bytes takes them. 0x6996 holds the parity of every 4-bit value v in bit v, so the parity of idx is
    bit (low nibble ^ high nibble) of it, moved to bit 3 (a shift and an and instead of ksigns' three steps)."""
    hi = idx >> 4
    return idx, hi | (((0x6996 << 3) >> ((idx ^ hi) & 0xF)) & 8)


@triton.jit
def negate_bytes(q, bits):
    """q (int32 words of 4 int8 values, each 1 to 127: the grids' values) with byte b negated where bit b of
    bits (int32 below 128; bits 4-6 are ignored) is set, in 32-bit arithmetic. One multiply copies bits to
    shifts 0, 7, 14 and 21: bit b of the copy shifted 7b lands on 8b, and no two copies' bits meet (no carries),
    so t has 0x01 in each byte to negate; m 0xFF there, and (q ^ m) + t per byte is 255 - v + 1 = 256 - v, the
    int8 -v, never above 255: no carry into the next byte (a v of 0 would carry)."""
    t = (bits * 0x00204081) & 0x01010101
    return (q ^ (t * 0xFF)) + t


@triton.jit
def signed_dot(w0, w1, sign_idx, x0, x1, acc, EMU: tl.constexpr):
    """acc + the integer dot of an 8-value sign group with x: w0, w1 int32 words of the group's int8 grid values
    (values 0-3, 4-7; each 1 to 127), signed by ksigns[sign_idx] (7-bit), times x's words x0, x1."""
    lo, hi = sign_nibbles(sign_idx)
    return signed_pair(w0, w1, lo, hi, x0, x1, acc, EMU)


@triton.jit
def signed_pair(w0, w1, lo, hi, x0, x1, acc, EMU: tl.constexpr):
    """signed_dot with the group's signs as negate_bytes' bits of each word (lo: values 0-3, hi: 4-7)."""
    return dp4a_add(negate_bytes(w1, hi), x1, dp4a_add(negate_bytes(w0, lo), x0, acc, EMU), EMU)


@triton.jit
def byte_nibbles(signs):
    """An explicit sign byte (IQ2_S, IQ3_S: bit j negates value j of 8; int32) as signed_pair's (lo, hi)."""
    return signs & 0x7F, signs >> 4


@triton.jit
def signed_words(q, sign_idx, w):
    """The integer prefill GEMM's words of a 32-value sub-block (iblock): q int32 [BN, 8], word w = 2l + h holding
    values 4w..4w+3 (half h of sign group l; grid bytes 1 to 127), signed by ksigns[sign_idx] (sign_idx: group l's
    7-bit index, in q's shape) as signed_dot signs them."""
    lo, hi = sign_nibbles(sign_idx)
    return negate_bytes(q, tl.where(w % 2 == 0, lo, hi))


@triton.jit
def byte_signed_words(q, signs, w):
    """signed_words for explicit sign bytes: signs (int32, in q's shape) group l's byte."""
    lo, hi = byte_nibbles(signs)
    return negate_bytes(q, tl.where(w % 2 == 0, lo, hi))


@triton.jit
def word_bytes(q):
    """int32 words [BN, W] as their int8 bytes [BN, 4W], byte j of word w at 4w + j (little-endian): iblock's
    values for tl.dot."""
    j = tl.arange(0, 4)[None, None, :]
    return tl.reshape(q[:, :, None] >> (8 * j), (q.shape[0], q.shape[1] * 4)).to(tl.int8)


@triton.jit
def igroup_d(blk, rmask, c):
    """family.igroup of a grid i-quant: (d * c, 0) [BN], d the f16 at blk [BN] (0 outside rmask), c the format's
    power-of-two constant (exact), no min (the GEMM's min term folds away)."""
    d = _f16_at(blk, rmask) * c
    return d, tl.zeros(d.shape, tl.float32)


@triton.jit
def load_pair(ptr):
    """The two int32 words at each of ptr's 8-byte aligned addresses (a grid entry of 8 values, a sign group's x
    words) as two tensors of ptr's shape, from one 64-bit load each (the split is in registers)."""
    return tl.split(tl.load(ptr[:, :, None] + tl.arange(0, 2)[None, None, :]))


@triton.jit
def iadd(acc, isum, blk, rmask, dx, EW: tl.constexpr):
    """An integer step's float step: acc += isum * (d * dx), isum int32 [BN, 8] (a group's integer sums per
    (row, sub-block), the sub-block scales in them), blk [BN] the rows' blocks (d the f16 at the start; 0 for
    rows outside rmask), dx x's (Q8_K) scale times the format's power-of-two constant. EW: into the elementwise
    tile acc (8 values a row: Family.iacc (8, 1)), d loaded in isum's shape (each (row, sub-block) loads its
    row's d, repeats served by the cache: no layout conversion); else the group's integer sum first, one float
    step per row, acc [BN] (llama.cpp's order: its constant applied to the product, exact as a power of 2)."""
    return iadd_at(acc, isum, blk, rmask, dx, EW, _f16_at)


@triton.jit
def iadd_at(acc, isum, blk, rmask, dx, EW: tl.constexpr, D_AT: tl.constexpr):
    """iadd with d read by D_AT(blk, mask) (a jitted function: IQ1_M's d has no f16 field of its own)."""
    if EW:
        d = D_AT(blk[:, None] + tl.zeros(isum.shape, tl.int32), rmask[:, None])
        acc += tl.reshape(isum.to(tl.float32) * (d * dx), acc.shape)
    else:
        acc += tl.sum(isum, 1).to(tl.float32) * (D_AT(blk, rmask) * dx)
    return acc


@triton.jit
def _f16_at(ptr, mask):
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


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
