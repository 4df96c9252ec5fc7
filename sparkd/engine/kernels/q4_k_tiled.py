"""Q4_K resident tensors repacked once at load so that each load instruction of the GEMV touches
as few 128-byte lines as it can.

A GGUF Q4_K super-block is 144 bytes: a 16-byte header (d, dmin, 12 bytes of 6-bit scales and
mins) and 128 bytes of nibbles. q4_k's 4-row tile (4 rows x 128 qs bytes per warp-wide 128-bit
load) then touches 8 lines per load, the qs being 16 bytes off every line, and each header load
touches 4 lines (one per row). Repacked, every TILE_ROWS rows are a tile: first the qs of every
group, the tile's rows one after another (group g's at g * 512, 128-byte aligned when the tile
is: tiles are 576 * G bytes, so an even group count G keeps every tile aligned), then the headers of every group the same way (group g's 64 bytes at 512 * G + 64 * g, one
line). The same bytes as the file, nothing padded: only matrices whose row count is a multiple of
TILE_ROWS are repacked (models/weights.py keeps the others, and stacks of them, as GGUF blocks).
Only for tensors that stay resident; streamed experts and the MoE keep the GGUF layout.

The layout is a family of its own (FAMILY, qtype TILED) that matmul.gemv / gemm run as any
other; the GEMM dequantizes as q4_k.dequant does. Its integer step (FAMILIES, by loads) is by
default idot_vec: q4_k's arithmetic with a row's 16-byte header as one 128-bit load per thread
(session 5, q4k9: 11 -> 7 load instructions per group and thread, H200 head 0.70 -> 0.75 of copy
bandwidth); "scalar" is q4_k's own code on pointers to a group's qs and header. Both give the
integer sums of the GGUF blocks' step (bit for bit at the default tile, tests/engine/test_q4_k_tiled.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import q4_k
from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family, KernelArgumentError, LayoutType
from sparkd.engine.kernels.row_tiles import RowTiles, Tiled, word

TILE_ROWS = 4
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)


TILED = LayoutType("Q4_K_TILED")


TILES = RowTiles("Q4_K", TILE_ROWS, 144)
packable = TILES.packable


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q4_K blocks of W [rows, cols] (on any device) -> the tiled bytes (same count),
    uint8, on the same device."""
    blocks = TILES.blocks(raw, shape)  # [tiles, G, R, 144]
    tiles = blocks.shape[0]
    qs = blocks[..., 16:].reshape(tiles, -1)
    hdr = blocks[..., :16].reshape(tiles, -1)
    return torch.cat([qs, hdr], 1).reshape(-1)


def pack(raw: torch.Tensor, shape: tuple[int, int]) -> Tiled:
    """pack_raw as a row_tiles.Tiled."""
    return Tiled(pack_raw(raw, shape), *shape)


