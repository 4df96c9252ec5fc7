"""Load-only twins of the MoE decode launches (bench/moe_tiles_bench.py times them next to the real
ones): the same grid, the same weight bytes per program in the same loop steps (a step = UNROLL of
x's 256-value groups of BLOCK_N rows, gate and up together as the pair loop has them; the down a
range of experts one after another, SPLIT ranges), the offsets loaded the same way and x's (h's)
words of each group loaded beside the weights, but only trivial integer arithmetic on what was
loaded (a wrapping sum the store depends on) and no activation, h quantization or fold. A twin
as slow as its kernel: the launch's grid and bytes bound it (memory, latency, launch); a twin much
faster: the kernel's instructions do. The weights are read as 32-bit words along the row (the real
Q4_K step reads its headers as 128-bit vectors): a twin is a floor on the loads' structure, not a
copy of their instructions. The down's twin may fold its ranges as the down does (down's y; moe17)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, dispatch
from sparkd.engine.kernels.matmul import GemvConfig, fold_part, tickets


@triton.jit
def _group_sum(w_ptr, off_bytes, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc,
               GW: tl.constexpr, GWP: tl.constexpr, UNROLL: tl.constexpr, UP: tl.constexpr):
    """acc + the words of groups g0..g0+UNROLL-1 of the rows (+ x's words of those groups); UP:
    UNROLL's next power of two (the tile's extent)."""
    lane = tl.arange(0, GWP)[None, None, :]
    u = tl.arange(0, UP)[None, :, None]
    g = g0 + u
    m = rmask[:, None, None] & (lane < GW) & (g < n_groups) & (u < UNROLL)
    base = (w_ptr + off_bytes).to(tl.pointer_type(tl.int32)) + rows64[:, None, None] * row_words
    w = tl.load(base + g * GW + lane, mask=m, other=0)
    xv = tl.load(xw_ptr + g * 64 + (lane % 64), mask=m, other=0)
    return acc + (w ^ xv)


@triton.jit
def _twin_gate_up_kernel(gate_ptr, up_ptr, gate_off, up_off, xw_ptr, out_ptr, F, n_groups, row_words,
                         GW: tl.constexpr, GWP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                         UP: tl.constexpr):
    a = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < F
    rows64 = rows.to(tl.int64)
    go, uo = tl.load(gate_off + a), tl.load(up_off + a)
    acc = tl.zeros((BLOCK_N, UP, GWP), tl.int32)
    for g0 in range(0, n_groups, UNROLL):
        acc = _group_sum(gate_ptr, go, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
        acc = _group_sum(up_ptr, uo, rows64, rmask, row_words, xw_ptr, g0, n_groups, acc, GW, GWP, UNROLL, UP)
    tl.store(out_ptr + a * F + rows, tl.sum(tl.sum(acc, 2), 1), mask=rmask)


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


def gate_up(p, xq: act_quant.QuantX, out: torch.Tensor, cfg: GemvConfig) -> None:
    """The gate/up launch's twin: out int32 [n, F]; xq: x quantized (its words)."""
    _check(p, "gate/up")
    D, F, n = p.table.dim, p.table.width, p.count
    gw, gwp = _group_words(p.gate_up)
    _twin_gate_up_kernel[(triton.cdiv(F, cfg.block_n), n)](
        p.table.gate, p.table.up, p.gate_off, p.up_off, xq.words, out, F, triton.cdiv(D, 256),
        p.gate_up_row_bytes // 4, GW=gw, GWP=gwp, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, UP=triton.next_power_of_2(cfg.unroll),
        num_warps=cfg.num_warps)


def down(p, hq: act_quant.QuantX, out: torch.Tensor, cfg: GemvConfig, y: torch.Tensor | None = None) -> None:
    """The down launch's twin: out int32 [split, D]; hq: h quantized ([n, F] words). y (float32 [D], split
    > 1; session 8, moe17): with the down's fold too (matmul.fold_part: out float32 [split, D] the partials,
    y their ordered sum), to tell the fold's share of the down's time from the step's."""
    _check(p, "down")
    D, F, n = p.table.dim, p.table.width, p.count
    split = max(1, min(cfg.split, n))
    fold = y is not None and split > 1
    grid = (triton.cdiv(D, cfg.block_n), split)
    gw, gwp = _group_words(p.down)
    _twin_down_kernel[grid](
        p.table.down, p.down_off, hq.words, out, out if y is None else y,
        tickets(grid[0], out.device) if fold else out, D, F, n, triton.cdiv(F, 256), p.down_row_bytes // 4, GW=gw,
        GWP=gwp, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, UP=triton.next_power_of_2(cfg.unroll), SPLIT=split,
        FOLD=fold, num_warps=cfg.num_warps)
