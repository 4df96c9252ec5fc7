"""MXFP4 resident experts repacked once at load so that the decode step reads each block's quants in one 128-bit load.

A GGUF MXFP4 block is 17 bytes (e8m0 scale e | qs[16]), so blocks sit at every byte alignment and mxfp4's integer
step builds each 32-bit word of qs from 4 byte loads: 17 loads a block and thread, a warp's load touching 32 blocks
at a 17-byte stride (H200, session 24: 0.14-0.27 of copy bandwidth). Repacked, every TILE_ROWS = 16 rows of a
matrix of B blocks a row are one tile of 16 * 17 * B bytes, the same bytes in another order:
  qs  row r's block b at 16 (r B + b): 16-byte aligned, a thread's block one 128-bit load, a warp's 4-row tile of 8
      blocks four runs of 128 consecutive bytes;
  e   after the tile's 16 B qs: row r's block b at 256 B + r B + b.
Nothing padded: every tile starts on 16 bytes whatever B (16 * 17 B), so only matrices whose row count is a multiple
of TILE_ROWS can be repacked (gpt-oss's 2880 rows can); rows need only be whole blocks (2880 values: 90). The MoE
takes it for resident experts (moe.tiled_experts, layers/quant_experts.py); streamed experts (the pinned arena holds
the file's bytes) keep the GGUF layout and mxfp4's step.

The integer step is mxfp4's arithmetic on the same words (mxfp4.block_sums, one float step per block), so the same
bits as mxfp4.idot on the GGUF blocks at the same tile; iblock / dequant hand the prefill GEMM the same values.
$SPARKD_MXFP4_INT=0 takes the float path on this layout too (FAMILY without idot: dequant, then multiply).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import mxfp4, q4_0
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family, KernelArgumentError, LayoutType

TILE_ROWS = 16
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)

TILED = LayoutType("MXFP4_TILED")


def packable(shape: tuple[int, int]) -> bool:
    """Whether a [rows, cols] matrix can take the layout: whole tiles of rows, whole blocks of values."""
    return shape[0] > 0 and shape[0] % TILE_ROWS == 0 and shape[1] > 0 and shape[1] % 32 == 0


def _blocks(raw: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
    """Raw MXFP4 blocks of W [rows, cols] (1-D uint8, any device), checked, as a view [tiles, 16, B, 17]."""
    rows, cols = shape
    if not packable(shape):
        raise KernelArgumentError(f"could not run {what}: [{rows}, {cols}] needs rows a positive multiple of "
                                  f"{TILE_ROWS} and columns a positive multiple of 32; keep it as GGUF blocks")
    n_bytes = rows * cols // 32 * 17
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != n_bytes:
        raise KernelArgumentError(f"could not run {what}: need {n_bytes} bytes (1-D uint8) for [{rows}, {cols}], "
                                  f"got {raw.dtype} {list(raw.shape)}")
    return raw.view(rows // TILE_ROWS, TILE_ROWS, cols // 32, 17)


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF MXFP4 blocks of W [rows, cols] (on any device) -> the tiled bytes (same count), uint8, same device."""
    blocks = _blocks(raw, shape, "the MXFP4 repacking")
    tiles = blocks.shape[0]
    return torch.cat([blocks[..., 1:].reshape(tiles, -1), blocks[..., 0].reshape(tiles, -1)], 1).reshape(-1)


def unpack_raw(data: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """pack_raw's inverse: the GGUF blocks back (what a dequantizing reference reads)."""
    rows, cols = shape
    n_blocks = cols // 32
    tiles = _blocks(data, shape, "the MXFP4 unpacking").reshape(rows // TILE_ROWS, -1)
    qs = tiles[:, :TILE_ROWS * n_blocks * 16].reshape(-1, TILE_ROWS, n_blocks, 16)
    e = tiles[:, TILE_ROWS * n_blocks * 16:].reshape(-1, TILE_ROWS, n_blocks, 1)
    return torch.cat([e, qs], 3).reshape(-1)


@triton.jit
def _offsets(row_off, K):
    """(the row's qs, its e bytes) as byte offsets from the weight pointer; row_off: the GGUF layout's offset of the
    row (row * 17 B). The tile start is built from the constant 272 (16 * 17) so the compiler sees it 16-byte
    aligned."""
    n_blocks = K // 32
    row = row_off // (n_blocks * 17)
    lane = row % _R
    tile = (row // _R) * n_blocks * (_R * 17)
    return tile + lane * n_blocks * 16, tile + n_blocks * (_R * 16) + lane * n_blocks


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """mxfp4.idot on the tiled rows: group g's 8 blocks, each thread's block of 4 words in one load."""
    qs, e = _offsets(row_off, K)
    b, w, bmask, m, e_ptr = q4_0.group_blocks(w_ptr, e, rmask, g, K, 1)  # e_ptr: the blocks' scale bytes
    q = tl.load((w_ptr + qs[:, None, None] + b * 16).to(tl.pointer_type(tl.int32)) + w, mask=m, other=0)
    return mxfp4.add_blocks(acc, mxfp4.block_sums(q, xw_ptr, b, w, m, EMU), e_ptr, m, b, bmask, xd_ptr, EW)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """mxfp4's dequant on the tiled rows; aux_ptr: int32 [1], the row width (matmul.aux_arg: a row's place in its
    tile follows from it)."""
    qs, e = _offsets(row_off, tl.load(aux_ptr.to(tl.pointer_type(tl.int32))))
    b = g * 8 + tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    q = mxfp4.nibbles(tl.load(w_ptr + qs + b * 16 + i % 16, mask=smask, other=0).to(tl.int32), i)
    return mxfp4.d_at(w_ptr + e + b, smask) * mxfp4.values(q).to(tl.float32)


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """mxfp4.iblock on the tiled rows: block b's doubled e2m1 values (int8 [BN, 32]) and halved scale."""
    qs, e = _offsets(row_off, row_bytes // 17 * 32)
    q = tl.load((w_ptr + qs[:, None] + b * 16).to(tl.pointer_type(tl.int32)) + tl.arange(0, 4)[None, :],
                mask=rmask[:, None], other=0)
    return mxfp4.block_int8(q), tl.where(rmask, mxfp4.d_at(w_ptr + e + b, rmask), 0.0)


FLOAT_FAMILY = Family(TILED, 32, 17, 8, 32, dequant, align=16, row_tile=TILE_ROWS)
INT_FAMILY = dataclasses.replace(FLOAT_FAMILY, idot=idot, act_fmt=Q8_0, iacc=mxfp4.INT_FAMILY.iacc, iblock=iblock)
# $SPARKD_MXFP4_INT=0 (mxfp4.FAMILY the float one) takes the float path on this layout too
FAMILY = INT_FAMILY if mxfp4.FAMILY.idot is not None else FLOAT_FAMILY
