"""Q6_K resident tensors repacked once at load so that the GEMV reads them in 128-bit loads.

A GGUF Q6_K super-block is 210 bytes (ql[128] | qh[64] | scales int8[16] | d f16): rows start
only 2 bytes aligned, so q6_k's integer step builds every 32-bit word from two 16-bit loads and
loads each scale byte on its own (16 load instructions per group and thread). Repacked, every
TILE_ROWS = 8 rows are a tile of G groups (1680 * G bytes: every tile 16-byte aligned whatever G):
  quants  group g at 1536 g: three 512-byte planes A, B, QH; in each, chunk (lane r, half h,
          c = 0, 1) at 16 * (4r + 2h + c): A ql[64h + 16c ..+16], B ql[64h + 32 + 16c ..+16],
          QH qh[32h + 16c ..+16]. A thread of the [rows, 2, 2, 4] tile reads its three chunks in
          three 128-bit loads, a warp's load 512 consecutive bytes;
  scales  group g at 1536 G + 128 g, lane r's 16 bytes at 16 r (the file's order): one 128-bit load;
  d       group g at 1664 G + 16 g, lane r's at 2 r: the tile's 8 in one 128-bit load.
The same bytes as the file, nothing padded: only matrices whose row count is a multiple of
TILE_ROWS can be repacked, and models/weights.py repacks those of MIN_VALUES values or more (the
output head, a dense FFN; the small projections were faster on the GGUF tile); streamed experts
and the MoE keep the GGUF layout.

The integer step (idot) is q6_k's arithmetic on the same words (the thread's 4 words w = 4c + v
of q6_k's [rows, 2, 8] tile), into the same accumulator tile: the same integer sums and float
steps, so the same bits as q6_k.idot on the GGUF blocks (tests/engine/test_q6_k_tiled.py).
iblock / igroup hand the integer prefill GEMM q6_k's quants, scales and d from the tiled bytes: the
GEMM adds the same values in the same order, so the same bits as on the GGUF blocks (session 10).
$SPARKD_Q6_K_INT=0 takes the float path here too (FAMILY without idot: dequant, then multiply).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import q6_k
from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family, LayoutType
from sparkd.engine.kernels.row_tiles import RowTiles, Tiled, word

TILE_ROWS = 8
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)
_MINUS32 = tl.constexpr(-522133280)  # 0xE0E0E0E0: four int8 -32s

TILED = LayoutType("Q6_K_TILED")


TILES = RowTiles("Q6_K", TILE_ROWS, 210)
packable = TILES.packable

# the loader tiles resident matrices of at least this many values (models/weights.py). H200, session
# 6, tiled default vs the GGUF default side by side (docs/runs/2026-11-30-s6-final/gemv_final.log):
# 151936x2048 103.9 -> 64.0 us, 14336x4096 22.6 -> 15.6, 4096x14336 27.6 -> 15.5, 6144x4096
# 11.7 -> 8.9; but 4096x2048 5.8 -> 6.2 and attn_v's 512x2048 5.5 -> 5.7..7.3 (q6k9's run;
# launch-bound: a quarter of the GGUF tile's programs). 2^24 lies between 8.4M and 25M values.
MIN_VALUES = 1 << 24


def worth_tiling(shape: tuple[int, int]) -> bool:
    """Whether the loader tiles a resident Q6_K matrix of this shape: packable and MIN_VALUES values."""
    return packable(shape) and shape[0] * shape[1] >= MIN_VALUES


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q6_K blocks of W [rows, cols] (on any device) -> the tiled bytes (same count),
    uint8, on the same device."""
    blocks = TILES.blocks(raw, shape)  # [tiles, G, R, 210]
    tiles, groups = blocks.shape[:2]
    ql = blocks[..., :128].reshape(tiles, groups, TILE_ROWS, 2, 2, 2, 16)  # (r, h, A|B, c, byte)
    qh = blocks[..., 128:192].reshape(tiles, groups, TILE_ROWS, 2, 2, 16)  # (r, h, c, byte)
    quants = torch.stack([ql[..., 0, :, :], ql[..., 1, :, :], qh], 2)  # [tiles, G, plane, R, 2, 2, 16]
    parts = (quants, blocks[..., 192:208], blocks[..., 208:])
    return torch.cat([p.reshape(tiles, -1) for p in parts], 1).reshape(-1)


