"""Q4_0 resident projections and experts in nibble_tiles' 16-row tiles (head: the f16 d), so that the decode step
reads each block's quants in one 128-bit load (GGUF's 18-byte blocks are 2-byte aligned: q4_0's step builds each
32-bit word of qs from two 16-bit loads; H200 session 21: 0.20-0.31 of copy bandwidth). weights.py takes it for
resident projections ($SPARKD_Q4_0_LAYOUT), the MoE for resident experts (moe.tiled_nibbles,
$SPARKD_MOE_Q4_0_LAYOUT; session 26).

The integer step is q4_0's arithmetic on the same words (q4_0.add_words), so the same bits as q4_0.idot on the GGUF
blocks at the same tile; iblock / dequant hand the prefill GEMM the same values. $SPARKD_Q4_0_INT=0 takes the float
path on this layout too (FAMILY without idot: dequant, then multiply).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from sparkd.engine.kernels import nibble_tiles, q4_0
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family, LayoutType
from sparkd.engine.kernels.nibble_tiles import NibbleTiles

LAYOUT = NibbleTiles("Q4_0", 2)
TILED = LayoutType("Q4_0_TILED")
TILE_ROWS, packable, pack_raw, unpack_raw = nibble_tiles.TILE_ROWS, LAYOUT.packable, LAYOUT.pack_raw, LAYOUT.unpack_raw


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """q4_0.idot on the tiled rows: group g's 8 blocks, each thread's block of 4 words in one load."""
    qs, d = nibble_tiles.offsets(row_off, K, 2)
    b, w, bmask, m, d_ptr = q4_0.group_blocks(w_ptr, d, rmask, g, K, 2)  # d_ptr: the blocks' d
    return q4_0.add_words(acc, nibble_tiles.words(w_ptr, qs, b, w, m), d_ptr, xw_ptr, xd_ptr, b, w, m, bmask, EW, EMU)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q4_0's dequant on the tiled rows; aux_ptr: int32 [1], the row width (matmul.aux_arg: a row's place in its
    tile follows from it)."""
    qs, d = nibble_tiles.offsets(row_off, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))), 2)
    b = g * 8 + tl.arange(0, 8)[None, :, None]
    return q4_0.block_values(w_ptr + d + b * 2, w_ptr + qs + b * 16, smask)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """q4_0.iblock on the tiled rows: block b's nibbles - 8 (int8 [BN, 32]) and d."""
    qs, d = nibble_tiles.offsets(row_off, row_bytes // 18 * 32, 2)
    return q4_0.block_int8(w_ptr + d + b * 2, w_ptr + qs + b * 16, rmask)


FLOAT_FAMILY = Family(TILED, 32, 18, 8, 32, dequant, align=16, row_tile=TILE_ROWS)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_0, iacc=q4_0.INT_FAMILY.iacc, iblock=iblock)
# $SPARKD_Q4_0_INT=0 (q4_0.FAMILY the float one) takes the float path on this layout too
FAMILY = INT_FAMILY if q4_0.FAMILY.idot is not None else FLOAT_FAMILY
