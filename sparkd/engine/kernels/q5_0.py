"""Q5_0: blocks of 32 values (22 bytes): d f16 | qh u32 | qs[16]; value i = d * (q - 16), q's low 4 bits the low
nibble of qs[i] (values 0-15) or the high one of qs[i - 16] (16-31), Q4_0's, and its fifth bit bit i of qh.

What llama-quantize writes where a Q4_K_M file's rows are not whole 256-value groups: MLA's attn_k_b (128 wide) in
DeepSeek V3's and the Kimis' files (llama-quant.cpp's fallback: Q4_K -> Q5_0). A group is eight blocks; rows need
only be a multiple of 32 values (smask / bmask drop the blocks past a row's end, as Q4_0's).

The integer step (idot) is Q4_0's (q4_0.add_offset_words: x as Q8_0 blocks, llama.cpp's vec_dot type for Q5_0) with
each word's fifth bits spread in from qh and -16 for the offset. 22-byte blocks are only 2-byte aligned: qh and
the qs words are built from 16-bit loads. iblock hands the integer prefill GEMM a block's q - 16 as int8 and d.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels import q4_0
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family

BLOCK_BYTES = tl.constexpr(22)
_MINUS16 = tl.constexpr(-252645136)  # 0xF0F0F0F0: four int8 -16s


@triton.jit
def _fifth_bits(h):
    """Four bits (int32, 0-15) as bit 4 of each byte of a word: bit k -> bit 8k + 4."""
    return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25)


@triton.jit
def quants(qs_ptr, qh, i, mask):
    """Values i's 5-bit quants (int32, 0-31) from the blocks' qs at qs_ptr and their qh words (also Q5_1's)."""
    qs = tl.load(qs_ptr + i % 16, mask=mask, other=0).to(tl.int32)
    return ((qs >> ((i // 16) * 4)) & 0xF) | (((qh >> i) & 1) << 4)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    blk = w_ptr + row_off + (g * 8 + tl.arange(0, 8)[None, :, None]) * BLOCK_BYTES  # [BN, 8, 1] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    q = quants(blk + 6, q4_0.word16(blk + 2, smask), tl.arange(0, 32)[None, None, :], smask)
    return d * (q - 16).to(tl.float32)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    b, w, bmask, m, blk = q4_0.group_blocks(w_ptr, row_off, rmask, g, K, BLOCK_BYTES)
    q = q4_0.word16(blk + 6 + 4 * w, m)  # [BN, 8, 4]: qs bytes 4w..4w+3
    qh = q4_0.word16(blk + 2, m)  # [BN, 8, 1]
    lo = (q & 0x0F0F0F0F) | _fifth_bits((qh >> (4 * w)) & 0xF)  # values 4w..4w+3
    hi = ((q >> 4) & 0x0F0F0F0F) | _fifth_bits((qh >> (16 + 4 * w)) & 0xF)  # values 16 + 4w..
    return q4_0.add_offset_words(acc, lo, hi, _MINUS16, blk, xw_ptr, xd_ptr, b, w, m, bmask, EW, EMU)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock without igroup (Q8_0's form): block b as q - 16 (int8 [BN, 32]) and d (float32 [BN], 0 for rows
    not in rmask)."""
    blk = w_ptr + row_off + b * BLOCK_BYTES  # [BN] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    q = quants(blk[:, None] + 6, q4_0.word16(blk + 2, rmask)[:, None], tl.arange(0, 32)[None, :], rmask[:, None])
    return (q - 16).to(tl.int8), d


FAMILY = dataclasses.replace(Family(T.Q5_0, 32, BLOCK_BYTES.value, 8, 32, dequant), idot=idot, act_fmt=Q8_0,
                             iacc=(8, 4), iblock=iblock)
