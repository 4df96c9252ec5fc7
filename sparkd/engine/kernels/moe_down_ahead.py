"""The Q8_0 MoE decode down's step loop with the next step's weight words in flight during this step's dots
(session 20, moe46).

Why: the grid down (moe._idown_kernel, one program a (row tile, expert range), 32 one-warp programs an SM) runs
each step as load, wait, dots: a program's 12 steps at 4096x1536 top-8 are 12 round trips to memory with the dots
between them in the chain. moe44 (session 19) found that the next step's words loaded before this step's dots won
3.5 % on the down alone at one tile a program, inside a persistent kernel whose other machinery lost; this is that
loop in the grid kernel itself, one program's experts of its range one after another as before. The engine runs it
by width (moe_tiles.down_ahead, ahead_tile_fits): on the H200 it won at 2048x768 on the tile 2/1/3/e/2 (one step an
expert: the next expert's row in flight during this one's dots; layer -7 to -8.5 %), and stayed under the bar at 4096
(2/1/2/e/2: -2.0 % and -0.8 % in two processes) and 7168 (-1.9 %): docs/performance.md, session 20.

One flat loop over (expert of the range, step of UNROLL groups): each iteration loads the next step's words
(q8_0_words.words; the next expert's first where this step is an expert's last), then this step's dots
(q8_0_words.dot_words). ptxas puts every weight load on one scoreboard, so a step's dots must not need a load of
the same iteration: the previous iteration's words are waited for at the loop's top and the next step's loads go
out between this step's dots (bench/moe_kernels_sass.py --order). The next expert's offset is read an expert ahead,
so no dependent offset load stands in front of a step's loads. A row's groups go onto the expert's elementwise tile
in order, its row sums times the routing weight onto the range's sums as row_idot's: the grid kernel's bits.
"""

import triton
import triton.language as tl

from sparkd.engine.kernels import q8_0_words
from sparkd.engine.kernels.row_tiles import row_sums


@triton.jit
def _words(w_ptr, wo, g0, U: tl.constexpr):
    """The weight words of groups g0..g0+U-1 (U 1 to 4) of rows wo (byte offsets [BN]): (lane, head) per group,
    groups past U repeating the first (unused, no load)."""
    w0, h0 = q8_0_words.words(w_ptr, wo, g0)
    w1, h1, w2, h2, w3, h3 = w0, h0, w0, h0, w0, h0
    if U > 1:
        w1, h1 = q8_0_words.words(w_ptr, wo, g0 + 1)
    if U > 2:
        w2, h2 = q8_0_words.words(w_ptr, wo, g0 + 2)
    if U > 3:
        w3, h3 = q8_0_words.words(w_ptr, wo, g0 + 3)
    return w0, h0, w1, h1, w2, h2, w3, h3


@triton.jit
def _dots(w0, h0, w1, h1, w2, h2, w3, h3, xw_ptr, xd_ptr, g0, acc, U: tl.constexpr, EMU: tl.constexpr):
    """_words' groups onto the elementwise tile acc [BN, 8, 8], in order."""
    acc = q8_0_words.dot_words(w0, h0, xw_ptr, xd_ptr, g0, acc, EMU)
    if U > 1:
        acc = q8_0_words.dot_words(w1, h1, xw_ptr, xd_ptr, g0 + 1, acc, EMU)
    if U > 2:
        acc = q8_0_words.dot_words(w2, h2, xw_ptr, xd_ptr, g0 + 2, acc, EMU)
    if U > 3:
        acc = q8_0_words.dot_words(w3, h3, xw_ptr, xd_ptr, g0 + 3, acc, EMU)
    return acc


@triton.jit
def range_sums(w_ptr, down_off, ids_ptr, rb, hw_ptr, hd_ptr, rw_ptr, first, last, F, IDS: tl.constexpr,
               OFF: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, NG: tl.constexpr,
               UNROLL: tl.constexpr, XBLOCK: tl.constexpr, EMU: tl.constexpr):
    """sum over experts a in [first, last) of rw[a] * (down_a's rows rb @ h[a]), float32 [BN]: NG groups a row (every
    row and group in range: moe._full) in steps of UNROLL (1 to 4) groups dividing NG; OFF(off_ptr, ids_ptr, a, IDS,
    ALIGN) the expert's byte offset (moe._aligned_offset)."""
    S: tl.constexpr = NG // UNROLL  # steps an expert
    end = last - 1  # the range's last expert: where the reads ahead stop (an empty range reads it, unused)
    wo = OFF(down_off, ids_ptr, tl.minimum(first, end), IDS, 1) + rb
    nwo = OFF(down_off, ids_ptr, tl.minimum(first + 1, end), IDS, 1) + rb
    w0, h0, w1, h1, w2, h2, w3, h3 = _words(w_ptr, wo, 0, UNROLL)
    part = tl.zeros((rb.shape[0], A1, A2), tl.float32)  # this expert's elementwise tile
    acc = tl.zeros((rb.shape[0],), tl.float32)
    for i in range((last - first) * S):
        s = i % S
        a = first + i // S
        # the next step's words first (past the range's last step: its last expert's first group, unused)
        nw0, nh0, nw1, nh1, nw2, nh2, nw3, nh3 = _words(w_ptr, tl.where(s == S - 1, nwo, wo), ((s + 1) % S) * UNROLL,
                                                        UNROLL)
        part = _dots(w0, h0, w1, h1, w2, h2, w3, h3, hw_ptr + a * (F // 4), hd_ptr + a * (F // XBLOCK), s * UNROLL,
                     part, UNROLL, EMU)
        if s == S - 1:  # the expert's end: its row sums times its weight, as row_idot's, then the next expert
            acc += row_sums(part, A1, A2, A3) * tl.load(rw_ptr + a)
            part = tl.zeros((rb.shape[0], A1, A2), tl.float32)
            wo = nwo
            nwo = OFF(down_off, ids_ptr, tl.minimum(a + 2, end), IDS, 1) + rb
        w0, h0, w1, h1, w2, h2, w3, h3 = nw0, nh0, nw1, nh1, nw2, nh2, nw3, nh3
    return acc
