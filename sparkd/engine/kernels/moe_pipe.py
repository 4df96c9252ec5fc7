"""The Q8_0 MoE decode gate/up as a software-pipelined persistent kernel (session 19, moe42).

Why: session 18 (moe41) saw the gate/up's load-only twin reach 0.94 of a copy of its bytes only on a persistent grid
at its own residency, while the real kernel on such a grid did not move: a program runs its tiles one after another
and, inside a tile, a step's dots wait for that step's loads, with nothing of the next step in flight. Here a grid of
resident programs (N an SM, moe_tiles.Kernels.pipe / pipe_programs: 16 from width 4096, H200-measured) walks its (row tile, expert) tiles pid, pid + programs, ...
as one flat loop over (tile, step of the tile's unroll in groups), each iteration issuing the next step's weight words
(q8_0_words.words, into registers) before this step's dots (q8_0_words.dot_words) and, after a tile's last step, its
end (moe._gate_up_out: activation, routing weight, h quantized by a block's last tile). A tile's groups go onto its
elementwise tile in order as in q8_0_words.idot_full at any unroll: the same h and y bits as the grid kernel.
(A step of one group, 1 or 2 groups ahead, was the first try: ptxas waits for every outstanding load on one
scoreboard at a step's first dot, so only one group a program was in flight; offline sm_90: 61-64 registers.)

Only where q8_0_words.idot_full runs with the elementwise tile and the pair loop (moe._pipe_ok); the jit helpers the
grid kernel uses come in as constexpr functions (OFF, OUT, SUMS), since moe.py, which holds them, launches this one.
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
def _step_words(gate_ptr, up_ptr, go, uo, g0, U: tl.constexpr):
    """The weight words of groups g0..g0+U-1 (U 1, 2 or 4) of gate's and up's rows: (gate lane, gate head, up lane,
    up head) per group, groups past U repeating the first (unused)."""
    gw0, gh0 = q8_0_words.words(gate_ptr, go, g0)
    uw0, uh0 = q8_0_words.words(up_ptr, uo, g0)
    gw1, gh1, uw1, uh1 = gw0, gh0, uw0, uh0
    gw2, gh2, uw2, uh2 = gw0, gh0, uw0, uh0
    gw3, gh3, uw3, uh3 = gw0, gh0, uw0, uh0
    if U > 1:
        gw1, gh1 = q8_0_words.words(gate_ptr, go, g0 + 1)
        uw1, uh1 = q8_0_words.words(up_ptr, uo, g0 + 1)
    if U > 2:
        gw2, gh2 = q8_0_words.words(gate_ptr, go, g0 + 2)
        uw2, uh2 = q8_0_words.words(up_ptr, uo, g0 + 2)
        gw3, gh3 = q8_0_words.words(gate_ptr, go, g0 + 3)
        uw3, uh3 = q8_0_words.words(up_ptr, uo, g0 + 3)
    return gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3


@triton.jit
def _step_dots(gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3, xw_ptr, xd_ptr, g0,
               acc_g, acc_u, U: tl.constexpr, EMU: tl.constexpr):
    """_step_words' groups onto the elementwise tiles, in order (q8_0_words.dot_words)."""
    acc_g = q8_0_words.dot_words(gw0, gh0, xw_ptr, xd_ptr, g0, acc_g, EMU)
    acc_u = q8_0_words.dot_words(uw0, uh0, xw_ptr, xd_ptr, g0, acc_u, EMU)
    if U > 1:
        acc_g = q8_0_words.dot_words(gw1, gh1, xw_ptr, xd_ptr, g0 + 1, acc_g, EMU)
        acc_u = q8_0_words.dot_words(uw1, uh1, xw_ptr, xd_ptr, g0 + 1, acc_u, EMU)
    if U > 2:
        acc_g = q8_0_words.dot_words(gw2, gh2, xw_ptr, xd_ptr, g0 + 2, acc_g, EMU)
        acc_u = q8_0_words.dot_words(uw2, uh2, xw_ptr, xd_ptr, g0 + 2, acc_u, EMU)
        acc_g = q8_0_words.dot_words(gw3, gh3, xw_ptr, xd_ptr, g0 + 3, acc_g, EMU)
        acc_u = q8_0_words.dot_words(uw3, uh3, xw_ptr, xd_ptr, g0 + 3, acc_u, EMU)
    return acc_g, acc_u


