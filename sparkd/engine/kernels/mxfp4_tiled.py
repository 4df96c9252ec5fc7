"""MXFP4 resident experts in nibble_tiles' 16-row tiles (head: the e8m0 byte), so that the decode step reads each
block's quants in one 128-bit load (GGUF's 17-byte blocks sit at every byte alignment: mxfp4's step builds each
32-bit word of qs from 4 byte loads; H200 session 24: 0.14-0.27 of copy bandwidth). The MoE takes it for resident
experts (moe.tiled_nibbles, layers/quant_experts.py; session 25).

The integer step is mxfp4's arithmetic on the same words (mxfp4.block_sums, one float step per block), so the same
bits as mxfp4.idot on the GGUF blocks at the same tile; iblock / dequant hand the prefill GEMM the same values.
$SPARKD_MXFP4_INT=0 takes the float path on this layout too (FAMILY without idot: dequant, then multiply).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from sparkd.engine.kernels import mxfp4, nibble_tiles, q4_0
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family, LayoutType
from sparkd.engine.kernels.nibble_tiles import NibbleTiles, word_values

LAYOUT = NibbleTiles("MXFP4", 1)
TILED = LayoutType("MXFP4_TILED")
TILE_ROWS, packable, pack_raw, unpack_raw = nibble_tiles.TILE_ROWS, LAYOUT.packable, LAYOUT.pack_raw, LAYOUT.unpack_raw
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """mxfp4.idot on the tiled rows: group g's 8 blocks, each thread's block of 4 words in one load."""
    qs, e = nibble_tiles.offsets(row_off, K, 1)
    b, w, bmask, m, e_ptr = q4_0.group_blocks(w_ptr, e, rmask, g, K, 1)  # e_ptr: the blocks' scale bytes
    q = nibble_tiles.words(w_ptr, qs, b, w, m)
    return mxfp4.add_blocks(acc, mxfp4.block_sums(q, xw_ptr, b, w, m, EMU), e_ptr, m, b, bmask, xd_ptr, EW)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """mxfp4's dequant on the tiled rows; aux_ptr: int32 [1], the row width (matmul.aux_arg: a row's place in its
    tile follows from it)."""
    qs, e = nibble_tiles.offsets(row_off, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))), 1)
    b = g * 8 + tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    q = mxfp4.nibbles(tl.load(w_ptr + qs + b * 16 + i % 16, mask=smask, other=0).to(tl.int32), i)
    return mxfp4.d_at(w_ptr + e + b, smask) * mxfp4.values(q).to(tl.float32)


@triton.jit
def _block(w_ptr, row_off, rmask, b, row_bytes):
    """Block b of the tiled rows: its 4 qs words (int32 [BN, 4], one 128-bit load a row; 0 outside rmask) and its
    scale byte's offset [BN] (the scale is read after the words are unpacked: the order iblock was measured in)."""
    qs, e = nibble_tiles.offsets(row_off, row_bytes // 17 * 32, 1)
    q = tl.load((w_ptr + qs[:, None] + b * 16).to(tl.pointer_type(tl.int32)) + tl.arange(0, 4)[None, :],
                mask=rmask[:, None], other=0)
    return q, e + b


@triton.jit
def _scale(w_ptr, e, rmask):
    """The halved scale (float32 [BN], 0 outside rmask) of the e8m0 bytes at offsets e."""
    return tl.where(rmask, mxfp4.d_at(w_ptr + e, rmask), 0.0)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """mxfp4.iblock on the tiled rows: block b's doubled e2m1 values (int8 [BN, 32]) and halved scale."""
    q, e = _block(w_ptr, row_off, rmask, b, row_bytes)
    return mxfp4.block_int8(q), _scale(w_ptr, e, rmask)


@triton.jit
def fblock(w_ptr, row_off, rmask, b, row_bytes):
    """family.fblock: block b's doubled e2m1 values times its halved scale as bfloat16 [BN, 32] (0 outside rmask;
    exact: 3 significant bits times a power of two, for e8m0 bytes 2-252; past them, in no model's file, a value would
    leave bf16's normal range). The lookup's words are widened and scaled before they are laid out as 32 values a row:
    widening iblock's int8 tile instead was slower than the integer GEMM (H100, session 43: 0.89-0.90x against this
    order's 1.04-1.05x)."""
    q, e = _block(w_ptr, row_off, rmask, b, row_bytes)
    words = mxfp4.block_words(q)
    j = tl.arange(0, 4)[None, None, :]
    v = (words[:, :, None] << (24 - 8 * j)) >> 24  # [BN, 8, 4]: byte j of word w, sign-extended
    return tl.reshape((v.to(tl.float32) * _scale(w_ptr, e, rmask)[:, None, None]).to(tl.bfloat16), (q.shape[0], 32))


@triton.jit
def dequant_words(w_ptr, K, first, g, M, ROWS: tl.constexpr):
    """family.words: group g (blocks 8g .. 8g + 7) of rows [first, first + ROWS) (whole tiles; rows from M and blocks
    past the row none), a qs word a lane: word m of a block holds its values 4m + j (low nibble of byte j) and
    16 + 4m + j (high). dequant's expression on the same bytes, so its values: values [ROWS * 32, 2, 4] (the low
    run, the high run), their row [.., 1, 1] and column [.., 2, 1]."""
    i = tl.arange(0, ROWS * 32)
    row, b, m = first + i // 32, g * 8 + (i // 4) % 8, i % 4
    n_blocks = K // 32
    live = (row < M) & (b < n_blocks)
    lane = row % _R
    tile = (row // _R).to(tl.int64) * n_blocks * (_R * 17)
    q = tl.load((w_ptr + tile + 16 * (lane * n_blocks + b)).to(tl.pointer_type(tl.int32)) + m, mask=live, other=0)
    d = mxfp4.d_at(w_ptr + tile + n_blocks * (_R * 16) + lane * n_blocks + b, live)
    v = word_values(_value(q, 0, d), _value(q, 8, d), _value(q, 16, d), _value(q, 24, d),
                    _value(q, 4, d), _value(q, 12, d), _value(q, 20, d), _value(q, 28, d))
    cols = (32 * b + 4 * m)[:, None, None] + 16 * tl.arange(0, 2)[None, :, None]
    return tl.reshape(v, (ROWS * 32, 2, 4)), row[:, None, None], cols


@triton.jit
def _value(q, at: tl.constexpr, d):
    """The value of the nibble at bit `at` of words q: dequant's d * its e2m1 value."""
    return d * mxfp4.values((q >> at) & 0xF).to(tl.float32)


FLOAT_FAMILY = Family(TILED, 32, 17, 8, 32, dequant, align=16, row_tile=TILE_ROWS, words=dequant_words)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_0, iacc=mxfp4.INT_FAMILY.iacc, iblock=iblock,
                                 fblock=fblock)
# $SPARKD_MXFP4_INT=0 (mxfp4.FAMILY the float one) takes the float path on this layout too
FAMILY = INT_FAMILY if mxfp4.FAMILY.idot is not None else FLOAT_FAMILY
