"""IQ2_S: 256-value super-blocks (82 bytes): d f16 | qs[32] | signs[32] | qh[8] | scales[8].

Thirty-two grid entries of 8 values: entry e is qs[e] | (bits 2 (e % 4) of qh[e // 4]) << 8 into ggml's 1024 x 8
iq2s codebook, signed by its own byte signs[e] (bit j negates value j: no ksigns parity); sixteen 4-bit scales, one
per 16 values (nibble of scales[e // 4] for entries e, e + 1 of a pair). Value j of entry e is
d * (0.5 + scale) / 4 * grid[index][j] * sign.

The GEMV step works per entry (iq_common's [BN, 8, 4, 2, 4] layout, IQ2_XS's: entry 4a + l, scale nibble l // 2
of scales[a]): grid values loaded as floats 4 at a time, signs flipped as a bit.

The integer step (idot; x as Q8_K, act_round's format for IQ2_S) is llama.cpp's arithmetic (IQ2_XS's): per entry
its two int8 grid words, the sign byte applied to the bytes, dp4a against x (iq_common.signed_pair); each 16 values'
sum times 2 * scale + 1 in integers, one float step d * d_x / 8 per group. Default since session 24 (not yet
timed); SPARKD_IQ2_S_INT=0 (read at import) the float one.

iblock / igroup hand the integer prefill GEMM a sub-block's signed grid values as int8, a scale per 16 values
(Family.ihalf, IQ2_XS's form) and d / 8: the GEMM's exact integer sums are the idot's.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_K
from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import (acc0, accumulate, byte_nibbles, byte_signed_words, iadd, igroup_d,
                                             load_pair, load_u32, negate, signed_pair, total, word_bytes)

INT_ENV = "SPARKD_IQ2_S_INT"  # "0": the float path (no integer step)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]  # 16 values with one scale
    i = tl.arange(0, 16)[None, None, :]
    blk = w_ptr + row_off + g * 82
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = (tl.load(blk + 74 + s // 2, mask=smask, other=0).to(tl.int32) >> (4 * (s % 2))) & 0xF
    db = d * (0.5 + sc.to(tl.float32)) * 0.25
    e = 2 * s + i // 8  # grid entry
    qh = tl.load(blk + 66 + e // 4, mask=smask, other=0).to(tl.int32)
    idx = tl.load(blk + 2 + e, mask=smask, other=0).to(tl.int32) | (((qh >> (2 * (e % 4))) & 3) << 8)
    signs = tl.load(blk + 34 + e, mask=smask, other=0).to(tl.int32)
    return db * negate(tl.load(aux_ptr + idx * 8 + i % 8), signs, i % 8)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # 32 values
    l = tl.arange(0, 4)[None, None, :, None, None]  # grid entry 4a + l (16 values 2a + l // 2)
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 82  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    sc = (tl.load(blk + 74 + a, mask=m, other=0).to(tl.int32) >> (4 * (l // 2))) & 0xF
    db = d * (0.5 + sc.to(tl.float32)) * 0.25  # [BN, 8, 4, 1, 1]
    qh = tl.load(blk + 66 + a, mask=m, other=0).to(tl.int32)
    idx = tl.load(blk + 2 + 4 * a + l, mask=m, other=0).to(tl.int32) | (((qh >> (2 * l)) & 3) << 8)
    signs = tl.load(blk + 34 + 4 * a + l, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 1, 1]
    q = negate(tl.load(aux_ptr + idx * 8 + 4 * h + b), signs, 4 * h + b)  # [BN, 8, 4, 2, 4]
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, db, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, 32 values a): its 4 entries' signed grid values times x's
    words (xw: the group's first), the first two times 16 values' 2 * scale + 1, the last two the next's. blk [BN]:
    the rows' blocks; one thread a (row, a), as iq2_xs._isums."""
    a = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    low = load_u32(blk[:, None] + 2 + 4 * a, m)  # the 4 entries' low index bytes
    signs = load_u32(blk[:, None] + 34 + 4 * a, m)  # their sign bytes
    qh = tl.load(blk[:, None] + 66 + a, mask=m, other=0).to(tl.int32)  # 2 high index bits each
    sc = tl.load(blk[:, None] + 74 + a, mask=m, other=0).to(tl.int32)  # the two 16 values' scales
    x = xw + 8 * a + tl.zeros(qh.shape, tl.int32)
    half = tl.zeros(qh.shape, tl.int32)
    isum = half
    for l in tl.static_range(4):
        w0, w1 = load_pair(aux_ptr + 2 * (((low >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3) << 8)))
        x0, x1 = load_pair(x + 2 * l)
        lo, hi = byte_nibbles((signs >> (8 * l)) & 0xFF)
        half = signed_pair(w0, w1, lo, hi, x0, x1, half, EMU)
        if l % 2 == 1:  # 16 values done
            isum += half * (2 * ((sc >> (4 * (l // 2))) & 0xF) + 1)
            half = tl.zeros(qh.shape, tl.int32)
    return isum


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 82
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.125, EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup and ihalf: values 32 (b % 8) .. +31 of super-block b // 8 as their signed grid
    values (int8 [BN, 32]: word w of the int8 codebook (aux_ptr) entry of index w // 2, signed by that entry's byte),
    and the two 16 values' 2 * scale + 1 (int32 [BN], 0 outside rmask); igroup's d / 8 the float step."""
    blk = w_ptr + row_off + (b // 8) * 82  # [BN]
    a = b % 8
    w = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    e = 4 * a + w // 2  # [1, 8]: each entry twice (its two words)
    qh = tl.load(blk + 66 + a, mask=rmask, other=0).to(tl.int32)[:, None]
    idx = tl.load(blk[:, None] + 2 + e, mask=m, other=0).to(tl.int32) | (((qh >> (2 * (w // 2))) & 3) << 8)
    signs = tl.load(blk[:, None] + 34 + e, mask=m, other=0).to(tl.int32)
    v = word_bytes(byte_signed_words(tl.load(aux_ptr + 2 * idx + w % 2), signs, w))
    sc = tl.load(blk + 74 + a, mask=rmask, other=0).to(tl.int32)
    return v, tl.where(rmask, 2 * (sc & 0xF) + 1, 0), tl.where(rmask, 2 * (sc >> 4) + 1, 0)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 82, rmask, 0.125)


FLOAT_FAMILY = Family(T.IQ2_S, 256, 82, 16, 16, dequant, dot, acc0, total, grid="IQ2_S")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup,
                                 ihalf=True)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
