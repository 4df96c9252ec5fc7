"""Q3_K: 256-value super-blocks (110 bytes): hmask[32] | qs[64] | scales[12] | d f16.

Sixteen sub-blocks of 16 values with 6-bit scales (low nibbles in bytes 96..103, sub-blocks 0-7
low nibble and 8-15 high nibble; high two bits in bytes 104..107); value v = d*(scale-32)*q with
q = two bits of qs as in Q2_K, minus 4 when bit v//32 of hmask[v%32] is clear.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]
    t = tl.arange(0, 16)[None, None, :]
    v = s * 16 + t
    blk = w_ptr + row_off + g * 110
    d = tl.load((blk + 108).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    lo = tl.load(blk + 96 + s % 8, mask=smask, other=0).to(tl.int32)
    hi = tl.load(blk + 104 + s % 4, mask=smask, other=0).to(tl.int32)
    scale = (((lo >> ((s // 8) * 4)) & 0xF) | (((hi >> ((s // 4) * 2)) & 3) << 4)) - 32
    qs = tl.load(blk + 32 + 32 * (v // 128) + v % 32, mask=smask, other=0).to(tl.int32)
    hm = tl.load(blk + v % 32, mask=smask, other=0).to(tl.int32)
    q = ((qs >> (((v // 32) % 4) * 2)) & 3) - ((((hm >> (v // 32)) & 1) ^ 1) << 2)
    return (d * scale.to(tl.float32)) * q.to(tl.float32)


FAMILY = Family(T.Q3_K, 256, 110, 16, 16, dequant)
