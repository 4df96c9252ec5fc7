"""IQ2_XS: 256-value super-blocks (74 bytes): d f16 | qs u16[32] | scales[8].

Sixteen sub-blocks of 16 values with 4-bit scales (nibble s%2 of scales[s//2]); each qs word
holds a 9-bit index into ggml's 512 x 8 iq2xs codebook (low bits) and a 7-bit sign index (high).
Value i of sub-block s comes from word 2s + i//8: d * (0.5 + scale) / 4 * grid[index][i%8], negated
when bit i%8 of ksigns[sign index] is set.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.grids import sign_bit


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]
    i = tl.arange(0, 16)[None, None, :]
    blk = w_ptr + row_off + g * 74
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = tl.load(blk + 66 + s // 2, mask=smask, other=0).to(tl.int32)
    db = d * (0.5 + ((sc >> ((s % 2) * 4)) & 0xF).to(tl.float32)) * 0.25
    q = tl.load((blk + 2).to(tl.pointer_type(tl.uint16)) + 2 * s + i // 8, mask=smask, other=0).to(tl.int32)
    grid = tl.load(aux_ptr + (q & 511) * 8 + i % 8).to(tl.float32)
    neg = sign_bit(q >> 9, i % 8)
    return (db * grid) * (1 - 2 * neg).to(tl.float32)


FAMILY = Family(T.IQ2_XS, 256, 74, 16, 16, dequant, grid="IQ2_XS")
