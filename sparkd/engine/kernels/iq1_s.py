"""IQ1_S: 256-value super-blocks (50 bytes): d f16 | qs[32] | qh u16[8].

Eight sub-blocks of 32 values; qh[s] holds four 3-bit high index bits (bits 3l..), a 3-bit scale
(bits 12..14) and the sign of the delta (bit 15). Value i of sub-block s is
d * (2 * scale + 1) * (grid[qs[4s + i//8] | high bits << 8][i%8] +- 1/8), grid being ggml's
2048 x 8 iq1s codebook of -1/0/1.

The GEMV step works per grid entry (iq_common's [BN, 8, 4, 2, 4] layout): one index per 8
values, grid values loaded as floats 4 at a time.

The integer step (idot; x as Q8_K, act_round's format for IQ1_S) is llama.cpp's arithmetic: per entry its two
int8 words of -1/0/1 (grids.grid_words; no signs to apply) dp4a against x; per sub-block sum * (2 * scale + 1)
and the delta's +-(2 * scale + 1) times x's sum of the sub-block's 32 quants (Q8_K's per-32 sums), both in
integers as 8 * sum + delta sum (= 8 * (sum + sum / 8): below 2^24, so its float is exact, as llama.cpp's
float sum + 0.125 * delta sum is), one float step d * d_x / 8 per group. It is the family's path by default
(since session 23, timed on the H200: 3.5-4.7x the float dot); SPARKD_IQ1_S_INT=0 (read at import) the float one.

iblock / igroup (session 23, iqgemm) hand the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8") a
sub-block's 8 * grid value + delta sign (-9 to 9: the delta's x-sum term in tl.dot's exact sum) as int8 from the
same int8 codebook (aux_ptr), with 2 * scale + 1 (a min of 0), and igroup a super-block's d / 8: the GEMM's exact
integer sums are the idot's, one float step per group. With SPARKD_IQ1_S_INT=0 prompts run the float GEMM at "ieee"
(no iblock), the way before.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_K, dp4a_add
from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import acc0, accumulate, iadd, igroup_d, load_pair, load_u32, total, word_bytes

INT_ENV = "SPARKD_IQ1_S_INT"  # "0": the float path (no integer step)

_DELTA = tl.constexpr(0.125)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 50
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    qh = tl.load((blk + 34).to(tl.pointer_type(tl.uint16)) + s, mask=smask, other=0).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)
    delta = tl.where((qh & 0x8000) == 0, _DELTA, -_DELTA)
    low = tl.load(blk + 2 + 4 * s + i // 8, mask=smask, other=0).to(tl.int32)
    idx = low | (((qh >> (3 * (i // 8))) & 7) << 8)
    grid = tl.load(aux_ptr + idx * 8 + i % 8)
    return dl * (grid + delta)
@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # sub-block
    l = tl.arange(0, 4)[None, None, :, None, None]  # grid entry
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 50  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    qh = tl.load((blk + 34).to(tl.pointer_type(tl.uint16)) + a, mask=m, other=0).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)  # [BN, 8, 1, 1, 1]
    delta = tl.where((qh & 0x8000) == 0, _DELTA, -_DELTA)
    low = tl.load(blk + 2 + 4 * a + l, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 1, 1]
    idx = low | (((qh >> (3 * l)) & 7) << 8)
    q = tl.load(aux_ptr + idx * 8 + 4 * h + b) + delta  # [BN, 8, 4, 2, 4]
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, dl, EW)


@triton.jit
def _isums(blk, aux_ptr, rmask, xw, xs, EMU: tl.constexpr):
    """A group's integer sums as [BN, 8] int32, one a (row, sub-block): (8 * its 4 entries' values times x's
    words (xw: the group's first) + delta sign * x's sum of the sub-block (xs: the group's 8 sums)) times
    2 * scale + 1. blk [BN]: the rows' blocks; one thread a (row, sub-block), as iq2_xxs._isums."""
    s = tl.arange(0, 8)[None, :]
    m = rmask[:, None]
    low = load_u32(blk[:, None] + 2 + 4 * s, m)  # the 4 entries' index bytes
    qh = tl.load((blk[:, None] + 34 + 2 * s).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)
    x = xw + 8 * s + tl.zeros(qh.shape, tl.int32)
    isum = tl.zeros(qh.shape, tl.int32)
    for l in tl.static_range(4):
        w0, w1 = load_pair(aux_ptr + 2 * (((low >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8)))
        x0, x1 = load_pair(x + 2 * l)
        isum = dp4a_add(w1, x1, dp4a_add(w0, x0, isum, EMU), EMU)
    xsum = tl.load(xs + s + tl.zeros(qh.shape, tl.int32))
    delta = tl.where((qh & 0x8000) == 0, xsum, -xsum)
    return (8 * isum + delta) * (2 * ((qh >> 12) & 7) + 1)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 50
    isum = _isums(blk, aux_ptr, rmask, xw_ptr + g * 64, xs_ptr + g * 8, EMU)
    return iadd(acc, isum, blk, rmask, tl.load(xd_ptr + g) * 0.125, EW)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock with igroup: sub-block b % 8 of super-block b // 8 as 8 * grid value + delta sign (int8 [BN, 32]:
    -9 to 9; word w of the int8 codebook (aux_ptr) entry w // 2), 2 * scale + 1 (int32 [BN], 0 outside rmask) and a
    min of 0. The delta in the quants: tl.dot sums 8 * isum + delta sign * x's sum of the block, the idot's integer,
    exactly (no float min term: llama.cpp adds the delta before its one float step); igroup's d / 8 the float step."""
    blk = w_ptr + row_off + (b // 8) * 50  # [BN]
    w = tl.arange(0, 8)[None, :]
    low = tl.load(blk[:, None] + 2 + 4 * (b % 8) + w // 2, mask=rmask[:, None], other=0).to(tl.int32)  # [BN, 8]
    qh = tl.load((blk + 34 + 2 * (b % 8)).to(tl.pointer_type(tl.uint16)), mask=rmask, other=0).to(tl.int32)
    q = tl.load(aux_ptr + 2 * (low | (((qh[:, None] >> (3 * (w // 2))) & 7) << 8)) + w % 2)  # [BN, 8]
    delta = tl.where((qh & 0x8000) == 0, 1, -1)[:, None]
    v = (8 * word_bytes(q).to(tl.int32) + delta).to(tl.int8)
    return v, tl.where(rmask, 2 * ((qh >> 12) & 7) + 1, 0), tl.zeros(rmask.shape, tl.int32)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_d(w_ptr + row_off + g * 50, rmask, 0.125)


FLOAT_FAMILY = Family(T.IQ1_S, 256, 50, 8, 32, dequant, dot, acc0, total, grid="IQ1_S")
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_K, iacc=(8, 1), iblock=iblock, igroup=igroup)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
