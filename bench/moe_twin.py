"""Load-only twins of the MoE decode launches (bench/moe_tiles_bench.py times them next to the real
ones): the same grid, the same weight bytes per program in the same loop steps (a step = UNROLL of
x's 256-value groups of BLOCK_N rows, gate and up together as the pair loop has them; the down a
range of experts one after another, SPLIT ranges), the offsets loaded the same way and x's (h's)
words of each group loaded beside the weights, but only trivial integer arithmetic on what was
loaded (a wrapping sum the store depends on) and no activation, h quantization or fold. A twin
as slow as its kernel: the launch's grid and bytes bound it (memory, latency, launch); a twin much
faster: the kernel's instructions do. The weights are read as 32-bit words along the row (the real
Q4_K step reads its headers as 128-bit vectors): a twin is a floor on the loads' structure, not a
copy of their instructions. The down's twin may fold its ranges as the down does (down's y; moe17).
Session 9 (moe20): a gate/up on a row-tile layout (q4_k_tiled's pairx bytes, moe.prepare's tiled family) gets
the pair tile's twin (q4t_pair's "pair-loadonly" loads per group, gate's then up's, one program a 4-row tile).
Session 10 (moe21): a down on the pairx bytes (moe.tiled_down) the same: the pair tile's loads per group, a range's
experts one after another (its out float32)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import q4t_pair
from sparkd.engine.kernels import act_quant, dispatch, q4_k_tiled
from sparkd.engine.kernels.matmul import GemvConfig, emulate, fold_part, tickets


@triton.jit
def _group_sum(w_ptr, off_bytes, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc,
               GW: tl.constexpr, GWP: tl.constexpr, UNROLL: tl.constexpr, UP: tl.constexpr):
    """acc + the words of groups g0..g0+UNROLL-1 of the rows (+ x's words of those groups); UP:
    UNROLL's next power of two (the tile's extent)."""
    w = _step_words(w_ptr, off_bytes, rows64, rmask, row_words, g0, n_groups, GW, GWP, UNROLL, UP)
    return _x_xor(w, rmask, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)


@triton.jit
def _step_words(w_ptr, off_bytes, rows64, rmask, row_words, g0, n_groups, GW: tl.constexpr, GWP: tl.constexpr,
                 UNROLL: tl.constexpr, UP: tl.constexpr):
    """_group_sum's weight words [BLOCK_N, UP, GWP] (zeros outside the rows and groups)."""
    lane = tl.arange(0, GWP)[None, None, :]
    u = tl.arange(0, UP)[None, :, None]
    g = g0 + u
    m = rmask[:, None, None] & (lane < GW) & (g < n_groups) & (u < UNROLL)
    base = (w_ptr + off_bytes).to(tl.pointer_type(tl.int32)) + rows64[:, None, None] * row_words
    return tl.load(base + g * GW + lane, mask=m, other=0)


@triton.jit
def _x_xor(w, rmask, xw_ptr, g0, n_groups, acc, GW: tl.constexpr, GWP: tl.constexpr, UNROLL: tl.constexpr,
           UP: tl.constexpr):
    """acc + w ^ x's words of the groups (_group_sum's arithmetic)."""
    lane = tl.arange(0, GWP)[None, None, :]
    u = tl.arange(0, UP)[None, :, None]
    g = g0 + u
    m = rmask[:, None, None] & (lane < GW) & (g < n_groups) & (u < UNROLL)
    xv = tl.load(xw_ptr + g * 64 + (lane % 64), mask=m, other=0)
    return acc + (w ^ xv)


