"""IQ1_S: 256-value super-blocks (50 bytes): d f16 | qs[32] | qh u16[8].

Eight sub-blocks of 32 values; qh[s] holds four 3-bit high index bits (bits 3l..), a 3-bit scale
(bits 12..14) and the sign of the delta (bit 15). Value i of sub-block s is
d * (2 * scale + 1) * (grid[qs[4s + i//8] | high bits << 8][i%8] +- 1/8), grid being ggml's
2048 x 8 iq1s codebook of -1/0/1.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family

_DELTA = tl.constexpr(0.125)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + g * 50
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    qh = tl.load((blk + 34).to(tl.pointer_type(tl.uint16)) + s, mask=smask, other=0).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)
    delta = tl.where((qh & 0x8000) == 0, _DELTA, -_DELTA)
    low = tl.load(blk + 2 + 4 * s + i // 8, mask=smask, other=0).to(tl.int32)
    idx = low | (((qh >> (3 * (i // 8))) & 7) << 8)
    grid = tl.load(aux_ptr + idx * 8 + i % 8).to(tl.float32)
    return dl * (grid + delta)
FAMILY = Family(T.IQ1_S, 256, 50, 8, 32, dequant, grid="IQ1_S")
