"""IQ4_NL: blocks of 32 values (18 bytes): d f16 | qs[16]; value i = d * kvalues_iq4nl[q], q the low nibble of qs[i]
(values 0-15) or the high one of qs[i - 16] (16-31): Q4_0's layout with IQ4_XS's non-linear table.

What llama-quantize writes for the i-quants where a file's rows are not whole 256-value groups (llama-quant.cpp's
fallback: IQ1_S ... IQ4_XS -> IQ4_NL; MLA's 128-wide attn_k_b), and a file type of its own. A group is eight blocks;
rows need only be a multiple of 32 values (as Q4_0's).

The integer step (idot) is Q4_0's words (q4_0.word16: the blocks leave qs 2-byte aligned) through IQ4_XS's byte
permutes (iq4_xs.lookup) into int8 table values, dp4a with x as Q8_0 blocks (llama.cpp's vec_dot type for IQ4_NL),
one float step d * d_x per block (q4_0.add_offset_words, no offset). iblock hands the integer prefill GEMM a block's
table values as int8 and d.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels import iq4_xs, q4_0
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family

BLOCK_BYTES = tl.constexpr(18)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    blk = w_ptr + row_off + (g * 8 + tl.arange(0, 8)[None, :, None]) * BLOCK_BYTES  # [BN, 8, 1] block starts
    i = tl.arange(0, 32)[None, None, :]
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    qs = tl.load(blk + 2 + i % 16, mask=smask, other=0).to(tl.int32)
    return d * iq4_xs.kvalues((qs >> ((i // 16) * 4)) & 0xF).to(tl.float32)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    b, w, bmask, m, blk = q4_0.group_blocks(w_ptr, row_off, rmask, g, K, BLOCK_BYTES)
    lo, hi = iq4_xs.lookup(q4_0.word16(blk + 2 + 4 * w, m), EMU)  # values 4w.. and 16 + 4w.. as int8
    return q4_0.add_offset_words(acc, lo, hi, 0, blk, xw_ptr, xd_ptr, b, w, m, bmask, EW, EMU)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock without igroup (Q8_0's form): block b's table values (int8 [BN, 32]) and d (float32 [BN], 0 for
    rows not in rmask)."""
    blk = w_ptr + row_off + b * BLOCK_BYTES  # [BN] block starts
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    q = q4_0.word16(blk[:, None] + 2 + 4 * tl.arange(0, 4)[None, :], rmask[:, None])  # [BN, 4]
    return iq4_xs.block_values(q), d


FAMILY = dataclasses.replace(Family(T.IQ4_NL, 32, BLOCK_BYTES.value, 8, 32, dequant), idot=idot, act_fmt=Q8_0,
                             iacc=(8, 4), iblock=iblock)