@triton.jit
def _twin_gate_up_kernel(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words, n_tiles,
                         GW: tl.constexpr, GWP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                         UP: tl.constexpr, VEC: tl.constexpr = False, PERSIST: tl.constexpr = 0,
                         PREFETCH: tl.constexpr = False):
    """VEC (session 18, moe41): the expert offsets known to be multiples of 16 bytes, so the row words load as
    128-bit vectors (the kernel's words step loads 32 bits a lane). PERSIST > 0: that many programs on a 1-D grid,
    each looping over the (row tile, expert) tiles pid, pid + PERSIST, ... (a persistent grid; else one a tile).
    PREFETCH (session 19, moe42; with PERSIST): the loop flat over (tile, step), the next step's weight words
    loaded before this step's arithmetic (moe_pipe's structure, a step ahead)."""
    if PERSIST > 0 and PREFETCH:
        _twin_gate_up_pipe(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words, n_tiles, GW,
                           GWP, BLOCK_N, UNROLL, UP, VEC, PERSIST)
    elif PERSIST > 0:
        for t in range(tl.program_id(0), n_tiles, PERSIST):
            _twin_gate_up_tile(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words,
                               t % tl.cdiv(F, BLOCK_N), t // tl.cdiv(F, BLOCK_N), GW, GWP, BLOCK_N, UNROLL, UP, VEC)
    else:
        _twin_gate_up_tile(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words,
                           tl.program_id(0), tl.program_id(1), GW, GWP, BLOCK_N, UNROLL, UP, VEC)


@triton.jit
def _twin_rows(gate_off, up_off, t, F, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """Tile t's (rows as int64, row mask, gate offset, up offset); t = expert * row tiles + row tile."""
    tf = tl.cdiv(F, BLOCK_N)
    rows = (t % tf) * BLOCK_N + tl.arange(0, BLOCK_N)
    go, uo = tl.load(gate_off + t // tf), tl.load(up_off + t // tf)
    if VEC:
        go, uo = tl.multiple_of(go, 16), tl.multiple_of(uo, 16)
    return rows.to(tl.int64), rows < F, go, uo


@triton.jit
def _twin_gate_up_pipe(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words, n_tiles,
                       GW: tl.constexpr, GWP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                       UP: tl.constexpr, VEC: tl.constexpr, PERSIST: tl.constexpr):
    pid = tl.program_id(0)
    steps = tl.cdiv(n_groups, UNROLL)
    total = tl.cdiv(n_tiles - pid, PERSIST) * steps
    rows64, rmask, go, uo = _twin_rows(gate_off, up_off, pid, F, BLOCK_N, VEC)
    wg = _step_words(gate_ptr, go, rows64, rmask, row_words, 0, n_groups, GW, GWP, UNROLL, UP)
    wu = _step_words(up_ptr, uo, rows64, rmask, row_words, 0, n_groups, GW, GWP, UNROLL, UP)
    acc = tl.zeros((BLOCK_N, UP, GWP), tl.int32)
    for i in range(total):
        j = i + 1  # the next step's words (past the last: the launch's last tile again, unused)
        nrows, nmask, ngo, nuo = _twin_rows(gate_off, up_off, tl.minimum(pid + (j // steps) * PERSIST, n_tiles - 1),
                                            F, BLOCK_N, VEC)
        ng0 = (j % steps) * UNROLL
        nwg = _step_words(gate_ptr, ngo, nrows, nmask, row_words, ng0, n_groups, GW, GWP, UNROLL, UP)
        nwu = _step_words(up_ptr, nuo, nrows, nmask, row_words, ng0, n_groups, GW, GWP, UNROLL, UP)
        t = pid + (i // steps) * PERSIST
        rows64, rmask, go, uo = _twin_rows(gate_off, up_off, t, F, BLOCK_N, VEC)
        g0 = (i % steps) * UNROLL
        acc = _x_xor(wg, rmask, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
        acc = _x_xor(wu, rmask, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
        if i % steps == steps - 1:
            tf = tl.cdiv(F, BLOCK_N)
            tl.store(out_ptr + (t // tf) * F + rows64, tl.sum(tl.sum(acc, 2), 1), mask=rmask)
            acc = tl.zeros((BLOCK_N, UP, GWP), tl.int32)
        wg, wu = nwg, nwu


@triton.jit
def _twin_gate_up_tile(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words, tile, a,
                       GW: tl.constexpr, GWP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                       UP: tl.constexpr, VEC: tl.constexpr):
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < F
    rows64 = rows.to(tl.int64)
    go, uo = tl.load(gate_off + a), tl.load(up_off + a)
    if VEC:
        go, uo = tl.multiple_of(go, 16), tl.multiple_of(uo, 16)
    acc = tl.zeros((BLOCK_N, UP, GWP), tl.int32)
    for g0 in range(0, n_groups, UNROLL):
        acc = _group_sum(gate_ptr, go, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
        acc = _group_sum(up_ptr, uo, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
    tl.store(out_ptr + a * F + rows, tl.sum(tl.sum(acc, 2), 1), mask=rmask)


@triton.jit
def _twin_gate_up_pair_kernel(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, xd_ptr, xs_ptr, out_ptr, F, G,
                              UNROLL: tl.constexpr, EMU: tl.constexpr):
    """The gate/up twin on the pair bytes: program (tile, expert) reads its tile's group g of gate, then of up, as
    q4t_pair's twin does (qs and x 128-bit, d | dmin, 2 scale words, x's sum and scale); out float32 [n, F]."""
    a = tl.program_id(1)
    tile = tl.program_id(0).to(tl.int64) * (G * 144)  # the tile's first word: 576 bytes a group
    gb = (gate_ptr + tl.multiple_of(tl.load(gate_off + a), 16)).to(tl.pointer_type(tl.int32)) + tile
    ub = (up_ptr + tl.multiple_of(tl.load(up_off + a), 16)).to(tl.pointer_type(tl.int32)) + tile
    acc = tl.zeros((32, 2), tl.float32)
    for g0 in range(0, G, UNROLL):
        for u in tl.static_range(UNROLL):
            ok = tl.zeros((1, 1), tl.int32) + g0 + u < G  # past the end: a valid group read, masked out
            g = tl.minimum(g0 + u, G - 1)
            acc = q4t_pair._group(gb, xw_ptr, xd_ptr, xs_ptr, g, G, ok, acc, 0, EMU)
            acc = q4t_pair._group(ub, xw_ptr, xd_ptr, xs_ptr, g, G, ok, acc, 0, EMU)
    rows = tl.program_id(0) * 4 + tl.arange(0, 4)
    tl.store(out_ptr + a * F + rows, tl.reshape(tl.sum(tl.reshape(acc, (16, 2, 2)), 0), (4,)))


@triton.jit
def _twin_down_kernel(down_ptr, down_off, hw_ptr, out_ptr, y_ptr, tickets_ptr, D, F, n, n_groups, row_words,
                      GW: tl.constexpr, GWP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                      UP: tl.constexpr, SPLIT: tl.constexpr, FOLD: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < D
    rows64 = rows.to(tl.int64)
    per = tl.cdiv(n, SPLIT)
    first = tl.program_id(1) * per
    acc = tl.zeros((BLOCK_N, UP, GWP), tl.int32)
    for a in range(first, tl.minimum(first + per, n)):
        off = tl.load(down_off + a)
        for g0 in range(0, n_groups, UNROLL):
            acc = _group_sum(down_ptr, off, rows64, rmask, row_words, hw_ptr + a * (F // 4), g0, n_groups, acc,
                             GW, GWP, UNROLL, UP)
    total = tl.sum(tl.sum(acc, 2), 1)
    if FOLD:  # the down's in-launch fold: partials as float32, the last program of a row tile adds them
        fold_part(y_ptr, out_ptr, tickets_ptr, tl.program_id(0), tl.program_id(1), rows, rmask,
                  total.to(tl.float32), D, SPLIT)
    else:
        tl.store(out_ptr + tl.program_id(1) * D + rows, total, mask=rmask)


@triton.jit
def _twin_down_pair_kernel(down_ptr, down_off, hw_ptr, hd_ptr, hs_ptr, out_ptr, y_ptr, tickets_ptr, D, F, n,
                           UNROLL: tl.constexpr, SPLIT: tl.constexpr, FOLD: tl.constexpr, EMU: tl.constexpr):
    """The down twin on the pair bytes: program (tile, range) reads its tile's groups of each expert of its range, as
    _twin_gate_up_pair_kernel reads one matrix; out float32 [SPLIT, D] (FOLD: the partials, y their ordered sum)."""
    G = F // 256
    tile = tl.program_id(0).to(tl.int64) * (G * 144)
    per = tl.cdiv(n, SPLIT)
    first = tl.program_id(1) * per
    acc = tl.zeros((32, 2), tl.float32)
    for a in range(first, tl.minimum(first + per, n)):
        base = (down_ptr + tl.multiple_of(tl.load(down_off + a), 16)).to(tl.pointer_type(tl.int32)) + tile
        for g0 in range(0, G, UNROLL):
            for u in tl.static_range(UNROLL):
                ok = tl.zeros((1, 1), tl.int32) + g0 + u < G
                g = tl.minimum(g0 + u, G - 1)
                acc = q4t_pair._group(base, hw_ptr + a * (F // 4), hd_ptr + a * G, hs_ptr + a * (F // 32), g, G, ok,
                                      acc, 0, EMU)
    rows = tl.program_id(0) * 4 + tl.arange(0, 4)
    total = tl.reshape(tl.sum(tl.reshape(acc, (16, 2, 2)), 0), (4,))  # thread t = 2c + p: row 2p + r
    if FOLD:
        fold_part(y_ptr, out_ptr, tickets_ptr, tl.program_id(0), tl.program_id(1), rows, rows < D, total, D, SPLIT)
    else:
        tl.store(out_ptr + tl.program_id(1) * D + rows, total)


def _group_words(fam: dispatch.Family) -> tuple[int, int]:
    """(32-bit words of one 256-value group of a row, the next power of two)."""
    words = fam.row_bytes(256) // 4
    return words, triton.next_power_of_2(words)


def _check(p, what: str) -> None:
    """On the host table's offsets (no device sync: the twins run inside a graph capture)."""
    t = p.table
    for offs in (t.gate_offsets, t.up_offsets, t.down_offsets):
        if any(int(o) % 4 for o in offs):
            raise ValueError(f"could not run the {what} twin: expert offsets must be multiples of 4 bytes")
    if p.ids is not None:
        raise ValueError(f"could not run the {what} twin: a selection (ids) is not supported")


def gate_up(p, xq: act_quant.QuantX, out: torch.Tensor, cfg: GemvConfig, vec: bool = False, persist: int = 0,
            prefetch: bool = False) -> None:
    """The gate/up launch's twin: out int32 [n, F]; xq: x quantized (its words). A gate/up in the pairx
    bytes (q4_k_tiled.TILED at the pairx loads): the pair tile's twin, out float32 [n, F], cfg's unroll.
    GGUF rows only (session 18): vec, the weights as 128-bit loads; persist > 0, that many programs looping
    over the tiles (_twin_gate_up_kernel); prefetch (with persist), the next step's words loaded before this step's
    arithmetic (session 19)."""
    _check(p, "gate/up")
    D, F, n = p.table.dim, p.table.width, p.count
    if p.gate_up.qtype == q4_k_tiled.TILED:
        if p.gate_up.idot is not q4_k_tiled.FAMILIES["pairx"].idot or not p.gate_up_vec:
            raise ValueError("could not run the gate/up twin: a tiled gate/up needs the pairx bytes on 16 bytes")
        _twin_gate_up_pair_kernel[(F // 4, n)](
            p.table.gate, p.table.up, p.gate_off, p.up_off, xq.words, xq.scales, xq.sums, out, F, D // 256,
            UNROLL=cfg.unroll, EMU=emulate(cfg, out), num_warps=1)
        return
    gw, gwp = _group_words(p.gate_up)
    tiles = triton.cdiv(F, cfg.block_n) * n
    if vec and (p.gate_up_row_bytes % 16 or any(int(o) % 16 for o in (*p.table.gate_offsets, *p.table.up_offsets))):
        raise ValueError("could not run the gate/up twin's 128-bit loads: its rows and expert offsets must be "
                         "multiples of 16 bytes (GGUF Q8_0 rows are 34-byte blocks): run it without vec")
    _twin_gate_up_kernel[(min(persist, tiles),) if persist else (triton.cdiv(F, cfg.block_n), n)](
        p.table.gate, p.table.up, p.gate_off, p.up_off, xq.words, out, F, triton.cdiv(D, 256),
        p.gate_up_row_bytes // 4, tiles, GW=gw, GWP=gwp, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll,
        UP=triton.next_power_of_2(cfg.unroll), VEC=vec, PERSIST=min(persist, tiles), PREFETCH=prefetch and persist > 0,
        num_warps=cfg.num_warps)


def down(p, hq: act_quant.QuantX, out: torch.Tensor, cfg: GemvConfig, y: torch.Tensor | None = None) -> None:
    """The down launch's twin: out int32 [split, D] (float32 for a tiled down); hq: h quantized ([n, F] words). y (float32 [D], split
    > 1; session 8, moe17): with the down's fold too (matmul.fold_part: out float32 [split, D] the partials,
    y their ordered sum), to tell the fold's share of the down's time from the step's."""
    _check(p, "down")
    D, F, n = p.table.dim, p.table.width, p.count
    split = max(1, min(cfg.split, n))
    fold = y is not None and split > 1
    grid = (triton.cdiv(D, cfg.block_n), split)
    if p.down.qtype == q4_k_tiled.TILED:  # the pair tile's twin (out float32 [split, D])
        if p.down.idot is not q4_k_tiled.FAMILIES["pairx"].idot or not p.down_vec or cfg.block_n != 4:
            raise ValueError("could not run the down twin: a tiled down needs the pairx bytes on 16 bytes, 4-row tiles")
        _twin_down_pair_kernel[grid](
            p.table.down, p.down_off, hq.words, hq.scales, hq.sums, out, out if y is None else y,
            tickets(grid[0], out.device) if fold else out, D, F, n, UNROLL=cfg.unroll, SPLIT=split, FOLD=fold,
            EMU=emulate(cfg, out), num_warps=1)
        return
    gw, gwp = _group_words(p.down)
    _twin_down_kernel[grid](
        p.table.down, p.down_off, hq.words, out, out if y is None else y,
        tickets(grid[0], out.device) if fold else out, D, F, n, triton.cdiv(F, 256), p.down_row_bytes // 4, GW=gw,
        GWP=gwp, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, UP=triton.next_power_of_2(cfg.unroll), SPLIT=split,
        FOLD=fold, num_warps=cfg.num_warps)
