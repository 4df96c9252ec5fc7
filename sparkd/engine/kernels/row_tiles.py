"""What the row-tiled resident layouts share (q4_k_tiled, q6_k_tiled): every few rows of a GGUF
K-quant matrix become one tile, the same bytes in another order. Here: the tensor they make, which
shapes they take, the checked view of the file's blocks by tile that their repacking starts from,
the register word pick of their integer steps and the order their tiles' rows are summed in (row_sums,
also the GGUF K-quant steps': matmul.row_idot, the MoE's)."""

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
    layout: str = ""  # which of a module's byte orders (q4_k_tiled: "bytes", "pairx" or ""), checked by its gemv


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


@triton.jit
def word(t, v, k):
    """Word k (any int shape broadcast against t) of each thread's 4 words t, their index v along
    dimension 3 (which one thread holds whole): t's shape with 1 there, in registers."""
    return tl.sum(tl.where(v == k, t, 0), 3, keep_dims=True)


@triton.jit
def row_sums(acc, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr):
    """Each row's sum of an elementwise tile acc [BN, A1, A2]: tl.sum (A3 0), or (A3: Family.isplit)
    over the step's own [BN, A1, 2, A3] in one fixed order: the A3 words one after another (each
    taken out exactly: one value plus zeros), then the pair, then tl.sum over A1 as before. Why:
    triton 3.6 sums a dimension merged by tl.reshape over the wrong lanes where a thread holds
    fewer than 4 of its words (session 7, diag12), and the interpreter's np.sum adds 8 values
    pairwise where the GPU adds a thread's 4 in order: this order is the compiled one of the tiles
    that were right, and the same under the interpreter (session 8, diag16)."""
    # (one return: triton 3.6 compiles the code after a return in a constexpr if too)
    if A3 == 0:
        s = tl.sum(acc, 2)
    else:  # (A2 == 2 * A3, else the reshape fails to compile)
        t = tl.reshape(acc, (acc.shape[0], A1, A2 // A3, A3))
        v = tl.arange(0, A3)[None, None, None, :]
        s = tl.sum(tl.where(v == 0, t, 0.0), 3)
        for k in tl.static_range(1, A3):
            s += tl.sum(tl.where(v == k, t, 0.0), 3)
        s = tl.sum(s, 2)  # a sum of 2 is the same in any order
    return tl.sum(s, 1)
