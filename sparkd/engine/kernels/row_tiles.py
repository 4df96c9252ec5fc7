"""What the row-tiled resident layouts share (q4_k_tiled, q6_k_tiled): every few rows of a GGUF
K-quant matrix become one tile, the same bytes in another order. Here: the tensor they make, which
shapes they take, the checked view of the file's blocks by tile that their repacking starts from,
the register word pick of their integer steps and the tile rule those steps need (holds_words)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError


@dataclass(frozen=True)
class Tiled:
    """A [rows, cols] tensor in a row-tiled layout: data uint8, as many bytes as its GGUF blocks."""

    data: torch.Tensor
    rows: int
    cols: int
    layout: str = ""  # which of a module's byte orders (q4_k_tiled: "bytes" or ""), checked by its gemv


@dataclass(frozen=True)
class RowTiles:
    """A layout of `rows`-row tiles over GGUF `qtype` super-blocks (256 values, block_bytes each)."""

    qtype: str
    rows: int
    block_bytes: int

    def packable(self, shape: tuple[int, int]) -> bool:
        """Whether a matrix of this shape can take the layout (whole tiles of rows)."""
        return shape[0] % self.rows == 0 and shape[1] > 0 and shape[1] % 256 == 0

    def blocks(self, raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """Raw GGUF blocks of W [rows, cols] (1-D uint8, any device), checked, as a view
        [tiles, groups, rows of the tile, block_bytes]."""
        rows, cols = shape
        what = f"the {self.qtype} repacking"
        if not self.packable(shape):
            raise KernelArgumentError(f"could not run {what}: [{rows}, {cols}] needs rows a multiple of "
                                      f"{self.rows} and columns a positive multiple of 256; keep it as GGUF blocks")
        groups = cols // 256
        n_bytes = rows * groups * self.block_bytes
        if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != n_bytes:
            raise KernelArgumentError(f"could not run {what}: need {n_bytes} bytes (1-D uint8) for "
                                      f"[{rows}, {cols}], got {raw.dtype} {list(raw.shape)}")
        return raw.view(rows // self.rows, self.rows, groups, self.block_bytes).transpose(1, 2)


# The vector integer steps (q4_k_tiled.idot_tile_vec, also moe's on GGUF Q4_K rows; q6_k_tiled's)
# compute a tile [BN, ..., 2, 4] whose last dimension holds 4 words (Q4_K: a row's header) that word()
# picks from, and tl.reshape it into the loop's accumulator [BN, A1, 8] (the two last dimensions
# merged). When a thread holds fewer than 4 of them, the compiler spreads both merged dimensions over
# lanes that are not adjacent, and triton 3.6 (the H200's) sums the accumulator's rows over the wrong
# lanes (2-row Q4_K programs: lane bits 0-1 where the merged dimension's are 0 and 4, so rows mixed
# and half the words left out; rel. error ~1). Tiles giving every
# thread its 4 words are right (session 7, bench/diag12_part_tile.py, bench/results/diag12_h200_s7.log).
THREAD_WORDS = 4
WARP_THREADS = 32


def holds_words(block_n: int, num_warps: int, row_words: int) -> bool:
    """Whether an elementwise tile of block_n rows, row_words int32 words each (Family.iacc's
    product), gives each of the program's threads THREAD_WORDS words (the rule of the vector steps)."""
    return block_n * row_words >= THREAD_WORDS * WARP_THREADS * num_warps


def check_holds_words(block_n: int, num_warps: int, row_words: int, what: str) -> None:
    """holds_words, else a KernelArgumentError naming the smallest block_n that holds them."""
    if not holds_words(block_n, num_warps, row_words):
        need = -(-THREAD_WORDS * WARP_THREADS * num_warps // row_words)
        raise KernelArgumentError(
            f"could not run {what}: an elementwise tile of {block_n} rows on {num_warps} warp(s) gives a thread "
            f"fewer than {THREAD_WORDS} of the vector step's words (triton 3.6 sums such tiles over the wrong "
            f"lanes); use block_n >= {need} on {num_warps} warp(s), or elementwise=False")


@triton.jit
def word(t, v, k):
    """Word k (any int shape broadcast against t) of each thread's 4 words t, their index v along
    dimension 3 (which one thread holds whole): t's shape with 1 there, in registers."""
    return tl.sum(tl.where(v == k, t, 0), 3, keep_dims=True)