def pack(raw: torch.Tensor, shape: tuple[int, int]) -> Tiled:
    """pack_raw as a row_tiles.Tiled."""
    return Tiled(pack_raw(raw, shape), *shape)


@triton.jit
def _group(w_ptr, row_off, g, K):
    """(group g's quant planes of the row's tile, the row's 16 scale bytes, the tile's 8 d's, the
    row's lane in its tile); row_off: the GGUF layout's byte offset of the row, rows * 210 G.
    The tile start is built from constants times 1680 so the compiler sees it 16-byte aligned."""
    n_groups = K // 256
    row = row_off // (n_groups * 210)
    lane = row % _R
    tile = w_ptr + (row // _R) * n_groups * (_R * 210)
    quants = tile + g * (_R * 192)
    scales = tile + n_groups * (_R * 192) + g * (_R * 16) + lane * 16
    ds = tile + n_groups * (_R * 208) + g * (_R * 2)
    return quants, scales, ds, lane


@triton.jit
def _sbyte(word, k):
    """Signed byte k of int32 word (an int8 scale)."""
    return (word << (24 - 8 * k)) >> 24


@triton.jit
def _isums(quants, scales, lane, m, xw_ptr, g, EMU: tl.constexpr):
    """q6_k._isums on the tiled layout: group g's integer sums as [BN, 2, 2, 4] int32, (h, c, v)
    being q6_k's (half h, word w = 4c + v)."""
    h = tl.arange(0, 2)[None, :, None, None]
    c = tl.arange(0, 2)[None, None, :, None]
    v = tl.arange(0, 4)[None, None, None, :]
    chunk = quants[:, None, None, None].to(tl.pointer_type(tl.int32)) + lane[:, None, None, None] * 16 + h * 8 \
        + c * 4 + v  # [BN, 2, 2, 4]: plane A's words; B 128 words later, QH 256
    a = tl.load(chunk, mask=m, other=0)  # ql bytes l = 16c + 4v ..+3: low nibbles values l, high l+64
    b = tl.load(chunk + 128, mask=m, other=0)  # ql bytes l+32: low nibbles values l+32, high l+96
    qh = tl.load(chunk + 256, mask=m, other=0)  # bits 2j..2j+1: value l + 32j
    zero = tl.zeros(a.shape, tl.int32)  # every load in the words' own shape: no layout conversion
    sc = tl.load(scales[:, None, None, None].to(tl.pointer_type(tl.int32)) + v + zero, mask=m, other=0)
    lo, hi = word(sc, v, 2 * h), word(sc, v, 2 * h + 1)  # scales 8h ..8h+3, 8h+4 ..8h+7: [BN, 2, 2, 1]
    xw = xw_ptr + g * 64 + 32 * h + 4 * c + v + zero
    isum = _quarter((a & 0x0F0F0F0F) | ((qh << 4) & 0x30303030), xw, _sbyte(lo, c), EMU)
    isum += _quarter((b & 0x0F0F0F0F) | ((qh << 2) & 0x30303030), xw + 8, _sbyte(lo, c + 2), EMU)
    isum += _quarter(((a >> 4) & 0x0F0F0F0F) | (qh & 0x30303030), xw + 16, _sbyte(hi, c), EMU)
    isum += _quarter(((b >> 4) & 0x0F0F0F0F) | ((qh >> 2) & 0x30303030), xw + 24, _sbyte(hi, c + 2), EMU)
    return isum, v, zero


@triton.jit
def _quarter(q, xw, sc, EMU: tl.constexpr):
    """sc * sum (q - 32) * x over one word of 4 values (q6_k._quarter with the scale in registers)."""
    x = tl.load(xw)
    return sc * (dp4a(q, x, EMU) + dp4a(tl.full(q.shape, _MINUS32, tl.int32), x, EMU))


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    quants, scales, ds, lane = _group(w_ptr, row_off, g, K)
    m = rmask[:, None, None, None]
    isum, v, zero = _isums(quants, scales, lane, m, xw_ptr, g, EMU)
    dx = tl.load(xd_ptr + g)
    if EW:  # into q6_k's elementwise tile acc [BN, 2, 8]; the tile's d's in one load, the row's picked
        dw = tl.load(ds.to(tl.pointer_type(tl.int32))[:, None, None, None] + v + zero, mask=m, other=0)
        lane4 = lane[:, None, None, None]
        bits = word(dw, v, lane4 // 2) >> (16 * (lane4 % 2))
        d = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        acc += tl.reshape(isum.to(tl.float32) * (d * dx), acc.shape)
    else:  # the super-block's integer sum, then one float step per row: acc [BN]
        d = tl.load(ds.to(tl.pointer_type(tl.float16)) + lane, mask=rmask, other=0.0).to(tl.float32)
        acc += tl.sum(tl.sum(tl.sum(isum, 3), 2), 1).to(tl.float32) * (d * dx)
    return acc


@triton.jit
def _quants(quants, lane, val, m):
    """The 6-bit quants (int32) of values val of the group whose planes start at `quants`, in row
    `lane` of the tile (quants, lane and val broadcast together)."""
    h, j, c, i = val // 128, (val // 32) % 4, (val // 16) % 2, val % 16  # val = 128h + 32j + 16c + i
    at = quants + lane * 64 + h * 32 + c * 16 + i  # the value's byte in plane A
    ql = tl.load(at + (j % 2) * 512, mask=m, other=0).to(tl.int32)
    qh = tl.load(at + 1024, mask=m, other=0).to(tl.int32)
    return ((ql >> ((j // 2) * 4)) & 0xF) | (((qh >> (2 * j)) & 3) << 4)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q6_k's dequant on the tiled layout; aux_ptr: int32 [1], the row width (prefill_gemm.gemm passes
    it to families with row tiles: a row's place in its tile follows from it)."""
    quants, scales, ds, lane = _group(w_ptr, row_off, g, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    s = tl.arange(0, 16)[None, :, None]
    t = tl.arange(0, 16)[None, None, :]
    q = _quants(quants, lane, s * 16 + t, smask)  # [BN, 16, 16]
    d = tl.load(ds.to(tl.pointer_type(tl.float16)) + lane, mask=smask, other=0.0).to(tl.float32)
    sc = tl.load((scales + s).to(tl.pointer_type(tl.int8)), mask=smask, other=0).to(tl.float32)
    return (d * sc) * (q.to(tl.float32) - 32.0)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """q6_k.iblock on the tiled bytes: values 32 (b % 8) .. +31 of group b // 8 as (q - 32 int8
    [BN, 32], the int8 scales of the first and of the last 16 as int32 [BN]); the same values."""
    quants, scales, ds, lane = _group(w_ptr, row_off, b // 8, row_bytes // 210 * 256)
    q = _quants(quants[:, None], lane[:, None], 32 * (b % 8) + tl.arange(0, 32)[None, :], rmask[:, None])
    sc = (scales + 2 * (b % 8)).to(tl.pointer_type(tl.int8))
    return ((q - 32).to(tl.int8), tl.load(sc, mask=rmask, other=0).to(tl.int32),
            tl.load(sc + 1, mask=rmask, other=0).to(tl.int32))


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    """q6_k.igroup on the tiled bytes: (d, 0)."""
    quants, scales, ds, lane = _group(w_ptr, row_off, g, row_bytes // 210 * 256)
    d = tl.load(ds.to(tl.pointer_type(tl.float16)) + lane, mask=rmask, other=0.0).to(tl.float32)
    return d, tl.zeros(d.shape, tl.float32)


INT_FAMILY = Family(TILED, 256, 210, 16, 16, dequant, align=16, idot=idot, act_fmt=Q8_K, iacc=(2, 8),
                    row_tile=TILE_ROWS, isplit=4, iblock=iblock, igroup=igroup, ihalf=True)
FLOAT_FAMILY = dataclasses.replace(INT_FAMILY, idot=None, act_fmt=None, iblock=None, igroup=None, ihalf=False)
# $SPARKD_Q6_K_INT=0 (q6_k.FAMILY the float one) takes the float path on this layout too
FAMILY = INT_FAMILY if q6_k.FAMILY.idot is not None else FLOAT_FAMILY


def gemv(w: Tiled, x: torch.Tensor, out: torch.Tensor | None = None, config=None, qx=None) -> torch.Tensor:
    """y = W @ x for one token, W tiled (pack): matmul.gemv on the TILED family; qx: x already
    quantized to Q8_K (act_quant.QuantX, as a norm writes it), else the GEMV quantizes x."""
    from sparkd.engine.kernels.matmul import gemv as run  # matmul imports dispatch, which imports this

    return run(w.data, TILED, (w.rows, w.cols), x, out=out, config=config, qx=qx)
