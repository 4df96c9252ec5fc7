"""Q8_0: blocks of 32 int8 values and one f16 scale (34 bytes); a group is eight blocks.

Rows need only be a multiple of 32 values, so the last group of a row may be partial: smask
drops the blocks past its end.

The GEMV step loads the quants as 16-bit pairs (blocks are only 2-byte aligned) and turns each
byte into a float by OR-ing it into the mantissa of 2^23 (one integer op and one add instead of
the conversion unit, which runs at an eighth of the FMA rate on Hopper); the block's scale is
applied once to its 32-value sum.

The integer step (idot) takes x as Q8_0 blocks too and multiplies 4 quants at a time with dp4a
on 32-bit words built from two 16-bit loads; one float step per block: d_w * d_x * sum.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.act_quant import Q8_0, dp4a
from sparkd.engine.kernels.family import Family

# 2^23 + 128: (byte ^ 0x80) | bits(2^23) read as float is 2^23 + 128 + the int8 value
_MAGIC_BITS = tl.constexpr(0x4B000080)
_MAGIC = tl.constexpr(8388736.0)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + (g * 8 + s) * 34  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    q = tl.load((blk + 2 + i).to(tl.pointer_type(tl.int8)), mask=smask, other=0)
    return q.to(tl.float32) * d


@triton.jit
def acc0(rmask, EW: tl.constexpr):
    if EW:
        acc = tl.zeros((rmask.shape[0], 8, 16, 2), tl.float32)
    else:
        acc = tl.zeros(rmask.shape, tl.float32)
    return acc


@triton.jit
def total(acc, EW: tl.constexpr):
    if EW:
        acc = tl.sum(tl.sum(tl.sum(acc, 3), 2), 1)
    return acc


@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    s = tl.arange(0, 8)[None, :, None, None]  # block in the group
    j = tl.arange(0, 16)[None, None, :, None]  # 16-bit pair in the block
    t = tl.arange(0, 2)[None, None, None, :]  # byte in the pair
    kb = (g * 8 + s) * 32  # first column of each block
    kmask = kb < K
    smask = rmask[:, None, None, None] & kmask
    blk = w_ptr + row_off[:, None, None, None] + (g * 8 + s) * 34  # [BN, 8, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    h = tl.load((blk + 2).to(tl.pointer_type(tl.int16)) + j, mask=smask, other=0).to(tl.int32)
    q = (((h >> (t * 8)) & 0xFF) ^ _MAGIC_BITS).to(tl.float32, bitcast=True) - _MAGIC
    x = tl.load(x_ptr + kb + 2 * j + t, mask=kmask, other=0.0)  # [1, 8, 16, 2], contiguous
    if EW:  # masked blocks have d = 0
        acc += (q * x) * d
    else:
        acc += tl.sum(tl.sum(tl.sum(q * x, 3), 2) * tl.sum(tl.sum(d, 3), 2), 1)
    return acc


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    b = g * 8 + tl.arange(0, 8)[None, :, None]  # block index along the row [1, 8, 1]
    w = tl.arange(0, 8)[None, None, :]  # 32-bit word in the block
    bmask = b * 32 < K
    m = rmask[:, None, None] & bmask
    blk = w_ptr + row_off[:, None, None] + b * 34  # [BN, 8, 1]
    half = (blk + 2).to(tl.pointer_type(tl.int16)) + 2 * w
    lo = tl.load(half, mask=m, other=0).to(tl.int32) & 0xFFFF
    hi = tl.load(half + 1, mask=m, other=0).to(tl.int32)
    dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)
    if EW:  # into the elementwise tile acc [BN, 8, 8]
        # x's words and the block scales loaded in the weight words' [BN, 8, 8] shape (repeats
        # served by the cache): all operands get one register layout, so the loop has no
        # layout conversion through shared memory and no barrier (bench/kernels_sass.py)
        full = tl.zeros(half.shape, tl.int32)
        xw = tl.load(xw_ptr + b * 8 + w + full, mask=m, other=0)
        d = tl.load(blk.to(tl.pointer_type(tl.float16)) + full, mask=m, other=0.0).to(tl.float32)
        acc += dp4a(lo | (hi << 16), xw, EMU).to(tl.float32) * (d * dx)
    else:  # a float per block, then one per row: acc [BN]
        xw = tl.load(xw_ptr + b * 8 + w, mask=bmask, other=0)  # [1, 8, 8]
        d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
        isum = tl.sum(dp4a(lo | (hi << 16), xw, EMU), 2)  # [BN, 8]
        acc += tl.sum(isum.to(tl.float32) * tl.sum(d * dx, 2), 1)
    return acc


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    blk = w_ptr + row_off + b * 34  # [BN] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    q = tl.load((blk[:, None] + 2 + tl.arange(0, 32)[None, :]).to(tl.pointer_type(tl.int8)),
                mask=rmask[:, None], other=0)
    return q, d


@triton.jit
def kblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """iblock from 16 halfword loads a row (the quants are 2-byte aligned in a 34-byte block)."""
    blk = w_ptr + row_off + b * 34  # [BN] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    half = tl.load((blk + 2).to(tl.pointer_type(tl.int16))[:, None] + tl.arange(0, 16)[None, :], mask=rmask[:, None],
                   other=0)  # [BN, 16]
    j = tl.arange(0, 2)[None, None, :]
    q = (tl.reshape(half.to(tl.int32), (half.shape[0], 16, 1)) << (24 - 8 * j)) >> 24  # [BN, 16, 2], sign-extended
    return tl.reshape(q, (half.shape[0], 32)).to(tl.int8), d


FAMILY = Family(T.Q8_0, 32, 34, 8, 32, dequant, dot, acc0, total, idot=idot, act_fmt=Q8_0, iacc=(8, 8),
                iblock=iblock, kblock=kblock)
