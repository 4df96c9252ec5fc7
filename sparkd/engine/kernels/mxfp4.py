"""MXFP4 (gpt-oss's routed experts): blocks of 32 values (17 bytes): e e8m0 | qs[16]. Value j is an e2m1 float, 4
bits (low nibble of qs[j] for values 0-15, high nibble of qs[j - 16] for 16-31: Q4_0's layout), times 2^(e - 127).
ggml stores the e2m1 values doubled as int8 (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) and halves the scale
(ggml_e8m0_to_fp32_half): the same products. A group is eight blocks; rows need only be a multiple of 32 values
(gpt-oss's 2880), so smask drops the blocks past a row's end (as in Q8_0 and Q4_0).

The integer step (idot) takes x as Q8_0 blocks (act_round's format for MXFP4, llama.cpp's vec_dot type) and does
llama.cpp's arithmetic: each 32-bit word of qs becomes two words of the doubled e2m1 values as int8 by byte permutes
(table16.lookup, IQ4_XS's), dp4a against x's words, one float step e8m0_half(e) * d_x per block. 17-byte blocks
have no alignment, so words are built from byte loads (as llama.cpp's CUDA get_int_b1) and Family.align is 1.

iblock hands the integer prefill GEMM (prefill_gemm.gemm / grouped_gemm at "int8") a block's doubled e2m1 values as
int8 and its halved scale, as Q4_0's iblock does: the GEMM adds isum * (d_x * scale) per block, the idot's arithmetic.

Default since session 24 (H200: a 12-layer gpt-oss-shaped decode 554.1 against 333.6 tok/s); SPARKD_MXFP4_INT=0
(read at import) the float path (dequantized values times x rounded to Q8_0 by the caller; prompts the float GEMM at
"ieee"). Resident experts are read in mxfp4_tiled's layout since session 25 (the same step on aligned words).
"""

import dataclasses

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine import switches
from sparkd.engine.kernels import q4_0, table16
from sparkd.engine.kernels.act_quant import Q8_0, dp4a, dp4a_add
from sparkd.engine.kernels.family import Family

INT_ENV = "SPARKD_MXFP4_INT"  # "0": the float path (no integer step)

# kvalues_mxfp4 (the doubled e2m1 values) as four int32 words of 4 int8 entries: 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 |
# -4 -6 -8 -12
_KV0 = tl.constexpr(0x03020100)
_KV1 = tl.constexpr(0x0C080604)
_KV2 = tl.constexpr(-33620224)  # 0xFDFEFF00
_KV3 = tl.constexpr(-185009412)  # 0xF4F8FAFC
_MAGNITUDES = tl.constexpr(0x0C08060403020100)  # entries 0-7, byte k entry k (8-15: the same, negated)


@triton.jit
def half_scale(e):
    """ggml_e8m0_to_fp32_half of e8m0 bytes e (int32): 2^(e - 128) as float32, built from its bits (e < 2: a
    subnormal)."""
    return tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _word(ptr, mask):
    """The little-endian int32 at ptr, any alignment, from 4 byte loads (0 outside mask)."""
    w = tl.load(ptr, mask=mask, other=0).to(tl.int32)
    for k in tl.static_range(1, 4):
        w |= tl.load(ptr + k, mask=mask, other=0).to(tl.int32) << (8 * k)
    return w


@triton.jit
def values(q):
    """The doubled e2m1 values (int32) of 4-bit indices q (int32, any shape)."""
    kv = ((tl.full(q.shape, _MAGNITUDES, tl.int64) >> ((q & 7) * 8).to(tl.int64)) & 0xFF).to(tl.int32)
    return tl.where(q < 8, kv, -kv)


@triton.jit
def nibbles(qs, i):
    """Value i's index (int32) from its block's qs byte i % 16 (qs int32, broadcast with i)."""
    return (qs >> ((i // 16) * 4)) & 0xF


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    blk = w_ptr + row_off + (g * 8 + s) * 17  # [BN, 8, 1] block starts
    d = d_at(blk, smask)
    q = nibbles(tl.load(blk + 1 + i % 16, mask=smask, other=0).to(tl.int32), i)
    return d * values(q).to(tl.float32)


@triton.jit
def block_sums(q, xw_ptr, b, w, m, EMU: tl.constexpr):
    """Each block's integer sum [BN, 8, 4] from its qs words q (int32 [BN, 8, 4]: word w of block b): the doubled
    e2m1 values by byte permutes, dp4a against x's Q8_0 words (loaded in q's shape, repeats served by the cache:
    q4_0.idot's way; m: which (row, block) pairs exist)."""
    lo, hi = table16.lookup(q, _KV0, _KV1, _KV2, _KV3, EMU)
    full = tl.zeros(lo.shape, tl.int32)
    return dp4a_add(hi, tl.load(xw_ptr + b * 8 + 4 + w + full, mask=m, other=0),
                    dp4a(lo, tl.load(xw_ptr + b * 8 + w + full, mask=m, other=0), EMU), EMU)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    b, w, bmask, m, blk = q4_0.group_blocks(w_ptr, row_off, rmask, g, K, 17)
    return add_blocks(acc, block_sums(_word(blk + 1 + 4 * w, m), xw_ptr, b, w, m, EMU), blk, m, b, bmask, xd_ptr, EW)


@triton.jit
def add_blocks(acc, isum, e_ptr, m, b, bmask, xd_ptr, EW: tl.constexpr):
    """acc + each block's integer sum (isum [BN, 8, 4] summed over its words, in the thread that holds them) times
    its halved scale (e8m0 bytes at e_ptr [BN, 8, 1]) and x's block scale: one float step per block, llama.cpp's.
    EW: into the tile acc [BN, 8, 1] (iacc (8, 1): a tile of a block a thread, the layout of a 128-bit load of a
    block's words; mxfp4_tiled's [BN, 8, 4] words tile converted through shared memory every step); else acc [BN]."""
    dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)
    step = tl.sum(isum, 2, keep_dims=True).to(tl.float32) * (d_at(e_ptr, m) * dx)
    if EW:
        acc += step
    else:
        acc += tl.sum(tl.sum(step, 2), 1)
    return acc


@triton.jit
def d_at(e_ptr, mask):
    """The blocks' halved scales from their e8m0 bytes at e_ptr (0 outside mask: a subnormal, times an isum of 0)."""
    return half_scale(tl.load(e_ptr, mask=mask, other=0).to(tl.int32))


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock without igroup (Q8_0's form): block b as its doubled e2m1 values (int8 [BN, 32]) and its halved
    scale (float32 [BN], 0 for rows not in rmask)."""
    blk = w_ptr + row_off + b * 17  # [BN] block starts
    q = _word(blk[:, None] + 1 + 4 * tl.arange(0, 4)[None, :], rmask[:, None])  # [BN, 4]
    return block_int8(q), tl.where(rmask, d_at(blk, rmask), 0.0)


@triton.jit
def block_int8(q):
    """A block's doubled e2m1 values as int8 [BN, 32] from its 4 qs words q [BN, 4] (iblock's)."""
    return table16.block_values(q, _KV0, _KV1, _KV2, _KV3)


@triton.jit
def block_words(q):
    """block_int8's values as int32 words of 4 [BN, 8] (table16.block_words; mxfp4_tiled.fblock's)."""
    return table16.block_words(q, _KV0, _KV1, _KV2, _KV3)


FLOAT_FAMILY = Family(T.MXFP4, 32, 17, 8, 32, dequant, align=1)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_0, iacc=(8, 1), iblock=iblock)
FAMILY = INT_FAMILY if switches.flag(INT_ENV, True) else FLOAT_FAMILY
