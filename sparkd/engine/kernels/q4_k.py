"""Q4_K: 256-value super-blocks (144 bytes): d f16 | dmin f16 | scales[12] | qs[128].

Eight sub-blocks of 32 values, each with a 6-bit scale and a 6-bit min packed in the 12 bytes;
value = d*scale*q - dmin*min, with q a nibble (sub-block 2j in the low nibbles of qs[32j:32j+32],
2j+1 in the high ones).

The GEMV step loads qs and the scales as 32-bit words (blocks are 16-byte aligned in a file and
rows start 4-byte aligned in the kernels' buffers), turns nibbles into floats through the
mantissa of 2^23 (no conversion unit), and applies each sub-block's scale and min once to its
sums: sum_i v_i x_i = d*scale*sum_i q_i x_i - dmin*min*sum_i x_i.

The integer step (idot) takes x as Q8_K (int8 quants, one f32 scale per 256, per-32 quant sums)
and does llama.cpp's arithmetic: dp4a of masked nibble words with x words per sub-block, the
6-bit scales and mins applied in integers, one float step per super-block:
d_x * (d * sum_s sc_s * isum_s - dmin * sum_s mn_s * xsum_s).

iblock / igroup hand the integer prefill GEMM (prefill_gemm.gemm at "int8", session 10) a sub-block's
nibbles as int8 with its integer scale and min, and a group's d and dmin: the same sums and float step.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family

_TWO23_BITS = tl.constexpr(0x4B000000)
_TWO23 = tl.constexpr(8388608.0)


@triton.jit
def scale_min(sb, s, mask):
    """The 6-bit (scale, min) of sub-blocks s (any int shape) from the 12 bytes at sb (4-aligned),
    as float32."""
    sc, mn = scale_min_int(sb, s, mask)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def scale_min_int(sb, s, mask):
    """scale_min as int32."""
    p = sb.to(tl.pointer_type(tl.int32))
    return scale_min_words(tl.load(p, mask=mask, other=0), tl.load(p + 1, mask=mask, other=0),
                           tl.load(p + 2, mask=mask, other=0), s)


@triton.jit
def scale_min_words(a, b, c, s):
    """scale_min_int from the 12 scale bytes already in registers as int32 words a, b, c."""
    sh = (s % 4) * 8
    a = (a >> sh) & 0xFF
    b = (b >> sh) & 0xFF
    c = (c >> sh) & 0xFF
    low = s < 4
    sc = tl.where(low, a & 63, (c & 0xF) | ((a >> 2) & 0x30))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 2) & 0x30))
    return sc, mn


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    blk = w_ptr + row_off + g * 144  # [BN, 1, 1]: the file's blocks, header then qs
    return dequant_at(blk + 16, blk, smask)


@triton.jit
def dequant_at(qs, hdr, smask):
    """Group g of each row as floats [BN, 8, 32], its 128 qs bytes at qs and its 16 header bytes at
    hdr (uint8 pointers [BN, 1, 1])."""
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    d = tl.load(hdr.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((hdr + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc, mn = scale_min(hdr + 4, s, smask)
    q = tl.load(qs + (s // 2) * 32 + i, mask=smask, other=0).to(tl.int32)
    q = (q >> ((s % 2) * 4)) & 0xF
    return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def acc0(rmask, EW: tl.constexpr):
    if EW:
        acc = tl.zeros((rmask.shape[0], 4, 8, 2, 4), tl.float32)
    else:
        acc = tl.zeros(rmask.shape, tl.float32)
    return acc


@triton.jit
def total(acc, EW: tl.constexpr):
    if EW:
        acc = tl.sum(tl.sum(tl.sum(tl.sum(acc, 4), 3), 2), 1)
    return acc


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    j = tl.arange(0, 4)[None, :, None, None, None]  # 32-byte chunk of qs: sub-blocks 2j, 2j+1
    w = tl.arange(0, 8)[None, None, :, None, None]  # word in the chunk
    h = tl.arange(0, 2)[None, None, None, :, None]  # low nibble: sub-block 2j, high: 2j+1
    b = tl.arange(0, 4)[None, None, None, None, :]  # byte in the word
    blk = w_ptr + row_off[:, None, None, None, None] + g * 144  # [BN, 1, 1, 1, 1]
    m = rmask[:, None, None, None, None]
    words = tl.load((blk + 16).to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)
    q = (((words >> (b * 8 + h * 4)) & 0xF) | _TWO23_BITS).to(tl.float32, bitcast=True) - _TWO23
    x = tl.load(x_ptr + g * 256 + (2 * j + h) * 32 + w * 4 + b)  # [1, 4, 8, 2, 4]
    if EW:
        d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
        dmin = tl.load((blk + 2).to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
        sc, mn = scale_min(blk + 4, 2 * j + h, m)  # [BN, 4, 1, 2, 1]
        acc += (q * (d * sc) - dmin * mn) * x
    else:  # scale and min once per sub-block sum
        qx = tl.sum(tl.sum(q * x, 4), 2)  # [BN, 4, 2]: sum of q*x per sub-block 2j+h
        xs = tl.sum(tl.sum(x, 4), 2)  # [1, 4, 2]
        blk3, m3 = w_ptr + row_off[:, None, None] + g * 144, rmask[:, None, None]
        d = tl.load(blk3.to(tl.pointer_type(tl.float16)), mask=m3, other=0.0).to(tl.float32)
        dmin = tl.load((blk3 + 2).to(tl.pointer_type(tl.float16)), mask=m3, other=0.0).to(tl.float32)
        s = 2 * tl.arange(0, 4)[None, :, None] + tl.arange(0, 2)[None, None, :]  # [1, 4, 2]
        sc, mn = scale_min(blk3 + 4, s, m3)
        acc += tl.sum(tl.sum((d * sc) * qx - (dmin * mn) * xs, 2), 1)
    return acc


@triton.jit
def idot_rows_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU: tl.constexpr):
    """idot reducing each super-block to one float per row (acc [BN]): group g of each row, its
    128 qs bytes at qs and its 16 header bytes (d, dmin, scales) at hdr (uint8 pointers [BN])."""
    j = tl.arange(0, 4)[None, :, None]  # 32-byte chunk of qs: sub-blocks 2j (low), 2j+1 (high)
    w = tl.arange(0, 8)[None, None, :]  # word in the chunk
    m = rmask[:, None, None]
    words = tl.load(qs[:, None, None].to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)
    xw = xw_ptr + g * 64 + j * 16 + w  # x words of sub-block 2j; 2j+1 follows 8 words later
    lo = tl.sum(dp4a(words & 0x0F0F0F0F, tl.load(xw), EMU), 2)  # [BN, 4]
    hi = tl.sum(dp4a((words >> 4) & 0x0F0F0F0F, tl.load(xw + 8), EMU), 2)
    s = 2 * tl.arange(0, 4)[None, :]  # [1, 4]
    sc_lo, mn_lo = scale_min_int(hdr[:, None] + 4, s, rmask[:, None])
    sc_hi, mn_hi = scale_min_int(hdr[:, None] + 4, s + 1, rmask[:, None])
    xs = xs_ptr + g * 8 + s
    qsum = tl.sum(sc_lo * lo + sc_hi * hi, 1)  # [BN], int32
    msum = tl.sum(mn_lo * tl.load(xs) + mn_hi * tl.load(xs + 1), 1)
    d = tl.load(hdr.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    dmin = tl.load((hdr + 2).to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    return acc + tl.load(xd_ptr + g) * (d * qsum.to(tl.float32) - dmin * msum.to(tl.float32))


@triton.jit
def idot_tile_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU: tl.constexpr):
    """idot_rows_at into the elementwise tile acc [BN, 4, 8] (no cross-thread reduction per group)."""
    j = tl.arange(0, 4)[None, :, None]  # 32-byte chunk of qs: sub-blocks 2j (low), 2j+1 (high)
    w = tl.arange(0, 8)[None, None, :]  # word in the chunk
    hdr = hdr[:, None, None]  # [BN, 1, 1]
    m = rmask[:, None, None]
    words = tl.load(qs[:, None, None].to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)  # [BN, 4, 8]
    # x words of sub-block 2j (2j+1 follows 8 words later), loaded in the words' own shape: each
    # thread reads the x words it multiplies (a broadcast [1, 4, 8] load costs a layout conversion
    # through shared memory with one warp)
    xw = xw_ptr + g * 64 + j * 16 + w + tl.zeros(words.shape, tl.int32)
    sc_lo, mn_lo = scale_min_int(hdr + 4, 2 * j, m)  # [BN, 4, 1]
    sc_hi, mn_hi = scale_min_int(hdr + 4, 2 * j + 1, m)
    isum = sc_lo * dp4a(words & 0x0F0F0F0F, tl.load(xw), EMU) \
        + sc_hi * dp4a((words >> 4) & 0x0F0F0F0F, tl.load(xw + 8), EMU)  # [BN, 4, 8]
    xs = xs_ptr + g * 8 + 2 * j
    msum = mn_lo * tl.load(xs) + mn_hi * tl.load(xs + 1)  # [BN, 4, 1]
    dx = tl.load(xd_ptr + g)
    d = tl.load(hdr.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32) * dx
    dmin = tl.load((hdr + 2).to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32) * dx
    # the min term once per sub-block: an eighth of it on each of its 8 words
    return acc + (d * isum.to(tl.float32) - (dmin * 0.125) * msum.to(tl.float32))


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    blk = w_ptr + row_off + g * 144  # the file's blocks: header, then qs
    if EW:
        acc = idot_tile_at(blk + 16, blk, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    else:
        acc = idot_rows_at(blk + 16, blk, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    return acc


@triton.jit
def iblock_at(qs, hdr, rmask, s):
    """Sub-block s of a group of each row, its 128 qs bytes at qs and its 16 header bytes at hdr
    (uint8 pointers [BN]), as family.iblock's (quants int8 [BN, 32] 0..15, scale int32 [BN], min int32 [BN])."""
    q = tl.load(qs[:, None] + (s // 2) * 32 + tl.arange(0, 32)[None, :], mask=rmask[:, None], other=0)
    q = (q.to(tl.int32) >> ((s % 2) * 4)) & 0xF
    sc, mn = scale_min_int(hdr + 4, s, rmask)
    return q.to(tl.int8), sc, mn


@triton.jit
def kblock_at(qs, hdr, rmask, s):
    """iblock_at from 8 word loads a row (family.kblock, the block's order): byte 4w + j of the chunk is word w's byte j."""
    words = tl.load(qs.to(tl.pointer_type(tl.int32))[:, None] + (s // 2) * 8 + tl.arange(0, 8)[None, :],
                    mask=rmask[:, None], other=0)  # [BN, 8]
    j = tl.arange(0, 4)[None, None, :]
    q = (tl.reshape(words, (words.shape[0], 8, 1)) >> (8 * j + 4 * (s % 2))) & 0xF  # [BN, 8, 4]
    sc, mn = scale_min_int(hdr + 4, s, rmask)
    return tl.reshape(q, (words.shape[0], 32)).to(tl.int8), sc, mn


@triton.jit
def igroup_at(hdr, rmask):
    """(d, dmin) float32 [BN] from the 16 header bytes at hdr (uint8 pointers [BN])."""
    d = tl.load(hdr.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    dmin = tl.load((hdr + 2).to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    return d, dmin


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    blk = w_ptr + row_off + (b // 8) * 144
    return iblock_at(blk + 16, blk, rmask, b % 8)


@triton.jit
def kblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    blk = w_ptr + row_off + (b // 8) * 144
    return kblock_at(blk + 16, blk, rmask, b % 8)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    return igroup_at(w_ptr + row_off + g * 144, rmask)


FAMILY = Family(T.Q4_K, 256, 144, 8, 32, dequant, dot, acc0, total, align=4, idot=idot,
                act_fmt=Q8_K, iacc=(4, 8), isplit=4, iblock=iblock, igroup=igroup,
                kblock=kblock)