@triton.jit
def gate_up_kernel(gate_ptr, up_ptr, gate_off, up_off, ids_ptr, xw_ptr, xd_ptr, rw_ptr, h_ptr, hd_ptr, hs_ptr, hf_ptr,
                   tickets_ptr, F, row_bytes, n_tiles, IDS: tl.constexpr, OFF: tl.constexpr, OUT: tl.constexpr,
                   SUMS: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, G: tl.constexpr,
                   UNROLL: tl.constexpr, BLOCK_N: tl.constexpr, EMU: tl.constexpr, ACT: tl.constexpr,
                   ACT_A: tl.constexpr, ACT_B: tl.constexpr,
                   RW: tl.constexpr, HBLOCK: tl.constexpr, H8K: tl.constexpr, DOWN_AT_START: tl.constexpr = True,
                   PDL: tl.constexpr = False):
    """moe._igate_up_kernel's Q8_0 words work (G groups a row in steps of UNROLL (1, 2 or 4) dividing G) on a
    persistent grid, the next step's weight words in flight during this step's dots."""
    pdl.start(PDL, DOWN_AT_START)  # first: pdl's rule
    S: tl.constexpr = G // UNROLL  # steps a tile
    pid, progs = tl.program_id(0), tl.num_programs(0)
    tiles_f = F // BLOCK_N
    total = tl.cdiv(n_tiles - pid, progs) * S  # this program's (tile, step) iterations
    # the rows of this tile and of the next (past the program's last: the launch's last tile, an L2 hit, unused),
    # read a tile ahead so the expert offsets' loads never wait in front of a step's weight loads
    go, uo = _tile_rows(gate_off, up_off, ids_ptr, pid, tiles_f, row_bytes, BLOCK_N, IDS, OFF)
    ngo, nuo = _tile_rows(gate_off, up_off, ids_ptr, tl.minimum(pid + progs, n_tiles - 1), tiles_f, row_bytes,
                          BLOCK_N, IDS, OFF)
    gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3 = _step_words(
        gate_ptr, up_ptr, go, uo, 0, UNROLL)
    acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
    acc_u = acc_g
    for i in range(total):
        s = i % S
        last = s == S - 1  # the next step is the next tile's first
        (ngw0, ngh0, nuw0, nuh0, ngw1, ngh1, nuw1, nuh1, ngw2, ngh2, nuw2, nuh2, ngw3, ngh3, nuw3,
         nuh3) = _step_words(gate_ptr, up_ptr, tl.where(last, ngo, go), tl.where(last, nuo, uo),
                             ((s + 1) % S) * UNROLL, UNROLL)
        acc_g, acc_u = _step_dots(gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3,
                                  xw_ptr, xd_ptr, s * UNROLL, acc_g, acc_u, UNROLL, EMU)
        if last:  # the tile's end, then a fresh tile
            t = pid + (i // S) * progs
            OUT(SUMS(acc_g, A1, A2, A3), SUMS(acc_u, A1, A2, A3), t // tiles_f, t % tiles_f, rw_ptr, h_ptr, hd_ptr,
                hs_ptr, hf_ptr, tickets_ptr, F, BLOCK_N, ACT, ACT_A, ACT_B, RW, HBLOCK, H8K)
            acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
            acc_u = acc_g
            go, uo = ngo, nuo
            ngo, nuo = _tile_rows(gate_off, up_off, ids_ptr, tl.minimum(t + 2 * progs, n_tiles - 1), tiles_f,
                                  row_bytes, BLOCK_N, IDS, OFF)
        gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1 = ngw0, ngh0, nuw0, nuh0, ngw1, ngh1, nuw1, nuh1
        gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3 = ngw2, ngh2, nuw2, nuh2, ngw3, ngh3, nuw3, nuh3
    if not DOWN_AT_START:
        pdl.dependents(PDL)


def programs(n_tiles: int, per_sm: int, device: torch.device) -> int:
    """The persistent grid: per_sm programs on each SM (at most the resident slots the registers allow: 21 at 2/1/4/e,
    offline sm_90; the interpreter: per_sm programs), at most one a tile."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return min(n_tiles, per_sm * sms)
