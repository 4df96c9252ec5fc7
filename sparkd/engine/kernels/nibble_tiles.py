"""16-row tiles for GGUF's 4-bit blocks of 32 values that are a head then 16 quant bytes (MXFP4: e8m0 e | qs[16],
17 bytes; Q4_0: f16 d | qs[16], 18 bytes), repacked once at load so that the decode step reads a block's quants in
one 128-bit load.

In the file, such blocks are only 1- or 2-byte aligned, so the integer steps build each 32-bit word of qs from byte
or 16-bit loads (H200: MXFP4 0.14-0.27 of copy bandwidth, session 24; Q4_0 0.20-0.31, session 21). Repacked, every
TILE_ROWS = 16 rows of a matrix of B blocks a row are one tile of 16 (16 + H) B bytes (H the head's bytes), the same
bytes in another order:
  qs    row r's block b at 16 (r B + b): 16-byte aligned, a thread's block one 128-bit load, a warp's 4-row tile of
        8 blocks four runs of 128 consecutive bytes;
  heads after the tile's 16 B qs: row r's block b's at 256 B + H (r B + b).
Nothing padded: every tile starts on 16 bytes whatever B (16 (16 + H) B), so only matrices whose row count is a
multiple of TILE_ROWS can be repacked; rows need only be whole blocks (gpt-oss's 2880 values: 90). mxfp4_tiled and
q4_0_tiled are the two layouts (their steps: the GGUF steps' arithmetic on the same words); resident projections
and experts take them at load, streamed experts (the pinned arena holds the file's bytes) keep the GGUF blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError

TILE_ROWS = 16
_R = tl.constexpr(TILE_ROWS)  # (what the jitted code reads)


@dataclass(frozen=True)
class NibbleTiles:
    """The layout over one GGUF type's blocks: `head` bytes (its scale) before each block's 16 quant bytes."""

    qtype: str
    head: int

    @property
    def block_bytes(self) -> int:
        return self.head + 16

    def packable(self, shape: tuple[int, int]) -> bool:
        """Whether a [rows, cols] matrix can take the layout: whole tiles of rows, whole blocks of values."""
        return shape[0] > 0 and shape[0] % TILE_ROWS == 0 and shape[1] > 0 and shape[1] % 32 == 0

    def _blocks(self, raw: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
        """Raw blocks of W [rows, cols] (1-D uint8, any device), checked, as a view [tiles, 16, B, block_bytes]."""
        rows, cols = shape
        if not self.packable(shape):
            raise KernelArgumentError(f"could not run {what}: [{rows}, {cols}] needs rows a positive multiple of "
                                      f"{TILE_ROWS} and columns a positive multiple of 32; keep it as GGUF blocks")
        n_bytes = rows * cols // 32 * self.block_bytes
        if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != n_bytes:
            raise KernelArgumentError(f"could not run {what}: need {n_bytes} bytes (1-D uint8) for [{rows}, {cols}], "
                                      f"got {raw.dtype} {list(raw.shape)}")
        return raw.view(rows // TILE_ROWS, TILE_ROWS, cols // 32, self.block_bytes)

    def pack_raw(self, raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """Raw GGUF blocks of W [rows, cols] (on any device) -> the tiled bytes (same count), uint8, same device."""
        blocks = self._blocks(raw, shape, f"the {self.qtype} repacking")
        tiles, h = blocks.shape[0], self.head
        return torch.cat([blocks[..., h:].reshape(tiles, -1), blocks[..., :h].reshape(tiles, -1)], 1).reshape(-1)

    def unpack_raw(self, data: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """pack_raw's inverse: the GGUF blocks back (what a dequantizing reference reads)."""
        rows, cols = shape
        n_blocks = cols // 32
        tiles = self._blocks(data, shape, f"the {self.qtype} unpacking").reshape(rows // TILE_ROWS, -1)
        qs = tiles[:, :TILE_ROWS * n_blocks * 16].reshape(-1, TILE_ROWS, n_blocks, 16)
        heads = tiles[:, TILE_ROWS * n_blocks * 16:].reshape(-1, TILE_ROWS, n_blocks, self.head)
        return torch.cat([heads, qs], 3).reshape(-1)


@triton.jit
def offsets(row_off, K, HEAD: tl.constexpr):
    """(the row's qs, its heads) as byte offsets from the weight pointer; row_off: the GGUF layout's offset of the
    row (row * (16 + HEAD) B bytes). The tile start is built from the constant 16 (16 + HEAD) so the compiler sees
    it 16-byte aligned."""
    n_blocks = K // 32
    row = row_off // (n_blocks * (16 + HEAD))
    lane = row % _R
    tile = (row // _R) * n_blocks * (_R * (16 + HEAD))
    return tile + lane * n_blocks * 16, tile + n_blocks * (_R * 16) + lane * n_blocks * HEAD


@triton.jit
def words(w_ptr, qs, b, w, m):
    """Blocks b's 4 words w of qs (int32, [BN, 8, 4]): one 128-bit load a block and thread (0 outside m)."""
    return tl.load((w_ptr + qs[:, None, None] + b * 16).to(tl.pointer_type(tl.int32)) + w, mask=m, other=0)


@triton.jit
def word_values(l0, l1, l2, l3, h0, h1, h2, h3):
    """A nibble word's 8 values [n] each (its bytes' low nibbles', then their high nibbles') as [n, 8] in that order,
    a lane's own registers (the words kernels of dequantize: no layout change; tl.join's axis is the index's low
    bit)."""
    v = tl.join(tl.join(tl.join(l0, h0), tl.join(l2, h2)), tl.join(tl.join(l1, h1), tl.join(l3, h3)))
    return tl.reshape(v, (l0.shape[0], 8))
