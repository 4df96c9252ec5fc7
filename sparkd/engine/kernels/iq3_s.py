"""IQ3_S: 256-value super-blocks (110 bytes): d f16 | qs[64] | qh[8] | signs[32] | scales[4].

Eight sub-blocks of 32 values with 4-bit scales (nibble s % 2 of scales[s // 2]); a grid entry of 4 values per
index: entry k of sub-block s is qs[8s + k] | (bit k of qh[s]) << 8 into ggml's 512 x 4 iq3s codebook; value i
of sub-block s is d * (1 + 2 * scale) * grid[entry i // 4][i % 4], negated when bit i % 8 of signs[4s + i // 8] is
set (explicit sign bytes: no ksigns parity).

The GEMV step works per sign group of 8 values (iq_common's [BN, 8, 4, 2, 4] layout, IQ3_XXS's: entry 2l + h holds
values 4h..4h+3 of group l), grid values loaded as floats 4 at a time, signs flipped as a bit.

The integer step (idot; x as Q8_K, act_round's format for IQ3_S) is llama.cpp's arithmetic: per sign group its two
grid entries as int32 words of int8 values (grids.grid_words), the sign byte applied to the bytes and dp4a against
x's two words (iq_common.signed_pair); a sub-block's sum times 2 * scale + 1 in integers, one float step d * d_x
per group (llama.cpp's vec_dot_iq3_s_q8_K: no power-of-two constant). Default since session 24 (not yet timed;
the other grid i-quants' integer steps were 3.5-4.7x their float dots on the H200); SPARKD_IQ3_S_INT=0 (read at
import) the float one.

iblock / igroup hand the integer prefill GEMM a sub-block's signed grid values as int8 with 2 * scale + 1 and d:
the GEMM's exact integer sums are the idot's (IQ3_XXS's form).
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

INT_ENV = "SPARKD_IQ3_S_INT"  # "0": the float path (no integer step)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 110
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = (tl.load(blk + 106 + s // 2, mask=smask, other=0).to(tl.int32) >> (4 * (s % 2))) & 0xF
    db = d * (1 + 2 * sc).to(tl.float32)
    qh = tl.load(blk + 66 + s, mask=smask, other=0).to(tl.int32)
    idx = tl.load(blk + 2 + 8 * s + i // 4, mask=smask, other=0).to(tl.int32) | (((qh >> (i // 4)) & 1) << 8)
    signs = tl.load(blk + 74 + 4 * s + i // 8, mask=smask, other=0).to(tl.int32)
    return db * negate(tl.load(aux_ptr + idx * 4 + i % 4), signs, i % 8)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # sub-block
    l = tl.arange(0, 4)[None, None, :, None, None]  # sign group of 8 values
    h = tl.arange(0, 2)[None, None, None, :, None]  # grid entry (4 values) in the group
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the entry
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 110  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    sc = (tl.load(blk + 106 + a // 2, mask=m, other=0).to(tl.int32) >> (4 * (a % 2))) & 0xF
    db = d * (1 + 2 * sc).to(tl.float32)  # [BN, 8, 1, 1, 1]
    qh = tl.load(blk + 66 + a, mask=m, other=0).to(tl.int32)
    idx = tl.load(blk + 2 + 8 * a + 2 * l + h, mask=m, other=0).to(tl.int32) | (((qh >> (2 * l + h)) & 1) << 8)
    signs = tl.load(blk + 74 + 4 * a + l, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 1, 1]
    q = negate(tl.load(aux_ptr + idx * 4 + b), signs, 4 * h + b)  # [BN, 8, 4, 2, 4]
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, db, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, sub-block): its 4 sign groups' signed grid values (2
    entries of 4 each) times x's words (xw: the group's first), times 2 * scale + 1. blk [BN]: the rows' blocks; one
    thread a (row, sub-block), as iq3_xxs._isums."""
    s = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    qs = blk[:, None] + 2 + 8 * s  # [BN, 8]: the sub-block's 8 low index bytes
    idx = (load_u32(qs, m), load_u32(qs + 4, m))
    qh = tl.load(blk[:, None] + 66 + s, mask=m, other=0).to(tl.int32)  # the 8 high index bits
    signs = load_u32(blk[:, None] + 74 + 4 * s, m)  # a byte a sign group
    sc = (tl.load(blk[:, None] + 106 + s // 2, mask=m, other=0).to(tl.int32) >> (4 * (s % 2))) & 0xF
    x = xw + 8 * s + tl.zeros(qh.shape, tl.int32)
    isum = tl.zeros(qh.shape, tl.int32)
    for l in tl.static_range(4):
        pair = idx[l // 2] >> (16 * (l % 2))  # the group's two entries: values 0-3, 4-7
        e0 = (pair & 0xFF) | (((qh >> (2 * l)) & 1) << 8)
        e1 = ((pair >> 8) & 0xFF) | (((qh >> (2 * l + 1)) & 1) << 8)
        x0, x1 = load_pair(x + 2 * l)
        lo, hi = byte_nibbles((signs >> (8 * l)) & 0xFF)
        isum = signed_pair(tl.load(aux_ptr + e0), tl.load(aux_ptr + e1), lo, hi, x0, x1, isum, EMU)
    return isum * (2 * sc + 1)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 110
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g), EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup: sub-block b % 8 of super-block b // 8 as its signed grid values (int8 [BN, 32]: word
    w the int8 codebook's (aux_ptr) entry w, signed by byte w // 2 of the sub-block's signs), 2 * scale + 1 (int32
    [BN], 0 outside rmask) and a min of 0: the GEMM sums the idot's integers, igroup's d its float step."""
    blk = w_ptr + row_off + (b // 8) * 110  # [BN]
    s = b % 8
    w = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    qh = tl.load(blk + 66 + s, mask=rmask, other=0).to(tl.int32)[:, None]
    idx = tl.load(blk[:, None] + 2 + 8 * s + w, mask=m, other=0).to(tl.int32) | (((qh >> w) & 1) << 8)  # [BN, 8]
    signs = tl.load(blk[:, None] + 74 + 4 * s + w // 2, mask=m, other=0).to(tl.int32)
    v = word_bytes(byte_signed_words(tl.load(aux_ptr + idx), signs, w))
    sc = (tl.load(blk + 106 + s // 2, mask=rmask, other=0).to(tl.int32) >> (4 * (s % 2))) & 0xF
    return v, tl.where(rmask, 2 * sc + 1, 0), tl.zeros(rmask.shape, tl.int32)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 110, rmask, 1.0)


FLOAT_FAMILY = Family(T.IQ3_S, 256, 110, 8, 32, dequant, dot, acc0, total, grid="IQ3_S")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
