"""Q5_1: blocks of 32 values (24 bytes): d f16 | m f16 | qh u32 | qs[16]; value i = d * q + m, q's 5 bits as Q5_0's
(q5_0.quants).

What llama-quantize writes for Q5_K where a file's rows are not whole 256-value groups (llama-quant.cpp's fallback:
Q5_K -> Q5_1; MLA's 128-wide attn_k_b in a Q5_K_M file). The float path only: llama.cpp multiplies it with x as Q8_1
blocks (their sums fold the min), which act_quant does not make; the caller rounds x to them (act_round: the same
values as Q8_0's) and the kernels multiply the dequantized values in float32.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels import q4_0, q5_0
from sparkd.engine.kernels.family import Family

BLOCK_BYTES = tl.constexpr(24)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    blk = w_ptr + row_off + (g * 8 + tl.arange(0, 8)[None, :, None]) * BLOCK_BYTES  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    m = tl.load((blk + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    q = q5_0.quants(blk + 8, q4_0.word16(blk + 4, smask), tl.arange(0, 32)[None, None, :], smask)
    return d * q.to(tl.float32) + m


FAMILY = Family(T.Q5_1, 32, BLOCK_BYTES.value, 8, 32, dequant)
