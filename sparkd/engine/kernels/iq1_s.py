"""IQ1_S: 256-value super-blocks (50 bytes): d f16 | qs[32] | qh u16[8].

Eight sub-blocks of 32 values; qh[s] holds four 3-bit high index bits (bits 3l..), a 3-bit scale
(bits 12..14) and the sign of the delta (bit 15). Value i of sub-block s is
d * (2 * scale + 1) * (grid[qs[4s + i//8] | high bits << 8][i%8] +- 1/8), grid being ggml's
2048 x 8 iq1s codebook of -1/0/1.

The GEMV step works per grid entry (iq_common's [BN, 8, 4, 2, 4] layout): one index per 8
values, grid values loaded as floats 4 at a time.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family
from sparkd.engine.kernels.iq_common import acc0, accumulate, total

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
    grid = tl.load(aux_ptr + idx * 8 + i % 8)
    return dl * (grid + delta)
@triton.jit
def dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    a = tl.arange(0, 8)[None, :, None, None, None]  # sub-block
    l = tl.arange(0, 4)[None, None, :, None, None]  # grid entry
    h = tl.arange(0, 2)[None, None, None, :, None]  # half of the entry
    b = tl.arange(0, 4)[None, None, None, None, :]  # value in the half
    m = rmask[:, None, None, None, None]
    blk = w_ptr + row_off[:, None, None, None, None] + g * 50  # [BN, 1, 1, 1, 1]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    qh = tl.load((blk + 34).to(tl.pointer_type(tl.uint16)) + a, mask=m, other=0).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)  # [BN, 8, 1, 1, 1]
    delta = tl.where((qh & 0x8000) == 0, _DELTA, -_DELTA)
    low = tl.load(blk + 2 + 4 * a + l, mask=m, other=0).to(tl.int32)  # [BN, 8, 4, 1, 1]
    idx = low | (((qh >> (3 * l)) & 7) << 8)
    q = tl.load(aux_ptr + idx * 8 + 4 * h + b) + delta  # [BN, 8, 4, 2, 4]
    x = tl.load(x_ptr + g * 256 + 32 * a + 8 * l + 4 * h + b)  # [1, 8, 4, 2, 4]
    return accumulate(acc, q, x, dl, EW)


FAMILY = Family(T.IQ1_S, 256, 50, 8, 32, dequant, dot, acc0, total, grid="IQ1_S")
