"""Q4_0: blocks of 32 values (18 bytes): d f16 | qs[16]; value = d*(q-8) with q the low nibbles
of qs for values 0..15 and the high nibbles for 16..31. A group is eight blocks; rows need only
be a multiple of 32 values, so smask drops the blocks past a row's end (as in Q8_0).

The integer step (idot) takes x as Q8_0 blocks (act_quant: int8 quants, an f16-rounded scale per
32; what act_round already rounds x to for Q4_0, llama.cpp's vec_dot type) and does llama.cpp's
per-block arithmetic: each 32-bit word of qs (values 4w..4w+3 in its low nibbles, 16+4w.. in its
high) masked into two words of nibbles, each multiplied with its x word by dp4a, and the -8 offset
by two more dp4a of 0xF8 bytes (-8 as int8) with the same x words, so sum (q-8)*x stays exact in
integers (Q8_0 blocks carry no sums to fold it with; a table lookup as IQ4_XS's, with the table
-8..7, takes 8 byte permutes a word); one float step d * d_x per block. 18-byte blocks are only
2-byte aligned, so every 32-bit word is built from two 16-bit loads (as Q8_0's).

iblock hands the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8", session 22) a block's nibbles - 8 as
int8 and d, as Q8_0's iblock does its quants: the GEMM adds isum * (d_x * d) per block, the idot's arithmetic.

SPARKD_Q4_0_INT=0 (read at import) takes the float path instead (FLOAT_FAMILY: x rounded to Q8_0
by the caller, dequantized values multiplied in float32), the way before session 21, and prompts the float GEMM
at "ieee" (no iblock), the way before session 22.
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels.act_quant import Q8_0, dp4a, dp4a_add
from sparkd.engine.kernels.family import Family

INT_ENV = "SPARKD_Q4_0_INT"  # "0": the float path (no integer step)
_MINUS8 = tl.constexpr(-117901064)  # 0xF8F8F8F8: four int8 -8s


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    blk = w_ptr + row_off + (g * 8 + tl.arange(0, 8)[None, :, None]) * 18  # [BN, 8, 1] block starts
    return block_values(blk, blk + 2, smask)


@triton.jit
def block_values(d_ptr, qs_ptr, smask):
    """Blocks' 32 values (float32 [BN, 8, 32]) from their f16 d at d_ptr and their qs at qs_ptr ([BN, 8, 1]; also
    q4_0_tiled's)."""
    i = tl.arange(0, 32)[None, None, :]
    d = tl.load(d_ptr.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    qs = tl.load(qs_ptr + i % 16, mask=smask, other=0).to(tl.int32)
    return d * (((qs >> ((i // 16) * 4)) & 0xF) - 8).to(tl.float32)


@triton.jit
def group_blocks(w_ptr, row_off, rmask, g, K, BLOCK_BYTES: tl.constexpr):
    """Group g's 8 blocks of 32 values (Q4_0's and MXFP4's idot; mxfp4_tiled's scale bytes, BLOCK_BYTES 1): block
    index b [1, 8, 1] along the row, word w [1, 1, 4] of a block's 16 quant bytes, the blocks inside the row (bmask),
    the (row, block) mask m [BN, 8, 1] and the block starts blk [BN, 8, 1] of the rows at row_off [BN]."""
    b = g * 8 + tl.arange(0, 8)[None, :, None]
    bmask = b * 32 < K
    return (b, tl.arange(0, 4)[None, None, :], bmask, rmask[:, None, None] & bmask,
            w_ptr + row_off[:, None, None] + b * BLOCK_BYTES)


@triton.jit
def word16(ptr, mask):
    """The little-endian int32 at a 2-byte aligned ptr (any shape; 0 outside mask), from two 16-bit loads: the
    32-value blocks' f16 d leaves their quants 2-byte aligned (Q4_0's, Q5_0's, IQ4_NL's)."""
    half = ptr.to(tl.pointer_type(tl.int16))
    lo = tl.load(half, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return lo | (tl.load(half + 1, mask=mask, other=0).to(tl.int32) << 16)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    b, w, bmask, m, blk = group_blocks(w_ptr, row_off, rmask, g, K, 18)
    return add_words(acc, word16(blk + 2 + 4 * w, m), blk, xw_ptr, xd_ptr, b, w, m, bmask, EW, EMU)


@triton.jit
def add_words(acc, q, d_ptr, xw_ptr, xd_ptr, b, w, m, bmask, EW: tl.constexpr, EMU: tl.constexpr):
    """acc plus the blocks' sums: q the words w of blocks b (int32 [BN, 8, 4]), d_ptr their f16 d ([BN, 8, 1]; also
    q4_0_tiled's step)."""
    return add_offset_words(acc, q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F, _MINUS8, d_ptr, xw_ptr, xd_ptr, b, w, m, bmask,
                            EW, EMU)


@triton.jit
def add_offset_words(acc, lo, hi, OFFSET: tl.constexpr, d_ptr, xw_ptr, xd_ptr, b, w, m, bmask, EW: tl.constexpr,
                     EMU: tl.constexpr):
    """acc plus the blocks' sums of d * (q + offset) * x: lo and hi the words of values 4w.. and 16 + 4w.. of blocks b
    (int32 [BN, 8, 4] of int8 quants), OFFSET four int8 offsets in a word (Q4_0's -8s, Q5_0's -16s; 0: none,
    IQ4_NL's table values), d_ptr the blocks' f16 d ([BN, 8, 1])."""
    # x's words and the block scales in the weight words' shape (repeats served by the cache): one
    # register layout for every operand, no conversion through shared memory in the loop (q8_0.idot's way)
    full = tl.zeros(lo.shape, tl.int32)
    xlo = tl.load(xw_ptr + b * 8 + w + full, mask=m, other=0)  # values 4w.. of the block
    xhi = tl.load(xw_ptr + b * 8 + 4 + w + full, mask=m, other=0)  # values 16 + 4w..
    isum = dp4a_add(hi, xhi, dp4a(lo, xlo, EMU), EMU)
    if OFFSET != 0:  # the offset times x's quants, in the same exact integer sum
        offset = tl.full(lo.shape, OFFSET, tl.int32)
        isum = dp4a_add(offset, xhi, dp4a_add(offset, xlo, isum, EMU), EMU)
    dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)  # [1, 8, 1]
    d_ptr = d_ptr.to(tl.pointer_type(tl.float16))
    if EW:  # into the elementwise tile acc [BN, 8, 4]
        acc += isum.to(tl.float32) * (tl.load(d_ptr + full, mask=m, other=0.0).to(tl.float32) * dx)
    else:  # a float per block, then one per row: acc [BN]
        d = tl.load(d_ptr, mask=m, other=0.0).to(tl.float32)  # [BN, 8, 1]
        acc += tl.sum(tl.sum(isum, 2).to(tl.float32) * tl.sum(d * dx, 2), 1)
    return acc


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock without igroup (Q8_0's form): block b as nibble - 8 (int8 [BN, 32]: value i from byte i % 16 of
    qs, its low nibble for values 0-15 and its high one for 16-31) and d (float32 [BN]); rows not in rmask read
    0x88 bytes (0 once offset) and d 0."""
    blk = w_ptr + row_off + b * 18  # [BN] block starts
    return block_int8(blk, blk + 2, rmask)


@triton.jit
def block_int8(d_ptr, qs_ptr, rmask):
    """iblock's (int8 [BN, 32], float32 [BN]) from the blocks' d at d_ptr and qs at qs_ptr ([BN]; also
    q4_0_tiled's)."""
    d = tl.load(d_ptr.to(tl.pointer_type(tl.float16)), mask=rmask, other=0.0).to(tl.float32)
    i = tl.arange(0, 32)[None, :]
    qs = tl.load(qs_ptr[:, None] + i % 16, mask=rmask[:, None], other=0x88).to(tl.int32)
    return (((qs >> ((i // 16) * 4)) & 0xF) - 8).to(tl.int8), d


FLOAT_FAMILY = Family(T.Q4_0, 32, 18, 8, 32, dequant)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_0, iacc=(8, 4), iblock=iblock)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
