"""Q6_K: 256-value super-blocks (210 bytes): ql[128] | qh[64] | scales int8[16] | d f16.

Sixteen sub-blocks of 16 values with int8 scales; value v = d*scale[v//16]*(q-32), q six bits:
the low four from nibble (v//64)%2 of ql[64*(v//128) + v%64], the high two from bits
2*((v//32)%4) of qh[32*(v//128) + v%32].
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 16)[None, :, None]
    t = tl.arange(0, 16)[None, None, :]
    v = s * 16 + t  # [1, 16, 16] value index in the super-block
    h = v // 128
    blk = w_ptr + row_off + g * 210
    d = tl.load((blk + 208).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc = tl.load((blk + 192 + s).to(tl.pointer_type(tl.int8)), mask=smask, other=0).to(tl.float32)
    ql = tl.load(blk + 64 * h + v % 64, mask=smask, other=0).to(tl.int32)
    qh = tl.load(blk + 128 + 32 * h + v % 32, mask=smask, other=0).to(tl.int32)
    q = ((ql >> (((v // 64) % 2) * 4)) & 0xF) | (((qh >> (((v // 32) % 4) * 2)) & 3) << 4)
    return (d * sc) * (q.to(tl.float32) - 32.0)


FAMILY = Family(T.Q6_K, 256, 210, 16, 16, dequant)
