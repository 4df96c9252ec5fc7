"""IQ2_XS: 256-value super-blocks (74 bytes): d f16 | qs u16[32] | scales[8].

Sixteen sub-blocks of 16 values with 4-bit scales (nibble s%2 of scales[s//2]); each qs word
holds a 9-bit index into ggml's 512 x 8 iq2xs codebook (low bits) and a 7-bit sign index (high).
Value i of sub-block s comes from word 2s + i//8: d * (0.5 + scale) / 4 * grid[index][i%8], negated
when bit i%8 of ksigns[sign index] is set.

The GEMV step works per qs word (iq_common's [BN, 8, 4, 2, 4] layout, word 4a + l, scale
nibble l//2 of scales[a]): grid values loaded as floats 4 at a time, signs flipped as a bit.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import acc0, accumulate, ksigns, negate, total


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


FAMILY = Family(T.IQ2_XS, 256, 74, 16, 16, dequant, dot, acc0, total, grid="IQ2_XS")
