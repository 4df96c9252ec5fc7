"""DeepSeek V4's compressor in a static decode step (layers/kv_compressor.py Compressor._step, its torch code the
reference) in one launch: the token's value and score rows into the ring, and its block's entry before the norm,
the softmax over the block's rows of each column's scores weighting the values. The torch code is ~30 small
launches (modulos, gathers, masks, the two halves' concatenation, the softmax, the sum) and a DeepSeek V4 Flash
layer runs one or two compressors a token. A program per column tile; the token's own row is taken from the
inputs, not read back from the ring this launch writes. Triton's exp and sums: within float32 rounding of torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _compress_step_kernel(kv_ptr, score_ptr, ape_ptr, ring_kv_ptr, ring_score_ptr, pos_ptr, out_ptr, W,
                          D: tl.constexpr, R: tl.constexpr, RING: tl.constexpr, OVERLAP: tl.constexpr,
                          ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    c = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)  # the entry's columns
    live = c < D
    pos = tl.load(pos_ptr)
    first = pos - pos % R  # the block's first position
    j = tl.arange(0, ROWS)[:, None]
    if OVERLAP:  # the previous block's rows give the first halves, the block's own rows the second
        p = first - R + j
        col = tl.where(j < R, c[None, :], D + c[None, :])
    else:
        p = first + j
        col = c[None, :] + j * 0
    seen = (p >= 0) & live[None, :]
    row = tl.where(p >= 0, p % RING, 0)
    v = tl.load(ring_kv_ptr + row * W + col, mask=seen, other=0.0)
    s = tl.load(ring_score_ptr + row * W + col, mask=seen, other=float("-inf"))
    new_v = tl.load(kv_ptr + col, mask=live[None, :], other=0.0)
    new_s = tl.load(score_ptr + col, mask=live[None, :], other=0.0) + \
        tl.load(ape_ptr + (pos % R) * W + col, mask=live[None, :], other=0.0)
    mine = p == pos
    v = tl.where(mine, new_v, v)
    s = tl.where(mine, new_s, s)
    e = tl.exp(s - tl.max(s, axis=0)[None, :])
    out = tl.sum(v * e, axis=0) / tl.sum(e, axis=0)
    tl.store(out_ptr + c, out, mask=live)
    # the token's row into the ring: the columns this program read it at (no other program reads them)
    at = pos % RING
    for half in tl.static_range(2 if OVERLAP else 1):  # with overlap the row is two entries' halves wide
        cc = c + half * D
        tl.store(ring_kv_ptr + at * W + cc, tl.load(kv_ptr + cc, mask=live), mask=live)
        tl.store(ring_score_ptr + at * W + cc, tl.load(score_ptr + cc, mask=live) +
                 tl.load(ape_ptr + (pos % R) * W + cc, mask=live), mask=live)


def compress_step(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, ring_kv: torch.Tensor,
                  ring_score: torch.Tensor, pos: torch.Tensor, ratio: int, overlap: bool) -> torch.Tensor:
    """kv, score [1, W] the token's rows (score before its bias ape[pos % ratio], ape [ratio, W]); ring_kv, ring_score
    [RING, W] (RING = 2 ratio with overlap, else ratio) get them at row pos % RING; pos [1] int64 on the device →
    the entry [1, D] before its norm (D = W / 2 with overlap, else W). float32, contiguous."""
    W = kv.shape[-1]
    D = W // 2 if overlap else W
    rows = 2 * ratio if overlap else ratio
    out = torch.empty(1, D, dtype=torch.float32, device=kv.device)
    block_d = min(triton.next_power_of_2(D), max(16, 4096 // rows))  # a tile of rows x columns in registers
    _compress_step_kernel[(triton.cdiv(D, block_d),)](
        kv.contiguous(), score.contiguous(), ape, ring_kv, ring_score, pos, out, W, D=D, R=ratio,
        RING=ring_kv.shape[0], OVERLAP=overlap, ROWS=rows, BLOCK_D=block_d, num_warps=4)
    return out
