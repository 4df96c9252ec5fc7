"""IQ3_XXS: 256-value super-blocks (98 bytes): d f16 | qs[64] grid indices | 8 x u32 aux.

Eight sub-blocks of 32 values; sub-block s's aux word (bytes 66 + 4s) holds four 7-bit sign
indices and a 4-bit scale (bits 28..31), its grid indices are qs[8s:8s+8] into ggml's 256 x 4
iq3xxs codebook. Value i: d * (0.5 + scale) / 2 * grid[qs[8s + i//4]][i%4], negated when bit i%8
of ksigns[sign index i//8] is set.

The GEMV step works per sign group of 8 values (iq_common's [BN, 8, 4, 2, 4] layout: entry
qs[8a + 2l + h] holds values 4h..4h+3 of group l), grid values loaded as floats 4 at a time, signs
flipped as a bit.

The integer step (idot; x as Q8_K, act_round's format for IQ3_XXS) is llama.cpp's arithmetic: per sign
group its two grid entries as int32 words of int8 values (grids.grid_words, aux_ptr; one word an entry),
the 8 signs applied to the bytes and dp4a against x's two words (iq_common.signed_dot); a sub-block's sum
times 2 * scale + 1 in integers, one float step d * d_x / 4 per group (d * (0.5 + scale) / 2).
It is the family's path by default
(since session 23, timed on the H200: 3.5-4.7x the float dot); SPARKD_IQ3_XXS_INT=0 (read at import) the float one.

iblock / igroup (session 23, iqgemm) hand the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8") a
sub-block's signed grid values as int8 from the same int8 codebook (aux_ptr), with 2 * scale + 1 (the K-quants'
form, a min of 0), and igroup a super-block's d / 4: the GEMM's exact integer sums are the idot's, one float step
per group. With SPARKD_IQ3_XXS_INT=0 prompts run the float GEMM at "ieee" (no iblock), the way before.
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

INT_ENV = "SPARKD_IQ3_XXS_INT"  # "0": the float path (no integer step)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 98
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    aux = load_u32(blk + 66 + 4 * s, smask)
    db = d * (0.5 + ((aux >> 28) & 0xF).to(tl.float32)) * 0.5
    idx = tl.load(blk + 2 + 8 * s + i // 4, mask=smask, other=0).to(tl.int32)
    grid = tl.load(aux_ptr + idx * 4 + i % 4)
    return db * negate(grid, ksigns((aux >> (7 * (i // 8))) & 0x7F), i % 8)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # sub-block
    l = tl.arange(0, 4)[None, None, :, None, None]  # sign group of 8 values
    h = tl.arange(0, 2)[None, None, None, :, None]  # grid entry (4 values) in the group
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the entry
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 98  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    aux = load_u32(blk + 66 + 4 * a, m)  # [BN, 8, 1, 1, 1]
    db = d * (0.5 + ((aux >> 28) & 0xF).to(tl.float32)) * 0.5
    idx = tl.load(blk + 2 + 8 * a + 2 * l + h, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 2, 1]
    grid = tl.load(aux_ptr + idx * 4 + b)  # [BN, 8, 4, 2, 4]
    signs = ksigns((aux >> (7 * l)) & 0x7F)  # [BN, 8, 4, 1, 1]
    q = negate(grid, signs, 4 * h + b)
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, db, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, sub-block): its 4 sign groups' signed grid values
    (2 entries of 4 each) times x's words (xw: the group's first), times 2 * scale + 1. blk [BN]: the rows'
    blocks; one thread a (row, sub-block), as iq2_xxs._isums."""
    s = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    qs = blk[:, None] + 2 + 8 * s  # [BN, 8]: the sub-block's 8 grid indices
    idx = (load_u32(qs, m), load_u32(qs + 4, m))  # sign groups 0-1, 2-3: a byte an entry
    aux = load_u32(blk[:, None] + 66 + 4 * s, m)  # 7-bit sign indices, the scale in bits 28-31
    x = xw + 8 * s + tl.zeros(aux.shape, tl.int32)
    isum = tl.zeros(aux.shape, tl.int32)
    for l in tl.static_range(4):
        pair = idx[l // 2] >> (16 * (l % 2))  # the group's two entries: values 0-3, 4-7
        x0, x1 = load_pair(x + 2 * l)
        isum = signed_dot(tl.load(aux_ptr + (pair & 0xFF)), tl.load(aux_ptr + ((pair >> 8) & 0xFF)),
                          (aux >> (7 * l)) & 0x7F, x0, x1, isum, EMU)
    return isum * (2 * ((aux >> 28) & 0xF) + 1)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 98
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.25, EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup: sub-block b % 8 of super-block b // 8 as its signed grid values (int8 [BN, 32]: word
    w the int8 codebook's (aux_ptr) entry qs[8s + w], signed), 2 * scale + 1 (int32 [BN], 0 outside rmask) and a min
    of 0: the GEMM sums the idot's integers, igroup's d / 4 its float step."""
    blk = w_ptr + row_off + (b // 8) * 98  # [BN]
    w = tl.arange(0, 8)[None, :]
    idx = tl.load(blk[:, None] + 2 + 8 * (b % 8) + w, mask=rmask[:, None], other=0).to(tl.int32)  # [BN, 8]
    aux = load_u32(blk + 66 + 4 * (b % 8), rmask)  # 7-bit sign indices, the scale in bits 28-31
    v = word_bytes(signed_words(tl.load(aux_ptr + idx), (aux[:, None] >> (7 * (w // 2))) & 0x7F, w))
    return v, tl.where(rmask, 2 * ((aux >> 28) & 0xF) + 1, 0), tl.zeros(rmask.shape, tl.int32)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 98, rmask, 0.25)


FLOAT_FAMILY = Family(T.IQ3_XXS, 256, 98, 8, 32, dequant, dot, acc0, total, grid="IQ3_XXS")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
