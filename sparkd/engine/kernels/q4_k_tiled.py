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
Only for tensors that stay resident; streamed experts keep the GGUF layout (resident experts' gate and up
take it since session 9, moe.tiled_gate_up; their down from model width 4096 since session 10, moe.tiled_down).

The layout is a family of its own (FAMILY, qtype TILED) that matmul.gemv / gemm run as any
other; the GEMM dequantizes as q4_k.dequant does. Its integer step (FAMILIES, by loads) is by
default idot_vec: q4_k's arithmetic with a row's 16-byte header as one 128-bit load per thread
(session 5, q4k9: 11 -> 7 load instructions per group and thread, H200 head 0.70 -> 0.75 of copy
bandwidth); "scalar" is q4_k's own code on pointers to a group's qs and header. Both give the
integer sums of the GGUF blocks' step (bit for bit at the default tile, tests/engine/test_q4_k_tiled.py).
Session 7 (q4k12): the default is "bytes", idot_vec's loads and arithmetic on the "bytes" header order
(the 6-bit scales and mins regrouped at repack by qs chunk, so a thread takes its chunk's four out with
one shift per word: 418 -> 354 loop instructions per 4 groups, the same bits; H200 head 0.75 -> 0.83,
14336x4096 0.61 -> 0.67). pack_raw makes the header order of the step the engine runs (LOADS).
Session 8 (q4k19): "pairx" (kernels/q4_k_pair.py) has its own qs and header order (2 rows a thread, x loaded
twice instead of 4 times; one row's float work a thread after a shuffle); opt-in, not yet the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import q4_k, q4_k_pair
from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family, KernelArgumentError, LayoutType
from sparkd.engine.kernels.row_tiles import RowTiles, Tiled, row_sums, word

TILE_ROWS = 4
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)


TILED = LayoutType("Q4_K_TILED")


TILES = RowTiles("Q4_K", TILE_ROWS, 144)
packable = TILES.packable


def pack_raw(raw: torch.Tensor, shape: tuple[int, int], loads: str | None = None) -> torch.Tensor:
    """Raw GGUF Q4_K blocks of W [rows, cols] (on any device) -> the tiled bytes (same count) of the
    integer step `loads` (FAMILIES' key, default LOADS; "bytes" regroups the scale bytes,
    _bytes_scales), uint8, on the same device."""
    blocks = TILES.blocks(raw, shape)  # [tiles, G, R, 144]
    if layout_of(loads) == "pairx":
        return q4_k_pair.pack_blocks(blocks)
    tiles = blocks.shape[0]
    qs = blocks[..., 16:].reshape(tiles, -1)
    hdr = blocks[..., :16]
    if layout_of(loads) == "bytes":
        hdr = torch.cat([hdr[..., :4], _bytes_scales(hdr[..., 4:])], -1)
    return torch.cat([qs, hdr.reshape(tiles, -1)], 1).reshape(-1)


