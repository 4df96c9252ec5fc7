"""Q8_0: blocks of 32 int8 values and one f16 scale (34 bytes); a group is eight blocks.

Rows need only be a multiple of 32 values, so the last group of a row may be partial: smask
drops the blocks past its end.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def dequant(w_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + (g * 8 + s) * 34  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    q = tl.load((blk + 2 + i).to(tl.pointer_type(tl.int8)), mask=smask, other=0)
    return q.to(tl.float32) * d


FAMILY = Family(T.Q8_0, 32, 34, 8, 32, dequant)
