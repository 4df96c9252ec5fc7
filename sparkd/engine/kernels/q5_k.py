"""Q5_K: 256-value super-blocks (176 bytes): d f16 | dmin f16 | scales[12] | qh[32] | qs[128].

Q4_K's layout plus a fifth bit per value: bit s of qh[i] is the high bit of value i of
sub-block s.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.q4_k import scale_min


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 176
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((blk + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    sc, mn = scale_min(blk + 4, s, smask)
    qh = tl.load(blk + 16 + i, mask=smask, other=0).to(tl.int32)
    qs = tl.load(blk + 48 + (s // 2) * 32 + i, mask=smask, other=0).to(tl.int32)
    q = ((qs >> ((s % 2) * 4)) & 0xF) | (((qh >> s) & 1) << 4)
    return (d * sc) * q.to(tl.float32) - dmin * mn


FAMILY = Family(T.Q5_K, 256, 176, 8, 32, dequant, align=4)
