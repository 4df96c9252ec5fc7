"""IQ2_XXS: 256-value super-blocks (66 bytes): d f16 | 8 x (4 grid indices u8 | u32 aux).

Eight sub-blocks of 32 values; sub-block s's aux word holds four 7-bit sign indices (bits 7l..)
and a 4-bit scale (bits 28..31). Value i of sub-block s is
d * (0.5 + scale) / 4 * grid[index i//8][i%8] * (-1 if bit i%8 of ksigns[sign index i//8]),
grid being ggml's 256 x 8 iq2xxs codebook (grids.grid_table).

The GEMV step works per grid entry (iq_common's [BN, 8, 4, 2, 4] layout): one index byte and
one sign byte per 8 values, grid values loaded as floats 4 at a time, signs flipped as a bit.

The integer step (idot; x as Q8_K, what act_round rounds x to for IQ2_XXS, llama.cpp's vec_dot type) is
llama.cpp's arithmetic: per grid entry its two int32 words of int8 values from the int8 codebook
(grids.grid_words, aux_ptr), the 8 signs of ksigns applied to the bytes in 32-bit words and dp4a against
x's two words (iq_common.signed_dot); a sub-block's sum times 2 * scale + 1 in integers, one float step
d * d_x / 8 per group (d * (0.5 + scale) / 4 = d * (2 * scale + 1) / 8). A thread a (row, sub-block).
It is the family's path by default
(since session 23, timed on the H200: 3.5-4.7x the float dot); SPARKD_IQ2_XXS_INT=0 (read at import) the float one.

iblock / igroup (session 23, iqgemm) hand the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8") a
sub-block's signed grid values as int8 from the same int8 codebook (aux_ptr), with 2 * scale + 1 (the K-quants'
form, a min of 0), and igroup a super-block's d / 8: the GEMM's exact integer sums are the idot's, one float step
per group. With SPARKD_IQ2_XXS_INT=0 prompts run the float GEMM at "ieee" (no iblock), the way before.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_K
from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import (acc0, accumulate, iadd, igroup_d, ksigns, load_pair, load_u32, negate,
                                             signed_dot, signed_words, total, word_bytes)

INT_ENV = "SPARKD_IQ2_XXS_INT"  # "0": the float path (no integer step)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 66
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sub = blk + 2 + 8 * s  # [BN, 8, 1]
    aux = load_u32(sub + 4, smask)
    db = d * (0.5 + ((aux >> 28) & 0xF).to(tl.float32)) * 0.25
    idx = tl.load(sub + i // 8, mask=smask, other=0).to(tl.int32)
    grid = tl.load(aux_ptr + idx * 8 + i % 8)
    return db * negate(grid, ksigns((aux >> (7 * (i // 8))) & 0x7F), i % 8)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # sub-block
    l = tl.arange(0, 4)[None, None, :, None, None]  # grid entry
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 66  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    sub = blk + 2 + 8 * a  # [BN, 8, 1, 1, 1]
    aux = load_u32(sub + 4, m)
    db = d * (0.5 + ((aux >> 28) & 0xF).to(tl.float32)) * 0.25
    idx = tl.load(sub + l, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 1, 1]
    grid = tl.load(aux_ptr + idx * 8 + 4 * h + b)  # [BN, 8, 4, 2, 4]
    signs = ksigns((aux >> (7 * l)) & 0x7F)
    q = negate(grid, signs, 4 * h + b)
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, db, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, sub-block): its 4 grid entries' signed values times
    x's words (xw: the group's first), times 2 * scale + 1. blk [BN]: the rows' blocks. One thread holds a
    (row, sub-block): its header words loaded once, no layout conversion; x's words repeat across rows (cache)."""
    s = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    sub = blk[:, None] + 2 + 8 * s  # [BN, 8]
    idx = load_u32(sub, m)  # the 4 entries' grid indices, a byte each
    aux = load_u32(sub + 4, m)  # their 7-bit sign indices, the scale in bits 28-31
    x = xw + 8 * s + tl.zeros(idx.shape, tl.int32)
    isum = tl.zeros(idx.shape, tl.int32)
    for l in tl.static_range(4):
        w0, w1 = load_pair(aux_ptr + 2 * ((idx >> (8 * l)) & 0xFF))  # the entry's values 0-3, 4-7
        x0, x1 = load_pair(x + 2 * l)
        isum = signed_dot(w0, w1, (aux >> (7 * l)) & 0x7F, x0, x1, isum, EMU)
    return isum * (2 * ((aux >> 28) & 0xF) + 1)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 66
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.125, EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup: sub-block b % 8 of super-block b // 8 as its signed grid values (int8 [BN, 32]: word
    w of the int8 codebook (aux_ptr) entry w // 2, signed), 2 * scale + 1 (int32 [BN], 0 outside rmask) and a min
    of 0: the GEMM sums the idot's integers, igroup's d / 8 its float step."""
    sub = w_ptr + row_off + (b // 8) * 66 + 2 + 8 * (b % 8)  # [BN]
    idx = load_u32(sub, rmask)  # the 4 entries' grid indices, a byte each
    aux = load_u32(sub + 4, rmask)  # their 7-bit sign indices, the scale in bits 28-31
    w = tl.arange(0, 8)[None, :]
    q = tl.load(aux_ptr + 2 * ((idx[:, None] >> (8 * (w // 2))) & 0xFF) + w % 2)  # [BN, 8]
    v = word_bytes(signed_words(q, (aux[:, None] >> (7 * (w // 2))) & 0x7F, w))
    return v, tl.where(rmask, 2 * ((aux >> 28) & 0xF) + 1, 0), tl.zeros(rmask.shape, tl.int32)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 66, rmask, 0.125)


FLOAT_FAMILY = Family(T.IQ2_XXS, 256, 66, 8, 32, dequant, dot, acc0, total, grid="IQ2_XXS")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
