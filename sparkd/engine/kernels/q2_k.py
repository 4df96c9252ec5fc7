"""Q2_K: 256-value super-blocks (84 bytes): scales[16] | qs[64] | d f16 | dmin f16.

Sixteen sub-blocks of 16 values, each byte of scales a 4-bit scale (low) and 4-bit min (high);
value v = d*scale*q - dmin*min with q = bits 2*((v//32)%4) of qs[32*(v//128) + v%32].
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
    blk = w_ptr + row_off + g * 84
    d = tl.load((blk + 80).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((blk + 82).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    scm = tl.load(blk + s, mask=smask, other=0).to(tl.int32)
    qs = tl.load(blk + 16 + 32 * (v // 128) + v % 32, mask=smask, other=0).to(tl.int32)
    q = (qs >> (((v // 32) % 4) * 2)) & 3
    return (d * (scm & 0xF).to(tl.float32)) * q.to(tl.float32) - dmin * (scm >> 4).to(tl.float32)


FAMILY = Family(T.Q2_K, 256, 84, 16, 16, dequant)