def _bytes_scales(packed: torch.Tensor) -> torch.Tensor:
    """GGUF's 12 bytes of 6-bit scales and mins (uint8 [..., 12]; unpacked as q4_k.scale_min_words
    does) in the bytes layout's order (chunk_scales packs them back)."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([a & 63, (c & 0xF) | ((a >> 6) << 4)], -1)  # [..., 8]
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], -1)
    sc_lo, sc_hi, mn_lo, mn_hi = sc[..., 0::2], sc[..., 1::2], mn[..., 0::2], mn[..., 1::2]  # [..., 4] by chunk
    return torch.cat([sc_lo | ((mn_hi & 3) << 6), sc_hi | (((mn_hi >> 2) & 3) << 6),
                      mn_lo | ((mn_hi >> 4) << 6)], -1)


def pack(raw: torch.Tensor, shape: tuple[int, int], loads: str | None = None) -> Tiled:
    """pack_raw as a row_tiles.Tiled (its layout: "bytes" or "")."""
    return Tiled(pack_raw(raw, shape, loads), *shape, layout=layout_of(loads))


def layout_of(loads: str | None) -> str:
    """The byte order an integer step reads: "bytes" and "pairx" their own, else "" (the GGUF header)."""
    loads = _checked_loads(loads)
    return loads if loads in ("bytes", "pairx") else ""


def _checked_loads(loads: str | None) -> str:
    loads = loads or LOADS
    if loads not in FAMILIES:
        raise KernelArgumentError(f"could not run the Q4_K_TILED GEMV: loads {loads!r} is not one of "
                                  f"{sorted(FAMILIES)}")
    return loads


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
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
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
def idot_tile_vec(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU: tl.constexpr):
    """q4_k.idot_tile_at's arithmetic (the same tile [BN, 4, 8], the same bits) with fewer loads per
    thread: the 16 header bytes of its row as one 128-bit load (d, dmin and the 6-bit scales and mins
    taken apart in registers). The tile
    is [BN, 4, 2, 4] here (word w = 4 * h + v of qs chunk j) so a thread's 4 words are its own last
    dimension."""
    j = tl.arange(0, 4)[None, :, None, None]  # 32-byte chunk of qs: sub-blocks 2j (low), 2j+1 (high)
    v = tl.arange(0, 4)[None, None, None, :]
    m = rmask[:, None, None, None]
    words = _qs_words(qs, m)
    zero = tl.zeros(words.shape, tl.int32)  # every load in the words' own shape: no layout conversion
    head = tl.load(hdr[:, None, None, None].to(tl.pointer_type(tl.int32)) + v + zero, mask=m, other=0)
    sc_lo, mn_lo = q4_k.scale_min_words(word(head, v, 1), word(head, v, 2), word(head, v, 3), 2 * j)
    sc_hi, mn_hi = q4_k.scale_min_words(word(head, v, 1), word(head, v, 2), word(head, v, 3), 2 * j + 1)
    return _tile_sum(words, sc_lo, mn_lo, sc_hi, mn_hi, word(head, v, 0), xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)


@triton.jit
def _qs_words(qs, m):
    """Group g's qs of each row as the tile [BN, 4, 2, 4] of int32 words (one 128-bit load per thread)."""
    j = tl.arange(0, 4)[None, :, None, None]
    w = 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]  # word in chunk j
    return tl.load(qs[:, None, None, None].to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)


@triton.jit
def _tile_sum(words, sc_lo, mn_lo, sc_hi, mn_hi, hd, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU: tl.constexpr):
    """The vector steps' arithmetic once the scales and mins of sub-blocks 2j, 2j+1 (sc_lo, mn_lo, sc_hi,
    mn_hi) and d | dmin << 16 (hd) of each thread's row are in registers: q4_k.idot_tile_at's, bit for bit."""
    j = tl.arange(0, 4)[None, :, None, None]
    w = 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
    zero = tl.zeros(words.shape, tl.int32)
    xw = xw_ptr + g * 64 + j * 16 + w + zero  # x words of sub-block 2j; 2j+1 follows 8 words later
    isum = sc_lo * dp4a(words & 0x0F0F0F0F, tl.load(xw), EMU) \
        + sc_hi * dp4a((words >> 4) & 0x0F0F0F0F, tl.load(xw + 8), EMU)  # [BN, 4, 2, 4]
    xs = xs_ptr + g * 8 + 2 * j  # [1, 4, 1, 1]: the sums of sub-blocks 2j, 2j+1
    msum = mn_lo * tl.load(xs) + mn_hi * tl.load(xs + 1)
    dx = tl.load(xd_ptr + g)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    part = d * isum.to(tl.float32) - (dmin * 0.125) * msum.to(tl.float32)
    return acc + tl.reshape(part, acc.shape)


