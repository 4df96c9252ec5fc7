"""Q4_K resident projections read by a GEMV tile of its own: one thread per (row, 32-byte chunk).

Same bytes as the file (GGUF Q4_K super-blocks, kernels/q4_k.py): no repacking is needed for
128-bit loads, every 144-byte block is 16-byte aligned and so is each of its four 32-byte qs
chunks. What differs from q4_k's tiles is who reads what: here each thread of a program owns one
chunk j of one row's group (sub-blocks 2j and 2j+1: 8 qs words, two 128-bit loads), sums its
dp4a products over those 8 words in registers, and applies the chunk's two 6-bit scales and mins
once, so the scale decoding and the float step are once per 64 values instead of per 32 (q4_k's
elementwise tile: 4 words per thread, half a chunk, the header decoded by both halves).

The layout is a family of its own (FAMILY, qtype CHUNKED) so resident projections can take it
(models/weights.py, $SPARKD_Q4_K_LAYOUT) while streamed experts and the MoE keep q4_k's tiles.
The integer sums per (row, sub-block) are q4_k's; only the float order of the tile's reduction
differs (the rows are summed chunk by chunk after the loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from sparkd.engine.kernels import q4_k
from sparkd.engine.kernels.act_quant import Q8_K, dp4a
from sparkd.engine.kernels.family import Family


@dataclass(frozen=True)
class LayoutType:
    """The qtype of a resident layout (not a GGUF type): what KernelLinear and gemv are handed."""

    name: str


CHUNKED = LayoutType("Q4_K_CHUNKED")


@triton.jit
def _chunk_sums(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, EMU: tl.constexpr):
    """Group g's share of each (row, chunk) as float32 [1, BN, 4, 1]. The tile [2, BN, 4, 4]:
    the leading 2 (the chunk's two 16-byte halves) stays in each thread's registers, so a
    thread holds one (row, chunk)'s 8 words and reduces them without a shuffle."""
    h = tl.arange(0, 2)[:, None, None, None]
    j = tl.arange(0, 4)[None, None, :, None]  # chunk: sub-blocks 2j (low nibbles), 2j+1 (high)
    w = tl.arange(0, 4)[None, None, None, :]
    blk = w_ptr + row_off[None, :, None, None] + g * 144  # [1, BN, 1, 1], 16-byte aligned
    m = rmask[None, :, None, None]
    words = tl.load((blk + 16).to(tl.pointer_type(tl.int32)) + j * 8 + h * 4 + w, mask=m, other=0)
    xw = xw_ptr + g * 64 + j * 16 + h * 4 + w + tl.zeros(words.shape, tl.int32)  # in the words' shape
    lo = tl.sum(tl.sum(dp4a(words & 0x0F0F0F0F, tl.load(xw), EMU), 3, keep_dims=True), 0, keep_dims=True)
    hi = tl.sum(tl.sum(dp4a((words >> 4) & 0x0F0F0F0F, tl.load(xw + 8), EMU), 3, keep_dims=True), 0,
                keep_dims=True)
    sc_lo, mn_lo = q4_k.scale_min_int(blk + 4, 2 * j, m)  # [1, BN, 4, 1]
    sc_hi, mn_hi = q4_k.scale_min_int(blk + 4, 2 * j + 1, m)
    xs = xs_ptr + g * 8 + 2 * j
    isum = sc_lo * lo + sc_hi * hi
    msum = mn_lo * tl.load(xs) + mn_hi * tl.load(xs + 1)
    dx = tl.load(xd_ptr + g)
    d = tl.load(blk.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32) * dx
    dmin = tl.load((blk + 2).to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32) * dx
    return d * isum.to(tl.float32) - dmin * msum.to(tl.float32)


@triton.jit
def idot(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """q4_k's integer step, a (row, chunk) per thread: into acc [BN, 4, 1] (EW) or [BN]."""
    part = tl.sum(_chunk_sums(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, EMU), 0)  # [BN, 4, 1]
    if EW:
        acc += part
    else:
        acc += tl.sum(tl.sum(part, 2), 1)
    return acc


@dataclass(frozen=True)
class ChunkedFamily(Family):
    def row_bytes(self, cols: int) -> int:
        return cols // 256 * 144


FAMILY = ChunkedFamily(CHUNKED, 256, 144, 8, 32, q4_k.dequant, align=16, idot=idot, act_fmt=Q8_K, iacc=(4, 1))
