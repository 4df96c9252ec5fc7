"""IQ2_XS: 256-value super-blocks (74 bytes): d f16 | qs u16[32] | scales[8].

Sixteen sub-blocks of 16 values with 4-bit scales (nibble s%2 of scales[s//2]); each qs word
holds a 9-bit index into ggml's 512 x 8 iq2xs codebook (low bits) and a 7-bit sign index (high).
Value i of sub-block s comes from word 2s + i//8: d * (0.5 + scale) / 4 * grid[index][i%8], negated
when bit i%8 of ksigns[sign index] is set.

The GEMV step works per qs word (iq_common's [BN, 8, 4, 2, 4] layout, word 4a + l, scale
nibble l//2 of scales[a]): grid values loaded as floats 4 at a time, signs flipped as a bit.

The integer step (idot; x as Q8_K, act_round's format for IQ2_XS) is llama.cpp's arithmetic, as
iq2_xxs.idot's: per qs word its grid entry's two int8 words (grids.grid_words), the signs applied to the
bytes (iq_common.signed_dot), dp4a against x; each 16-value sub-block's sum times 2 * scale + 1 in
integers, one float step d * d_x / 8 per group. It is the family's path by default
(since session 23, timed on the H200: 3.5-4.7x the float dot); SPARKD_IQ2_XS_INT=0 (read at import) the float one.

iblock / igroup (session 23, iqgemm) hand the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8") a
sub-block's signed grid values as int8 from the same int8 codebook (aux_ptr), with 2 * scale + 1 per 16-value
sub-block (Q6_K's form: Family.ihalf), and igroup a super-block's d / 8: the GEMM's exact integer sums are the
idot's, one float step per group. With SPARKD_IQ2_XS_INT=0 prompts run the float GEMM at "ieee" (no iblock), the way
before.
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

INT_ENV = "SPARKD_IQ2_XS_INT"  # "0": the float path (no integer step)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]
    i = tl.arange(0, 16)[None, None, :]
    blk = w_ptr + row_off + g * 74
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = tl.load(blk + 66 + s // 2, mask=smask, other=0).to(tl.int32)
    db = d * (0.5 + ((sc >> ((s % 2) * 4)) & 0xF).to(tl.float32)) * 0.25
    q = tl.load((blk + 2).to(tl.pointer_type(tl.uint16)) + 2 * s + i // 8, mask=smask, other=0).to(tl.int32)
    grid = tl.load(aux_ptr + (q & 511) * 8 + i % 8)
    return db * negate(grid, ksigns(q >> 9), i % 8)


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # pair of 16-value sub-blocks
    l = tl.arange(0, 4)[None, None, :, None, None]  # qs word in the pair (sub-block 2a + l//2)
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 74  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    sc = tl.load(blk + 66 + a, mask=m, other=0).to(tl.int32)  # [BN, 8, 1, 1, 1]
    db = d * (0.5 + ((sc >> ((l // 2) * 4)) & 0xF).to(tl.float32)) * 0.25  # [BN, 8, 4, 1, 1]
    qs = tl.load((blk + 2).to(tl.pointer_type(tl.uint16)) + 4 * a + l, mask=m, other=0).to(tl.int32)
    grid = tl.load(aux_ptr + (qs & 511) * 8 + 4 * h + b)  # [BN, 8, 4, 2, 4]
    q = negate(grid, ksigns(qs >> 9), 4 * h + b)
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, db, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, 32 values a): its 4 qs words' signed grid entries
    times x's words (xw: the group's first), the first two times sub-block 2a's 2 * scale + 1, the last two
    times 2a + 1's. blk [BN]: the rows' blocks; one thread a (row, a), as iq2_xxs._isums."""
    a = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    qs = blk[:, None] + 2 + 8 * a  # [BN, 8]: 4 qs words, 9-bit grid index | 7-bit sign index << 9
    words = (load_u32(qs, m), load_u32(qs + 4, m))
    sc = tl.load(blk[:, None] + 66 + a, mask=m, other=0).to(tl.int32)  # the two sub-blocks' scales
    x = xw + 8 * a + tl.zeros(sc.shape, tl.int32)
    half = tl.zeros(sc.shape, tl.int32)
    isum = half
    for l in tl.static_range(4):
        q = words[l // 2] >> (16 * (l % 2))
        w0, w1 = load_pair(aux_ptr + 2 * (q & 511))
        x0, x1 = load_pair(x + 2 * l)
        half = signed_dot(w0, w1, (q >> 9) & 0x7F, x0, x1, half, EMU)
        if l % 2 == 1:  # a sub-block's two words done
            isum += half * (2 * ((sc >> (4 * (l // 2))) & 0xF) + 1)
            half = tl.zeros(sc.shape, tl.int32)
    return isum


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 74
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.125, EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup and ihalf: values 32 (b % 8) .. +31 of super-block b // 8 (sub-blocks 2 (b % 8) and
    2 (b % 8) + 1) as their signed grid values (int8 [BN, 32]: word w of the int8 codebook (aux_ptr) entry of qs word
    w // 2, signed), and each sub-block's 2 * scale + 1 (int32 [BN], 0 outside rmask): the idot's integers, igroup's
    d / 8 the float step."""
    blk = w_ptr + row_off + (b // 8) * 74  # [BN]
    w = tl.arange(0, 8)[None, :]
    qs = tl.load((blk + 2 + 8 * (b % 8)).to(tl.pointer_type(tl.uint16))[:, None] + w // 2, mask=rmask[:, None],
                 other=0).to(tl.int32)  # [BN, 8]: 9-bit grid index | 7-bit sign index << 9, each word twice
    v = word_bytes(signed_words(tl.load(aux_ptr + 2 * (qs & 511) + w % 2), qs >> 9, w))
    sc = tl.load(blk + 66 + b % 8, mask=rmask, other=0).to(tl.int32)  # the two sub-blocks' scales, a nibble each
    return v, tl.where(rmask, 2 * (sc & 0xF) + 1, 0), tl.where(rmask, 2 * (sc >> 4) + 1, 0)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 74, rmask, 0.125)


FLOAT_FAMILY = Family(T.IQ2_XS, 256, 74, 16, 16, dequant, dot, acc0, total, grid="IQ2_XS")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup,
                                 ihalf=True)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
