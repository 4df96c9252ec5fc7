"""IQ2_XXS: 256-value super-blocks (66 bytes): d f16 | 8 x (4 grid indices u8 | u32 aux).

Eight sub-blocks of 32 values; sub-block s's aux word holds four 7-bit sign indices (bits 7l..)
and a 4-bit scale (bits 28..31). Value i of sub-block s is
d * (0.5 + scale) / 4 * grid[index i//8][i%8] * (-1 if bit i%8 of ksigns[sign index i//8]),
grid being ggml's 256 x 8 iq2xxs codebook (grids.grid_table).

The GEMV step works per grid entry (iq_common's [BN, 8, 4, 2, 4] layout): one index byte and
one sign byte per 8 values, grid values loaded as floats 4 at a time, signs flipped as a bit.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import acc0, accumulate, ksigns, load_u32, negate, total


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


FAMILY = Family(T.IQ2_XXS, 256, 66, 8, 32, dequant, dot, acc0, total, grid="IQ2_XXS")
