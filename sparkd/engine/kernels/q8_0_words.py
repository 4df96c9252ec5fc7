"""Q8_0's integer step on 32-bit weight words, GGUF layout as it is (no repacking).

A Q8_0 block is 34 bytes (f16 scale, 32 int8 quants), so a pair of blocks is 68 bytes = 17
aligned words when the row starts on 4 bytes (rows of a multiple of 64 values, expert offsets
and buffer a multiple of 4: moe.prepare checks it). The odd block's quants are 8 aligned words;
the even block's straddle: word 0 holds its scale and quants 0-1, words 1-7 quants 2-29, word 8
quants 30-31 and the odd block's scale. Lane l of the even block reads pair word l + 1 and meets
x's bytes shifted by 16 bits (x's words l and l + 1 of the block funnel-shifted; past the block,
zeros: the odd scale's bytes meet zero), its head word (word 0) meets x's word 0 shifted up (the
scale's bytes meet zero) in lane 0. Each block's scale comes out of its head word (even: word 0's
low half, odd: word 8's high half), so a weight byte costs a quarter of a 32-bit load instead of
half of a 16-bit one (q8_0.idot), and no separate 16-bit scale load per word.

The integer sums per block are the same as q8_0.idot's (exact); with EW the float order differs
(a lane holds other bytes of the block), without EW it is q8_0.idot's order bit for bit.

idot_full (session 7, moe13): the same step for launches whose every row and group is in range
(moe._full: rows a multiple of the tile, the width a multiple of the groups a loop step reads):
no masks (no predicated loads, no registers zeroed for masked-out lanes, no mask arithmetic); the
same bits as idot (bench/moe_kernels_sass.py: the gate/up loop 105 -> 89 warp instructions at
2/1/1/e, the down's 193 -> 155 at 4/1/1/g). Both are one step (_step, MASKED a constexpr; session 8,
moe16), the head's dp4a accumulating onto the words' in both (dp4a_add: integer, exact).
"""

import triton
import triton.language as tl

from sparkd.engine.kernels.act_quant import dp4a, dp4a_add


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """The step with masks: rows outside rmask and blocks past K read as zeros."""
    return _step(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU, True)


@triton.jit
def idot_full(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """The step where every row of rmask and group g are in range (the caller knows it: moe._full)."""
    return _step(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU, False)


@triton.jit
def _step(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr,
          MASKED: tl.constexpr):
    s = tl.arange(0, 8)[None, :, None]  # block in the group
    b = g * 8 + s  # block index along the row [1, 8, 1]; g * 8 is even: b's parity is s's
    lane = tl.arange(0, 8)[None, None, :]  # 32-bit word lane of the block
    even = (s % 2) == 0
    blk = w_ptr + row_off[:, None, None] + b * 34  # [BN, 8, 1] block starts
    full = tl.zeros((row_off.shape[0], 8, 8), tl.int32)
    shift = tl.where(even, 2, 0)
    wp = (blk + 2 + shift + 4 * lane).to(tl.pointer_type(tl.int32))
    hp = (blk - 2 + shift + full).to(tl.pointer_type(tl.int32))
    xb = xw_ptr + b * 8 + lane + full  # x's words of the block
    if MASKED:
        bmask = b * 32 < K
        m = (rmask[:, None, None] & bmask) & (full == 0)  # [BN, 8, 8]
        w, head = tl.load(wp, mask=m, other=0), tl.load(hp, mask=m, other=0)
        xlo = tl.load(xb, mask=m, other=0)
        xhi = tl.load(xb + 1, mask=m & even & (lane < 7), other=0)
        dx = tl.load(xd_ptr + b, mask=bmask, other=0.0)
    else:
        w, head = tl.load(wp), tl.load(hp)
        xlo = tl.load(xb)
        xhi = tl.load(xb + 1, mask=(lane < 7) & (full == 0), other=0)  # past the block: zeros (odd: unused)
        dx = tl.load(xd_ptr + b)
    xp = tl.where(even, ((xlo >> 16) & 0xFFFF) | (xhi << 16), xlo)
    xh = tl.where(even & (lane == 0), xlo << 16, 0)  # the even head's quants 0-1, its scale meets zero
    isum = dp4a_add(head, xh, dp4a(w, xp, EMU), EMU)  # integer, exact: the same sum either way
    if EW:  # into the elementwise tile acc [BN, 8, 8]
        bits = tl.where(even, head, head >> 16) & 0xFFFF
        d = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        acc += isum.to(tl.float32) * (d * dx)
    else:  # q8_0.idot's order: a float per block, then one per row
        dp = blk.to(tl.pointer_type(tl.float16))
        if MASKED:
            d = tl.load(dp, mask=rmask[:, None, None] & (b * 32 < K), other=0.0).to(tl.float32)
        else:
            d = tl.load(dp).to(tl.float32)
        acc += tl.sum(tl.sum(isum, 2).to(tl.float32) * tl.sum(d * dx, 2), 1)
    return acc


# Session 19 (moe42): the unmasked elementwise step (idot_full with EW) split into its weight loads and the
# rest, so a software-pipelined loop (moe_pipe) can issue the next step's weight words before this step's dots.
# The same operations as _step's unmasked EW path in the same order: the same bits.


@triton.jit
def words(w_ptr, row_off, g):
    """The weight words of group g of the rows (row_off: byte offsets [BN]): (lane words, head words) [BN, 8, 8]."""
    s = tl.arange(0, 8)[None, :, None]
    lane = tl.arange(0, 8)[None, None, :]
    blk = w_ptr + row_off[:, None, None] + (g * 8 + s) * 34
    shift = tl.where((s % 2) == 0, 2, 0)
    full = tl.zeros((row_off.shape[0], 8, 8), tl.int32)
    w = tl.load((blk + 2 + shift + 4 * lane).to(tl.pointer_type(tl.int32)))
    head = tl.load((blk - 2 + shift + full).to(tl.pointer_type(tl.int32)))
    return w, head


@triton.jit
def dot_words(w, head, xw_ptr, xd_ptr, g, acc, EMU: tl.constexpr):
    """acc [BN, 8, 8] + group g's products of words(...)'s (w, head) with x (idot_full's EW sums)."""
    s = tl.arange(0, 8)[None, :, None]
    b = g * 8 + s
    lane = tl.arange(0, 8)[None, None, :]
    even = (s % 2) == 0
    full = tl.zeros(w.shape, tl.int32)
    xb = xw_ptr + b * 8 + lane + full
    xlo = tl.load(xb)
    xhi = tl.load(xb + 1, mask=(lane < 7) & (full == 0), other=0)
    dx = tl.load(xd_ptr + b)
    xp = tl.where(even, ((xlo >> 16) & 0xFFFF) | (xhi << 16), xlo)
    xh = tl.where(even & (lane == 0), xlo << 16, 0)
    isum = dp4a_add(head, xh, dp4a(w, xp, EMU), EMU)
    bits = tl.where(even, head, head >> 16) & 0xFFFF
    d = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return acc + isum.to(tl.float32) * (d * dx)
