"""Q8_0: blocks of 32 int8 values and one f16 scale (34 bytes); a group is eight blocks.

Rows need only be a multiple of 32 values, so the last group of a row may be partial: smask
drops the blocks past its end.

The GEMV step loads the quants as 16-bit pairs (blocks are only 2-byte aligned) and turns each
byte into a float by OR-ing it into the mantissa of 2^23 (one integer op and one add instead of
the conversion unit, which runs at an eighth of the FMA rate on Hopper); the block's scale is
applied once to its 32-value sum.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family

# 2^23 + 128: (byte ^ 0x80) | bits(2^23) read as float is 2^23 + 128 + the int8 value
_MAGIC_BITS = tl.constexpr(0x4B000080)
_MAGIC = tl.constexpr(8388736.0)


@triton.jit
def dequant(w_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + (g * 8 + s) * 34  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    q = tl.load((blk + 2 + i).to(tl.pointer_type(tl.int8)), mask=smask, other=0)
    return q.to(tl.float32) * d


@triton.jit
def dot(w_ptr, row_off, rmask, x_ptr, g, K):
    s = tl.arange(0, 8)[None, :, None]  # block in the group
    j = tl.arange(0, 16)[None, None, :]  # 16-bit pair in the block
    kb = (g * 8 + s) * 32  # [1, 8, 1] first column of each block
    kmask = kb < K
    smask = rmask[:, None, None] & kmask
    blk = w_ptr + row_off[:, None, None] + (g * 8 + s) * 34
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    h = tl.load((blk + 2).to(tl.pointer_type(tl.int16)) + j, mask=smask, other=0).to(tl.int32)
    lo = ((h & 0xFF) ^ _MAGIC_BITS).to(tl.float32, bitcast=True) - _MAGIC
    hi = (((h >> 8) & 0xFF) ^ _MAGIC_BITS).to(tl.float32, bitcast=True) - _MAGIC
    xl = tl.load(x_ptr + kb + 2 * j, mask=kmask, other=0.0)
    xh = tl.load(x_ptr + kb + 2 * j + 1, mask=kmask, other=0.0)
    per_block = tl.sum(lo * xl + hi * xh, 2)  # [BN, 8]; masked blocks have d = 0
    return tl.sum(per_block * tl.sum(d, 2), 1)


FAMILY = Family(T.Q8_0, 32, 34, 8, 32, dequant, dot)
