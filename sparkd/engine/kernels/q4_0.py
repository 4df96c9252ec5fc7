"""Q4_0: blocks of 32 values (18 bytes): d f16 | qs[16]; value = d*(q-8) with q the low nibbles
of qs for values 0..15 and the high nibbles for 16..31. A group is eight blocks; rows need only
be a multiple of 32 values, so smask drops the blocks past a row's end (as in Q8_0).
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + (g * 8 + s) * 18  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    qs = tl.load(blk + 2 + i % 16, mask=smask, other=0).to(tl.int32)
    q = (qs >> ((i // 16) * 4)) & 0xF
    return d * (q - 8).to(tl.float32)


FAMILY = Family(T.Q4_0, 32, 18, 8, 32, dequant)
