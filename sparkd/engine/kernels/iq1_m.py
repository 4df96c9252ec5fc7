"""IQ1_M: 256-value super-blocks (56 bytes): qs[32] | qh[16] | scales u16[4].

Thirty-two grid entries of 8 values: entry e's index is qs[e] | (3 bits of qh[e // 2] at 4 (e % 2)) << 8 into
ggml's 2048 x 8 iq1s codebook of -1/0/1 (IQ1_S's), and the next bit of that nibble the sign of its delta (+-1/8).
Sixteen 3-bit scales, one per 16 values (value v's is bits 3 (v // 16 % 4) of scales[v // 64]); the super-block's
f16 d has no field of its own: its four nibbles are the scale words' top nibbles (word k's, nibble k).
Value v = d * (2 * scale + 1) * (grid[index][v % 8] +- 1/8).

The GEMV step works per grid entry (iq_common's [BN, 8, 4, 2, 4] layout), as IQ1_S's: one index, one delta per 8
values, grid values loaded as floats 4 at a time.

The integer step (idot; x as Q8_K, act_round's format for IQ1_M) is llama.cpp's arithmetic: per entry its two int8
words of -1/0/1 (grids.grid_words) dp4a against x, and x's sum of the entry's 8 quants (two more dp4a against ones:
Q8_K keeps sums per 32, the delta changes every 8) times the delta's sign, as 8 * sum + delta sum; each 16 values
times 2 * scale + 1, in integers (below 2^24: the float is exact, as llama.cpp's sum + 0.125 * delta sum is); one
float step d * d_x / 8 per group. Default since session 24; SPARKD_IQ1_M_INT=0 (read at import) the float one.

iblock / igroup hand the integer prefill GEMM 8 * grid value + the entry's delta sign (-9 to 9) as int8, a scale per
16 values (Family.ihalf, IQ2_XS's form) and d / 8: the GEMM's exact integer sums are the idot's.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_K, dp4a_add
from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import acc0, accumulate, iadd_at, load_pair, load_u32, total, word_bytes

INT_ENV = "SPARKD_IQ1_M_INT"  # "0": the float path (no integer step)

_DELTA = tl.constexpr(0.125)


@triton.jit
def d_at(blk, mask):
    """The super-block's d (float32, blk's shape; 0 outside mask): its f16 bits are the top nibbles of the four
    scale words, word k's as bits 4k..4k+3."""
    sc = (blk + 48).to(tl.pointer_type(tl.uint16))
    bits = tl.zeros(blk.shape, tl.int32)
    for k in tl.static_range(4):
        bits |= ((tl.load(sc + k, mask=mask, other=0).to(tl.int32) >> 12) & 0xF) << (4 * k)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]  # 16 values with one scale
    i = tl.arange(0, 16)[None, None, :]
    blk = w_ptr + row_off + g * 56
    sc = tl.load((blk + 48).to(tl.pointer_type(tl.uint16)) + s // 4, mask=smask, other=0).to(tl.int32)
    dl = d_at(blk, smask) * (2 * ((sc >> (3 * (s % 4))) & 7) + 1).to(tl.float32)
    e = 2 * s + i // 8  # grid entry
    qh = tl.load(blk + 32 + e // 2, mask=smask, other=0).to(tl.int32) >> (4 * (e % 2))
    idx = tl.load(blk + e, mask=smask, other=0).to(tl.int32) | ((qh & 7) << 8)
    delta = tl.where((qh & 8) == 0, _DELTA, -_DELTA)
    return dl * (tl.load(aux_ptr + idx * 8 + i % 8) + delta)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # 32 values
    l = tl.arange(0, 4)[None, None, :, None, None]  # grid entry (16 values 2a + l // 2)
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 56  # [BN, 1, 1, 1, 1]
    sc = tl.load((blk + 48).to(tl.pointer_type(tl.uint16)) + a // 2, mask=m, other=0).to(tl.int32)
    dl = d_at(blk, m) * (2 * ((sc >> (6 * (a % 2) + 3 * (l // 2))) & 7) + 1).to(tl.float32)  # [BN, 8, 4, 1, 1]
    qh = tl.load(blk + 32 + 2 * a + l // 2, mask=m, other=0).to(tl.int32) >> (4 * (l % 2))
    idx = tl.load(blk + 4 * a + l, mask=m, other=0).to(tl.int32) | ((qh & 7) << 8)  # [BN, 8, 4, 1, 1]
    q = tl.load(aux_ptr + idx * 8 + 4 * h + b) + tl.where((qh & 8) == 0, _DELTA, -_DELTA)  # [BN, 8, 4, 2, 4]
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, dl, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, 32 values a): per entry 8 * its values times x's words
    (xw: the group's first) + delta sign * x's sum of its 8 quants, each 16 values' times 2 * scale + 1. blk [BN]:
    the rows' blocks; one thread a (row, a), as iq1_s._isums."""
    a = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    low = load_u32(blk[:, None] + 4 * a, m)  # the 4 entries' index bytes
    qh = tl.load((blk[:, None] + 32 + 2 * a).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)
    sc = tl.load((blk[:, None] + 48 + 2 * (a // 2)).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)
    sc = sc >> (6 * (a % 2))  # the two 16 values' scales, 3 bits each
    x = xw + 8 * a + tl.zeros(qh.shape, tl.int32)
    ones = tl.full(qh.shape, 0x01010101, tl.int32)  # dp4a against it: the sum of a word's 4 bytes
    half = tl.zeros(qh.shape, tl.int32)
    isum = half
    for l in tl.static_range(4):
        q = qh >> (4 * l)
        w0, w1 = load_pair(aux_ptr + 2 * (((low >> (8 * l)) & 0xFF) | ((q & 7) << 8)))
        x0, x1 = load_pair(x + 2 * l)
        zero = tl.zeros(qh.shape, tl.int32)
        xsum = dp4a_add(x1, ones, dp4a_add(x0, ones, zero, EMU), EMU)
        half += 8 * dp4a_add(w1, x1, dp4a_add(w0, x0, zero, EMU), EMU) + tl.where((q & 8) == 0, xsum, -xsum)
        if l % 2 == 1:  # 16 values done
            isum += half * (2 * ((sc >> (3 * (l // 2))) & 7) + 1)
            half = tl.zeros(qh.shape, tl.int32)
    return isum


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 56
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd_at(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.125, EW, d_at)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup and ihalf: values 32 (b % 8) .. +31 of super-block b // 8 as 8 * grid value + the
    entry's delta sign (int8 [BN, 32], -9 to 9; word w of the int8 codebook (aux_ptr) entry of index w // 2), and
    the two 16 values' 2 * scale + 1 (int32 [BN], 0 outside rmask); igroup's d / 8 the float step."""
    blk = w_ptr + row_off + (b // 8) * 56  # [BN]
    w = tl.arange(0, 8)[None, :]
    e = 4 * (b % 8) + w // 2  # [1, 8]: each entry twice (its two words)
    qh = tl.load(blk[:, None] + 32 + e // 2, mask=rmask[:, None], other=0).to(tl.int32) >> (4 * (e % 2))
    idx = tl.load(blk[:, None] + e, mask=rmask[:, None], other=0).to(tl.int32) | ((qh & 7) << 8)  # [BN, 8]
    delta = tl.broadcast_to(tl.where((qh & 8) == 0, 1, -1)[:, :, None], (qh.shape[0], 8, 4))
    v = (8 * word_bytes(tl.load(aux_ptr + 2 * idx + w % 2)).to(tl.int32)
         + tl.reshape(delta, (qh.shape[0], 32))).to(tl.int8)
    sc = tl.load((blk + 48 + 2 * ((b % 8) // 2)).to(tl.pointer_type(tl.uint16)), mask=rmask, other=0).to(tl.int32)
    sc = sc >> (6 * (b % 2))
    return v, tl.where(rmask, 2 * (sc & 7) + 1, 0), tl.where(rmask, 2 * ((sc >> 3) & 7) + 1, 0)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    d = d_at(w_ptr + row_off + g * 56, rmask) * 0.125
    return d, tl.zeros(d.shape, tl.float32)


FLOAT_FAMILY = Family(T.IQ1_M, 256, 56, 16, 16, dequant, dot, acc0, total, grid="IQ1_M")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup,
                                 ihalf=True)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
