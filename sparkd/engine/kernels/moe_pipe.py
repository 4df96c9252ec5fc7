"""The Q8_0 MoE decode gate/up as a software-pipelined persistent kernel (session 19, moe42).

Why: session 18 (moe41) saw the gate/up's load-only twin reach 0.94 of a copy of its bytes only on a persistent grid
at its own residency, while the real kernel on such a grid did not move: a program runs its tiles one after another
and, inside a tile, a step's dots wait for that step's loads, with nothing of the next step in flight. Here a grid of
resident programs (PROGRAMS an SM, moe_tiles.Kernels.pipe) walks its (row tile, expert) tiles pid, pid + programs, ...
as one flat loop over (tile, group), each iteration issuing the weight words of the group DEPTH iterations ahead
(q8_0_words.words, into registers) before this group's dots (q8_0_words.dot_words) and, after a tile's last group,
its end (moe._gate_up_out: activation, routing weight, h quantized by a block's last tile). A tile's groups go onto
its elementwise tile in order as in q8_0_words.idot_full at any unroll: the same h and y bits as the grid kernel.

Only where q8_0_words.idot_full runs with the elementwise tile and the pair loop (moe._pipe_ok); the jit helpers of
moe.py come in as constexpr functions (OFF, OUT, SUMS), since moe.py launches this kernel.
"""

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl, q8_0_words


@triton.jit
def _tile_rows(gate_off, up_off, ids_ptr, t, tiles_f, row_bytes, BLOCK_N: tl.constexpr, IDS: tl.constexpr,
               OFF: tl.constexpr):
    """Tile t's gate and up rows as byte offsets [BLOCK_N] (t = expert * tiles_f + row tile)."""
    a = t // tiles_f
    rb = ((t % tiles_f) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64) * row_bytes
    return OFF(gate_off, ids_ptr, a, IDS, 1) + rb, OFF(up_off, ids_ptr, a, IDS, 1) + rb


@triton.jit
def gate_up_kernel(gate_ptr, up_ptr, gate_off, up_off, ids_ptr, xw_ptr, xd_ptr, rw_ptr, h_ptr, hd_ptr, hs_ptr, hf_ptr,
                   tickets_ptr, F, row_bytes, n_tiles, IDS: tl.constexpr, OFF: tl.constexpr, OUT: tl.constexpr,
                   SUMS: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, G: tl.constexpr,
                   DEPTH: tl.constexpr, BLOCK_N: tl.constexpr, EMU: tl.constexpr, ACT: tl.constexpr,
                   RW: tl.constexpr, HBLOCK: tl.constexpr, H8K: tl.constexpr, DOWN_AT_START: tl.constexpr = True,
                   PDL: tl.constexpr = False):
    """moe._igate_up_kernel's Q8_0 words work (G groups a row, every row and group in range) on a persistent grid,
    DEPTH (1 or 2) groups' weight words in flight ahead of the dots."""
    pdl.start(PDL, DOWN_AT_START)  # first: pdl's rule
    pid, progs = tl.program_id(0), tl.num_programs(0)
    tiles_f = F // BLOCK_N
    total = tl.cdiv(n_tiles - pid, progs) * G  # this program's (tile, group) iterations
    # iteration j's weights: tile pid + (j // G) * progs (past this program's last: the launch's last tile, an L2
    # hit, unused), group j % G
    go, uo = _tile_rows(gate_off, up_off, ids_ptr, pid, tiles_f, row_bytes, BLOCK_N, IDS, OFF)
    gw0, gh0 = q8_0_words.words(gate_ptr, go, 0)
    uw0, uh0 = q8_0_words.words(up_ptr, uo, 0)
    if DEPTH == 2:
        go, uo = _tile_rows(gate_off, up_off, ids_ptr, tl.minimum(pid + (1 // G) * progs, n_tiles - 1), tiles_f,
                            row_bytes, BLOCK_N, IDS, OFF)
        gw1, gh1 = q8_0_words.words(gate_ptr, go, 1 % G)
        uw1, uh1 = q8_0_words.words(up_ptr, uo, 1 % G)
    else:  # (unused: the loop's carried values need a type)
        gw1, gh1, uw1, uh1 = gw0, gh0, uw0, uh0
    acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
    acc_u = acc_g
    for i in range(total):
        j = i + DEPTH
        go, uo = _tile_rows(gate_off, up_off, ids_ptr, tl.minimum(pid + (j // G) * progs, n_tiles - 1), tiles_f,
                            row_bytes, BLOCK_N, IDS, OFF)
        gwn, ghn = q8_0_words.words(gate_ptr, go, j % G)
        uwn, uhn = q8_0_words.words(up_ptr, uo, j % G)
        g = i % G
        acc_g = q8_0_words.dot_words(gw0, gh0, xw_ptr, xd_ptr, g, acc_g, EMU)
        acc_u = q8_0_words.dot_words(uw0, uh0, xw_ptr, xd_ptr, g, acc_u, EMU)
        if g == G - 1:  # the tile's last group: its end, then a fresh tile
            t = pid + (i // G) * progs
            OUT(SUMS(acc_g, A1, A2, A3), SUMS(acc_u, A1, A2, A3), t // tiles_f, t % tiles_f, rw_ptr, h_ptr, hd_ptr,
                hs_ptr, hf_ptr, tickets_ptr, F, BLOCK_N, ACT, RW, HBLOCK, H8K)
            acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
            acc_u = acc_g
        if DEPTH == 2:
            gw0, gh0, uw0, uh0 = gw1, gh1, uw1, uh1
            gw1, gh1, uw1, uh1 = gwn, ghn, uwn, uhn
        else:
            gw0, gh0, uw0, uh0 = gwn, ghn, uwn, uhn
    if not DOWN_AT_START:
        pdl.dependents(PDL)


def programs(n_tiles: int, per_sm: int, device: torch.device) -> int:
    """The persistent grid: per_sm programs on each SM (the resident slots the registers allow, Kernels.pipe; the
    interpreter: per_sm programs), at most one a tile."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return min(n_tiles, per_sm * sms)
