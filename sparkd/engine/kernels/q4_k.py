"""Q4_K: 256-value super-blocks (144 bytes): d f16 | dmin f16 | scales[12] | qs[128].

Eight sub-blocks of 32 values, each with a 6-bit scale and a 6-bit min packed in the 12 bytes;
value = d*scale*q - dmin*min, with q a nibble (sub-block 2j in the low nibbles of qs[32j:32j+32],
2j+1 in the high ones).
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def scale_min(sb, smask):
    """The 6-bit (scale, min) of sub-block s (int32 [1, 8, 1]) from the 12 bytes at sb."""
    s = tl.arange(0, 8)[None, :, None]
    j = s % 4
    a = tl.load(sb + j, mask=smask, other=0).to(tl.int32)
    b = tl.load(sb + j + 4, mask=smask, other=0).to(tl.int32)
    c = tl.load(sb + j + 8, mask=smask, other=0).to(tl.int32)
    low = s < 4
    sc = tl.where(low, a & 63, (c & 0xF) | ((a >> 2) & 0x30))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 2) & 0x30))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def dequant(w_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 144  # [BN, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((blk + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc, mn = scale_min(blk + 4, smask)
    qs = tl.load(blk + 16 + (s // 2) * 32 + i, mask=smask, other=0).to(tl.int32)
    q = (qs >> ((s % 2) * 4)) & 0xF
    return (d * sc) * q.to(tl.float32) - dmin * mn


FAMILY = Family(T.Q4_K, 256, 144, 8, 32, dequant)