@triton.jit
def idot_vec(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """idot with the elementwise tile's loads cut (idot_tile_vec: the header in one load); the rows tile as idot."""
    qs, hdr = _group(w_ptr, row_off, g, K)
    if EW:
        acc = idot_tile_vec(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    else:
        acc = q4_k.idot_rows_at(qs, hdr, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    return acc


# the "bytes" layout (session 7, q4k12): the same 16 header bytes per row and group, the 6-bit scales and
# mins regrouped at repack so that qs chunk j's four (sub-blocks 2j, 2j+1) sit in byte j of header words
# 1-3: sc[2j] and sc[2j+1] in the low 6 bits of words 1 and 2, mn[2j] in word 3's, mn[2j+1] in the top
# 2 bits of all three (its bits 0-1, 2-3, 4-5)


@triton.jit
def chunk_scales(w1, w2, w3, j):
    """The bytes layout's (sc[2j], mn[2j], sc[2j+1], mn[2j+1]) as int32 from header words 1-3 (int32)."""
    sh = j * 8
    b1 = w1 >> sh
    b2 = w2 >> sh
    b3 = w3 >> sh
    mn_hi = ((b1 >> 6) & 3) | ((b2 >> 4) & 12) | ((b3 >> 2) & 48)
    return b1 & 63, b3 & 63, b2 & 63, mn_hi


@triton.jit
def idot_bytes(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """idot_vec on the bytes layout: the header in one 128-bit load per thread as there, the 4 values of
    the thread's chunk j taken out with one shift per word (chunk_scales) instead of q4_k's 6-bit
    unpacking; the same bits as idot_vec on the elementwise tile."""
    qs, hdr = _group(w_ptr, row_off, g, K)
    j = tl.arange(0, 4)[None, :, None, None]
    v = tl.arange(0, 4)[None, None, None, :]
    m = rmask[:, None, None, None]
    words = _qs_words(qs, m)
    zero = tl.zeros(words.shape, tl.int32)
    head = tl.load(hdr[:, None, None, None].to(tl.pointer_type(tl.int32)) + v + zero, mask=m, other=0)
    sc_lo, mn_lo, sc_hi, mn_hi = chunk_scales(word(head, v, 1), word(head, v, 2), word(head, v, 3), j)
    if EW:
        acc = _tile_sum(words, sc_lo, mn_lo, sc_hi, mn_hi, word(head, v, 0), xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    else:  # the rows tile: the group's tile reduced at once
        t = _tile_sum(words, sc_lo, mn_lo, sc_hi, mn_hi, word(head, v, 0), xw_ptr, xd_ptr, xs_ptr, g,
                      tl.zeros((rmask.shape[0], 4, 8), tl.float32), EMU)
        acc += row_sums(t, 4, 8, 4)  # (its merged dimension summed the way row_idot sums the tile)
    return acc


@triton.jit
def dequant_bytes(w_ptr, aux_ptr, row_off, g, smask):
    """dequant on the bytes layout: group g of each row as floats [BN, 8, 32]."""
    qs, hdr = _group(w_ptr, row_off, g, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    d = tl.load(hdr.to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((hdr + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    at = hdr + 4 + s // 2  # byte j of header word 1; of words 2, 3 4 and 8 bytes on
    sc_lo, mn_lo, sc_hi, mn_hi = chunk_scales(tl.load(at, mask=smask, other=0).to(tl.int32),
                                              tl.load(at + 4, mask=smask, other=0).to(tl.int32),
                                              tl.load(at + 8, mask=smask, other=0).to(tl.int32), 0)
    high = s % 2 == 1
    sc = tl.where(high, sc_hi, sc_lo).to(tl.float32)
    mn = tl.where(high, mn_hi, mn_lo).to(tl.float32)
    q = tl.load(qs + (s // 2) * 32 + i, mask=smask, other=0).to(tl.int32)
    q = (q >> ((s % 2) * 4)) & 0xF
    return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q4_k's dequant on the tiled layout; aux_ptr: int32 [1], the row width (prefill_gemm.gemm passes
    it to families with row tiles: a row's place in its tile follows from it)."""
    qs, hdr = _group(w_ptr, row_off, g, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    return q4_k.dequant_at(qs, hdr, smask)


# the integer step by its loads per group and thread on the 4/1/4/e tile (bench/kernels_sass.py):
# "scalar" (q4_k's: 11), "vector" (idot_vec: 7, 64 registers). H200 (q4k9,
# bench/results/gemv_tiles_h200_s5_q4k9.log): head 60.5 -> 56.6 us, 0.70 -> 0.75 of copy bandwidth
# (session 5's "vector64", x's sums in one 64-bit load: 56.3 us at 65 registers, never the default, removed
# in session 8). "bytes" (session 7, q4k12: idot_bytes on the bytes layout, 418 -> 354
# loop instructions per 4 groups, the same bits; bench/results/q4k12_h200_s7.log): head 55.3 -> 49.9 us,
# 0.75 -> 0.83, 14336x4096 12.7 -> 11.7 us, 0.61 -> 0.67. FAMILY's: "bytes" unless $SPARKD_Q4_K_TILED_LOADS
# says (read once; "vector" is session 6's step and layout, "scalar" q4k8's kernel); pack_raw follows it
LOADS_ENV = "SPARKD_Q4_K_TILED_LOADS"
FAMILIES = {name: Family(TILED, 256, 144, 8, 32, dequant, align=4, idot=fn, act_fmt=Q8_K, iacc=(4, 8),
                         row_tile=TILE_ROWS, isplit=4) for name, fn in (("scalar", idot), ("vector", idot_vec))}
FAMILIES["bytes"] = Family(TILED, 256, 144, 8, 32, dequant_bytes, align=4, idot=idot_bytes, act_fmt=Q8_K, iacc=(4, 8),
                           row_tile=TILE_ROWS, isplit=4)
# session 8 (q4k19): "pairx", 2 rows a thread and one row's float work after a shuffle (kernels/q4_k_pair.py; its
# own byte order; the default one-warp 4-row elementwise tile only, 2 groups a step: matmul.GEMV_TILES). Only
# pairx has the integer prefill GEMM's block loader (session 10): the other layouts' GEMM runs "ieee" at "int8"
FAMILIES["pairx"] = Family(TILED, 256, 144, 8, 32, q4_k_pair.dequant, align=4, idot=q4_k_pair.idot, act_fmt=Q8_K,
                           iacc=(8, 1), row_tile=TILE_ROWS, one_tile=(4, 1), iblock=q4_k_pair.iblock, kblock=q4_k_pair.kblock,
                           wblock=q4_k_pair.wblock, igroup=q4_k_pair.igroup, kstep=q4_k_pair.kstep,
                           words=q4_k_pair.dequant_words)
LOADS = switches.choice(LOADS_ENV, tuple(FAMILIES), "pairx")
FAMILY = FAMILIES[LOADS]


def gemv(w: Tiled, x: torch.Tensor, out: torch.Tensor | None = None, config=None,
         loads: str | None = None, qx=None) -> torch.Tensor:
    """y = W @ x for one token, W tiled (pack): matmul.gemv on the TILED family; loads (a FAMILIES
    key) runs that integer step instead of FAMILY's (to time or test them side by side); qx: x
    already quantized to Q8_K (act_quant.QuantX, as a norm writes it), else the GEMV quantizes x."""
    # (imported here: matmul imports dispatch, which imports this module)
    from sparkd.engine.kernels import dispatch, matmul

    what = "the Q4_K_TILED GEMV"
    loads = _checked_loads(loads)
    if w.layout != layout_of(loads):
        raise KernelArgumentError(f"could not run {what}: loads {loads!r} reads the {layout_of(loads) or 'GGUF'} "
                                  f"header order, the tensor has the {w.layout or 'GGUF'} one; pack it with "
                                  f"pack(raw, shape, loads={loads!r})")
    if config is not None:
        matmul.check_one_tile(FAMILIES[loads], config, what)
    if loads == LOADS:
        return matmul.gemv(w.data, TILED, (w.rows, w.cols), x, out=out, config=config, qx=qx)
    fam = FAMILIES[loads]
    cfg = config or matmul.default_config(fam)
    dispatch.check_activations(x, w.cols, what)
    dispatch.check_out(out, (w.rows,), x.device, what)
    dispatch.device_of(w.data, x, what)
    matmul.check_qx(qx, fam, w.cols, what)
    y = torch.empty(w.rows, dtype=torch.float32, device=x.device) if out is None else out
    return matmul.igemv(w.data, fam.idot, fam.iacc, fam.act_fmt, (w.rows, w.cols), fam.row_bytes(w.cols), x, y,
                        cfg, qx, fam.isplit, kstep=fam.kstep)