@triton.jit
def _group(w_ptr, row_off, g, K):
    """Pointers to group g's qs and header of each row (row_off: the GGUF layout's byte offset of
    the row, rows * row_bytes, from which its tile and lane follow)."""
    n_groups = K // 256
    row_bytes = n_groups * 144
    lane = (row_off // row_bytes) % _R
    tile = w_ptr + (row_off - lane * row_bytes)
    return tile + g * (_R * 128) + lane * 128, tile + n_groups * (_R * 128) + g * (_R * 16) + lane * 16


@triton.jit
def idot(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    qs, hdr = _group(w_ptr, row_off, g, K)
    if EW:
        acc = q4_k.idot_tile_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    else:
        acc = q4_k.idot_rows_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    return acc


@triton.jit
def _f16(bits):
    """The float16 in the low 16 bits of int32 bits, as float32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def idot_tile_vec(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU: tl.constexpr, XS64: tl.constexpr):
    """q4_k.idot_tile_at's arithmetic (the same tile [BN, 4, 8], the same bits) with fewer loads per
    thread: the 16 header bytes of its row as one 128-bit load (d, dmin and the 6-bit scales and mins
    taken apart in registers) and (XS64) x's two per-32 sums of its sub-blocks as one 64-bit load. The tile
    is [BN, 4, 2, 4] here (word w = 4 * h + v of qs chunk j) so a thread's 4 words are its own last
    dimension."""
    j = tl.arange(0, 4)[None, :, None, None]  # 32-byte chunk of qs: sub-blocks 2j (low), 2j+1 (high)
    h = tl.arange(0, 2)[None, None, :, None]
    v = tl.arange(0, 4)[None, None, None, :]
    w = 4 * h + v  # word in the chunk
    m = rmask[:, None, None, None]
    words = tl.load(qs[:, None, None, None].to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)
    zero = tl.zeros(words.shape, tl.int32)  # every load in the words' own shape: no layout conversion
    head = tl.load(hdr[:, None, None, None].to(tl.pointer_type(tl.int32)) + v + zero, mask=m, other=0)
    xw = xw_ptr + g * 64 + j * 16 + w + zero  # x words of sub-block 2j; 2j+1 follows 8 words later
    sc_lo, mn_lo = q4_k.scale_min_words(word(head, v, 1), word(head, v, 2), word(head, v, 3), 2 * j)
    sc_hi, mn_hi = q4_k.scale_min_words(word(head, v, 1), word(head, v, 2), word(head, v, 3), 2 * j + 1)
    isum = sc_lo * dp4a(words & 0x0F0F0F0F, tl.load(xw), EMU) \
        + sc_hi * dp4a((words >> 4) & 0x0F0F0F0F, tl.load(xw + 8), EMU)  # [BN, 4, 2, 4]
    xs = xs_ptr + g * 8 + 2 * j  # [1, 4, 1, 1]: the sums of sub-blocks 2j, 2j+1
    if XS64:  # both in one 64-bit load (a register more on the 4/1/4/e tile: 65)
        xs2 = tl.load(xs.to(tl.pointer_type(tl.int64)))
        msum = mn_lo * xs2.to(tl.int32) + mn_hi * (xs2 >> 32).to(tl.int32)
    else:
        msum = mn_lo * tl.load(xs) + mn_hi * tl.load(xs + 1)
    dx = tl.load(xd_ptr + g)
    hd = word(head, v, 0)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    part = d * isum.to(tl.float32) - (dmin * 0.125) * msum.to(tl.float32)
    return acc + tl.reshape(part, acc.shape)


@triton.jit
def _idot_vec(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr,
              XS64: tl.constexpr):
    """idot with the elementwise tile's loads cut (idot_tile_vec); the rows tile as idot."""
    qs, hdr = _group(w_ptr, row_off, g, K)
    if EW:
        acc = idot_tile_vec(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU, XS64)
    else:
        acc = q4_k.idot_rows_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    return acc


@triton.jit
def idot_vec(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """The header in one load, x's sums in two (idot_tile_vec)."""
    return _idot_vec(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU, False)


@triton.jit
def idot_vec64(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """The header in one load, x's sums in one."""
    return _idot_vec(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU, True)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q4_k's dequant on the tiled layout; aux_ptr: int32 [1], the row width (matmul.gemm passes
    it to families with row tiles: a row's place in its tile follows from it)."""
    qs, hdr = _group(w_ptr, row_off, g, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    return q4_k.dequant_at(qs, hdr, smask)


# the integer step by its loads per group and thread on the 4/1/4/e tile (bench/kernels_sass.py):
# "scalar" (q4_k's: 11), "vector" (idot_vec: 7, 64 registers), "vector64" (idot_vec64: 6, 65
# registers). H200 (q4k9, bench/results/gemv_tiles_h200_s5_q4k9.log): head 60.5 -> 56.6 / 56.3 us,
# 0.70 -> 0.75 of copy bandwidth. FAMILY's: "vector" unless $SPARKD_Q4_K_TILED_LOADS says (read once;
# "scalar" is q4k8's kernel)
LOADS_ENV = "SPARKD_Q4_K_TILED_LOADS"
FAMILIES = {name: Family(TILED, 256, 144, 8, 32, dequant, align=4, idot=fn, act_fmt=Q8_K, iacc=(4, 8),
                         row_tile=TILE_ROWS, vector_step=name != "scalar") for name, fn in (("scalar", idot), ("vector", idot_vec), ("vector64", idot_vec64))}
LOADS = switches.choice(LOADS_ENV, tuple(FAMILIES), "vector")
FAMILY = FAMILIES[LOADS]


def gemv(w: Tiled, x: torch.Tensor, out: torch.Tensor | None = None, config=None,
         loads: str | None = None, qx=None) -> torch.Tensor:
    """y = W @ x for one token, W tiled (pack): matmul.gemv on the TILED family; loads (a FAMILIES
    key) runs that integer step instead of FAMILY's (to time or test them side by side); qx: x
    already quantized to Q8_K (act_quant.QuantX, as a norm writes it), else the GEMV quantizes x."""
    # (imported here: matmul imports dispatch, which imports this module)
    from sparkd.engine.kernels import dispatch, matmul

    what = "the Q4_K_TILED GEMV"
    loads = loads or LOADS
    if loads not in FAMILIES:
        raise KernelArgumentError(f"could not run {what}: loads {loads!r} is not one of {sorted(FAMILIES)}")
    if loads == LOADS:
        return matmul.gemv(w.data, TILED, (w.rows, w.cols), x, out=out, config=config, qx=qx)
    fam = FAMILIES[loads]
    cfg = config or matmul.default_config(fam)
    matmul.check_tile(fam, cfg, what)
    dispatch.check_activations(x, w.cols, what)
    dispatch.check_out(out, (w.rows,), x.device, what)
    dispatch.device_of(w.data, x, what)
    matmul.check_qx(qx, fam, w.cols, what)
    y = torch.empty(w.rows, dtype=torch.float32, device=x.device) if out is None else out
    return matmul.igemv(w.data, fam.idot, fam.iacc, fam.act_fmt, (w.rows, w.cols), fam.row_bytes(w.cols), x, y,
                        cfg, qx)
