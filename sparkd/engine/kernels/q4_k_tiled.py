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
other: the integer step is q4_k's (the same code on pointers to a group's qs and header), so a
tile config gives the same bits on both layouts; the GEMM dequantizes as q4_k.dequant does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import q4_k
from sparkd.engine.kernels.act_quant import Q8_K
from sparkd.engine.kernels.family import Family, KernelArgumentError

TILE_ROWS = 4
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)


@dataclass(frozen=True)
class LayoutType:
    """The qtype of the repacked layout (not a GGUF type): what KernelLinear and gemv are handed."""

    name: str


TILED = LayoutType("Q4_K_TILED")


@dataclass(frozen=True)
class TiledQ4_K:
    """A [rows, cols] Q4_K tensor in the tiled layout: data uint8 [rows * cols // 256 * 144]."""

    data: torch.Tensor
    rows: int
    cols: int


def packable(shape: tuple[int, int]) -> bool:
    """Whether a Q4_K matrix of this shape can take the tiled layout (whole tiles of rows)."""
    return shape[0] % TILE_ROWS == 0 and shape[1] > 0 and shape[1] % 256 == 0


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q4_K blocks of W [rows, cols] (on any device) -> the tiled bytes (same count),
    uint8, on the same device."""
    rows, cols = shape
    what = "the Q4_K repacking"
    if not packable(shape):
        raise KernelArgumentError(f"could not run {what}: [{rows}, {cols}] needs rows a multiple of "
                                  f"{TILE_ROWS} and columns a positive multiple of 256; keep it as GGUF blocks")
    groups = cols // 256
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != rows * groups * 144:
        raise KernelArgumentError(f"could not run {what}: need {rows * groups * 144} bytes (1-D uint8) for "
                                  f"[{rows}, {cols}], got {raw.dtype} {list(raw.shape)}")
    blocks = raw.view(rows // TILE_ROWS, TILE_ROWS, groups, 144).transpose(1, 2)  # [tiles, G, R, 144]
    tiles = blocks.shape[0]
    qs = blocks[..., 16:].reshape(tiles, -1)
    hdr = blocks[..., :16].reshape(tiles, -1)
    return torch.cat([qs, hdr], 1).reshape(-1)


def pack(raw: torch.Tensor, shape: tuple[int, int]) -> TiledQ4_K:
    """pack_raw as a TiledQ4_K."""
    return TiledQ4_K(pack_raw(raw, shape), *shape)


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
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q4_k's dequant on the tiled layout; aux_ptr: int32 [1], the row width (matmul.gemm passes
    it to families with row tiles: a row's place in its tile follows from it)."""
    qs, hdr = _group(w_ptr, row_off, g, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    return q4_k.dequant_at(qs, hdr, smask)


FAMILY = Family(TILED, 256, 144, 8, 32, dequant, align=4, idot=idot, act_fmt=Q8_K, iacc=(4, 8), row_tile=TILE_ROWS)


def gemv(w: TiledQ4_K, x: torch.Tensor, out: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """y = W @ x for one token, W tiled (pack): matmul.gemv on the TILED family."""
    from sparkd.engine.kernels.matmul import gemv as run  # matmul imports dispatch, which imports this

    return run(w.data, TILED, (w.rows, w.cols), x, out=out, config=config)
