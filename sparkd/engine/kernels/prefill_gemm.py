"""The prefill GEMMs straight from GGUF blocks: gemm (a few tokens times one weight) and grouped_gemm (many experts'
GEMMs over their tokens in one launch, moe_prefill's); the decode's GEMV is matmul.py, whose argument checks
(checked) and dequant aux (aux_arg) these share.

Float (precision "ieee", "tf32x3", "tf32": tl.dot's input precision): each program dequantizes a [BLOCK_N rows,
256 values] group of W in registers (the family's `dequant`) and multiplies it with BLOCK_T tokens of x; no
dequantized copy of a weight exists in memory. Integer ("int8", the default where the family has an `iblock`:
int_gemm): x quantized to the family's int8 blocks (act_quant), each 32-value block of W as int8 (iblock, or its
word loaders kblock / wblock), int8 tl.dot per block with exact int32 sums, the family's scales applied in float
(family.py's iblock contract); the launch per layout in IGEMM_TILES (measured on the H200, sessions 11-13).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import INT8, PRECISIONS, act_quant, dispatch, grids, table16
from sparkd.engine.kernels.matmul import aux_arg, checked

GEMM_BLOCK_N, GEMM_BLOCK_T, GEMM_WARPS = 32, 16, 4
# the grouped GEMM's expert tile heights (rows of one expert a program): its caller's expert_tiles
# cuts them; an integer tile's sums do not depend on its height, a float one's may (the float GEMM
# keeps GEMM_BLOCK_T)
GROUPED_BLOCK_TS = (16, 32, 64)


@triton.jit
def _gemm_tile(w_ptr, aux_ptr, x_ptr, x_rows, tmask, rows, rmask, K, n_groups, row_bytes, DEQ: tl.constexpr,
               NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
               PRECISION: tl.constexpr):
    """x's rows at element offsets x_rows [BLOCK_T] times W's `rows`, over n_groups groups of K:
    float32 [BLOCK_T, BLOCK_N]. W's tile is dequantized in registers one group at a time."""
    row_off = (rows.to(tl.int64) * row_bytes)[:, None, None]
    s = tl.arange(0, NSUB)[None, :, None]
    kk = tl.arange(0, NSUB * SUBLEN)[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    for g in range(0, n_groups):
        kmask = g * (NSUB * SUBLEN) + s * SUBLEN < K
        w = DEQ(w_ptr, aux_ptr, row_off, g, rmask[:, None, None] & kmask)
        w = tl.reshape(w, (BLOCK_N, NSUB * SUBLEN))
        cols = g * (NSUB * SUBLEN) + kk
        x = tl.load(x_ptr + x_rows[:, None] + cols, mask=tmask[:, None] & (cols < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gemm_kernel(w_ptr, aux_ptr, x_ptr, y_ptr, N, K, T, row_bytes, stride_xt, stride_yt,
                 DEQ: tl.constexpr, NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_T: tl.constexpr, PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    toks = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask, tmask = rows < N, toks < T
    acc = _gemm_tile(w_ptr, aux_ptr, x_ptr, toks.to(tl.int64) * stride_xt, tmask, rows, rmask, K,
                     tl.cdiv(K, NSUB * SUBLEN), row_bytes, DEQ, NSUB, SUBLEN, BLOCK_N, BLOCK_T, PRECISION)
    y = y_ptr + toks[:, None].to(tl.int64) * stride_yt + rows[None, :]
    tl.store(y, acc, mask=tmask[:, None] & rmask[None, :])


@triton.jit
def _expert_tile(w_off_ptr, tiles_ptr, src_ptr, N, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """A grouped GEMM program's work: W's row tile program_id(0), tile program_id(1) of expert_tiles
    (expert e, y's rows r in [first, end), x's rows src[r]) -> (rows, rmask, r, tmask, src, e's weight
    offset, whether the tile has rows)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = tiles_ptr + tl.program_id(1) * 3
    e, first, end = tl.load(tile), tl.load(tile + 1), tl.load(tile + 2)
    r = first + tl.arange(0, BLOCK_T)
    tmask = r < end
    src = tl.load(src_ptr + r, mask=tmask, other=0).to(tl.int64)
    return rows, rows < N, r, tmask, src, tl.load(w_off_ptr + e), first < end


@triton.jit
def _grouped_gemm_kernel(w_ptr, w_off_ptr, aux_ptr, tiles_ptr, src_ptr, x_ptr, y_ptr, N, K, row_bytes,
                         stride_xt, stride_yt, DEQ: tl.constexpr, NSUB: tl.constexpr, SUBLEN: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, PRECISION: tl.constexpr):
    """Program (i, j): tile j = (expert e, rows [first, end) of y) of expert_tiles, y's rows
    x[src[r]] @ W_e.T for W_e's row tile i; an empty tile (first == end) runs no group."""
    rows, rmask, r, tmask, src, w_off, live = _expert_tile(w_off_ptr, tiles_ptr, src_ptr, N, BLOCK_N, BLOCK_T)
    n_groups = tl.where(live, tl.cdiv(K, NSUB * SUBLEN), 0)
    acc = _gemm_tile(w_ptr + w_off, aux_ptr, x_ptr, src * stride_xt, tmask, rows, rmask, K,
                     n_groups, row_bytes, DEQ, NSUB, SUBLEN, BLOCK_N, BLOCK_T, PRECISION)
    y = y_ptr + r[:, None].to(tl.int64) * stride_yt + rows[None, :]
    tl.store(y, acc, mask=tmask[:, None] & rmask[None, :])


@triton.jit
def _igemm_tile(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, x_rows, tmask, rows, rmask, n_blocks, row_bytes,
                IBLOCK: tl.constexpr, IGROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_T: tl.constexpr):
    """_gemm_tile on int8 blocks: x's rows x_rows [BLOCK_T] (row indices of its QuantX: quants at
    xq_ptr, int8 [., n_blocks * 32], scales at xd_ptr, per-32 sums at xs_ptr) times W's `rows`: per
    32-value block an int8 tl.dot with int32 sums (exact), then the family's scales (family.iblock's
    contract): without IGROUP acc += isum * (d_x * d) per block; with it, per 256-value group,
    acc += d_x * (d * sum sc * isum - dmin * sum mn * xsum) (the sums in int32, exact); with HALF (Q6_K)
    acc += sum sc * isum * (d_x * d), a scale per 16 values. Blocks in order."""
    row_off = rows.to(tl.int64) * row_bytes
    i = tl.arange(0, 32)[None, :]
    xq = xq_ptr.to(tl.pointer_type(tl.int8)) + x_rows[:, None] * (n_blocks * 32) + i  # [BLOCK_T, 32], QuantX's words bytewise
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    if IGROUP is None:  # Q8_0 blocks: a float scale each, x's too
        xd = xd_ptr + x_rows * n_blocks
        for b in range(0, n_blocks):
            q, d = IBLOCK(w_ptr, aux_ptr, row_off, rmask, b, row_bytes)
            x = tl.load(xq + b * 32, mask=tmask[:, None], other=0)
            dx = tl.load(xd + b, mask=tmask, other=0.0)
            isum = tl.dot(x, tl.trans(q), out_dtype=tl.int32)
            acc += isum.to(tl.float32) * (dx[:, None] * d[None, :])
    else:  # Q8_K x: one scale per 8 blocks; W's blocks an integer scale and min each, d and dmin per group
        xd = xd_ptr + x_rows * (n_blocks // 8)
        xs = xs_ptr + x_rows * n_blocks
        for g in range(0, n_blocks // 8):
            d, dmin = IGROUP(w_ptr, row_off, rmask, g, row_bytes)
            dx = tl.load(xd + g, mask=tmask, other=0.0)
            qsum = tl.zeros((BLOCK_T, BLOCK_N), tl.int32)
            for s in range(0, 8):
                q, sc, mn = IBLOCK(w_ptr, aux_ptr, row_off, rmask, g * 8 + s, row_bytes)
                x = tl.load(xq + (g * 8 + s) * 32, mask=tmask[:, None], other=0)
                if HALF:  # sc, mn: the scales of values 0-15 and 16-31; a dot each (x's other half zeroed)
                    lo = tl.dot(tl.where(i < 16, x, 0), tl.trans(q), out_dtype=tl.int32)
                    hi = tl.dot(tl.where(i < 16, 0, x), tl.trans(q), out_dtype=tl.int32)
                    qsum += lo * sc[None, :] + hi * mn[None, :]
                else:
                    qsum += tl.dot(x, tl.trans(q), out_dtype=tl.int32) * sc[None, :]
            if HALF:
                acc += qsum.to(tl.float32) * (dx[:, None] * d[None, :])
            else:  # the mins after the dots (tried against register pressure: offline sm_90 the same 255 as one loop)
                dq = d[None, :] * qsum.to(tl.float32)
                msum = tl.zeros((BLOCK_T, BLOCK_N), tl.int32)
                for s in range(0, 8):
                    mn = IBLOCK(w_ptr, aux_ptr, row_off, rmask, g * 8 + s, row_bytes)[2]
                    msum += tl.load(xs + g * 8 + s, mask=tmask, other=0)[:, None] * mn[None, :]
                acc += dx[:, None] * (dq - dmin[None, :] * msum.to(tl.float32))
    return acc


@triton.jit
def _igemm_steps(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, x_rows, tmask, rows, rmask, n_blocks, row_bytes,
                 IBLOCK: tl.constexpr, IGROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_T: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr, FBLOCK: tl.constexpr):
    """_igemm_tile's sums and float steps in its order, the loops laid out for the pipeliner (session 11):
    Q8_0 UNROLL blocks a loop step (n_blocks a multiple of it), the K-quants a group a step, its 8 blocks
    unrolled with each block's min term taken from the same iblock (no second pass); tl.range's
    num_stages=STAGES over the steps, so the next steps' loads are issued under this one's dots. FBLOCK (Q8_0's form
    with power-of-two block scales, MXFP4: family.fblock) takes W's block as bfloat16 values with the scale folded in
    and x's quants as bfloat16 (both exact): a bf16 tl.dot gives isum * d exactly (products and sums of integers
    times one power of two, below 2^24 of it), so acc += (isum * d) * d_x rounds as acc += isum * (d_x * d) does: the
    same bits, one float step per output and block instead of three (session 43)."""
    row_off = rows.to(tl.int64) * row_bytes
    i = tl.arange(0, 32)[None, :]
    xq = xq_ptr.to(tl.pointer_type(tl.int8)) + x_rows[:, None] * (n_blocks * 32) + i
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    if IGROUP is None:
        xd = xd_ptr + x_rows * n_blocks
        for b0 in tl.range(0, n_blocks, UNROLL, num_stages=STAGES):
            for u in tl.static_range(UNROLL):
                x = tl.load(xq + (b0 + u) * 32, mask=tmask[:, None], other=0)
                dx = tl.load(xd + b0 + u, mask=tmask, other=0.0)
                if FBLOCK is not None:
                    w = FBLOCK(w_ptr, row_off, rmask, b0 + u, row_bytes)
                    if table16.LOOKUP_EMU:  # the interpreter's bf16 tl.dot sums wrong (triton 3.9): float32 there
                        wd = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
                    else:
                        wd = tl.dot(x.to(tl.bfloat16), tl.trans(w))
                    acc += wd * dx[:, None]
                else:
                    q, d = IBLOCK(w_ptr, aux_ptr, row_off, rmask, b0 + u, row_bytes)
                    isum = tl.dot(x, tl.trans(q), out_dtype=tl.int32)
                    acc += isum.to(tl.float32) * (dx[:, None] * d[None, :])
    else:
        xd = xd_ptr + x_rows * (n_blocks // 8)
        xs = xs_ptr + x_rows * n_blocks
        for g in tl.range(0, n_blocks // 8, num_stages=STAGES):
            d, dmin = IGROUP(w_ptr, row_off, rmask, g, row_bytes)
            dx = tl.load(xd + g, mask=tmask, other=0.0)
            qsum = tl.zeros((BLOCK_T, BLOCK_N), tl.int32)
            msum = tl.zeros((BLOCK_T, BLOCK_N), tl.int32)
            for s in tl.static_range(8):
                q, sc, mn = IBLOCK(w_ptr, aux_ptr, row_off, rmask, g * 8 + s, row_bytes)
                x = tl.load(xq + (g * 8 + s) * 32, mask=tmask[:, None], other=0)
                if HALF:
                    lo = tl.dot(tl.where(i < 16, x, 0), tl.trans(q), out_dtype=tl.int32)
                    hi = tl.dot(tl.where(i < 16, 0, x), tl.trans(q), out_dtype=tl.int32)
                    qsum += lo * sc[None, :] + hi * mn[None, :]
                else:
                    qsum += tl.dot(x, tl.trans(q), out_dtype=tl.int32) * sc[None, :]
                    msum += tl.load(xs + g * 8 + s, mask=tmask, other=0)[:, None] * mn[None, :]
            if HALF:
                acc += qsum.to(tl.float32) * (dx[:, None] * d[None, :])
            else:
                dq = d[None, :] * qsum.to(tl.float32)
                acc += dx[:, None] * (dq - dmin[None, :] * msum.to(tl.float32))
    return acc


@triton.jit
def _igemm_any(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, x_rows, tmask, rows, rmask, n_blocks, row_bytes,
               IBLOCK: tl.constexpr, IGROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_T: tl.constexpr, STEPS: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr,
               FBLOCK: tl.constexpr):
    """_igemm_steps (STEPS, session 11) or session 10's _igemm_tile: the same bits."""
    if STEPS:
        acc = _igemm_steps(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, x_rows, tmask, rows, rmask, n_blocks, row_bytes,
                           IBLOCK, IGROUP, HALF, BLOCK_N, BLOCK_T, UNROLL, STAGES, FBLOCK)
    else:
        acc = _igemm_tile(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, x_rows, tmask, rows, rmask, n_blocks, row_bytes,
                          IBLOCK, IGROUP, HALF, BLOCK_N, BLOCK_T)
    return acc


@triton.jit
def _igemm_kernel(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, y_ptr, N, T, n_blocks, row_bytes, stride_yt,
                  IBLOCK: tl.constexpr, IGROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_T: tl.constexpr, STEPS: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr,
                  FBLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    toks = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask, tmask = rows < N, toks < T
    acc = _igemm_any(w_ptr, aux_ptr, xq_ptr, xd_ptr, xs_ptr, toks.to(tl.int64), tmask, rows, rmask, n_blocks,
                     row_bytes, IBLOCK, IGROUP, HALF, BLOCK_N, BLOCK_T, STEPS, UNROLL, STAGES, FBLOCK)
    y = y_ptr + toks[:, None].to(tl.int64) * stride_yt + rows[None, :]
    tl.store(y, acc, mask=tmask[:, None] & rmask[None, :])


@triton.jit
def _grouped_igemm_kernel(w_ptr, w_off_ptr, aux_ptr, tiles_ptr, src_ptr, xq_ptr, xd_ptr, xs_ptr, y_ptr, N, n_blocks,
                          row_bytes, stride_yt, IBLOCK: tl.constexpr, IGROUP: tl.constexpr, HALF: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, STEPS: tl.constexpr, UNROLL: tl.constexpr,
                          STAGES: tl.constexpr, FBLOCK: tl.constexpr):
    """_grouped_gemm_kernel's integer variant: x's rows src[r] of its QuantX."""
    rows, rmask, r, tmask, src, w_off, live = _expert_tile(w_off_ptr, tiles_ptr, src_ptr, N, BLOCK_N, BLOCK_T)
    acc = _igemm_any(w_ptr + w_off, aux_ptr, xq_ptr, xd_ptr, xs_ptr, src, tmask, rows, rmask,
                     tl.where(live, n_blocks, 0), row_bytes, IBLOCK, IGROUP, HALF, BLOCK_N, BLOCK_T, STEPS, UNROLL,
                     STAGES, FBLOCK)
    y = y_ptr + r[:, None].to(tl.int64) * stride_yt + rows[None, :]
    tl.store(y, acc, mask=tmask[:, None] & rmask[None, :])


@dataclass(frozen=True)
class IgemmTile:
    """The integer GEMM's launch (precision "int8"): a weight block is loaded once per block_t tokens."""

    block_n: int = 64  # W's rows per program
    block_t: int = 64  # tokens per program of the dense GEMM (the grouped one: its caller's expert tile, expert_rows)
    num_warps: int = 4
    unroll: int = 1  # Q8_0 blocks per loop step (the largest power of 2 up to it that divides the row's blocks)
    stages: int = 0  # the step loop's num_stages (tl.range); 0: Triton's default
    steps: bool = True  # _igemm_steps (session 11); False: session 10's _igemm_tile (S10_IGEMM)
    kblock: bool = True  # with steps: the family's kblock where it has one
    words: bool = False  # with kblock: the family's wblock (32-bit word unpack, session 12) where it has one
    maxnreg: int = 0  # registers a thread at most (Triton's maxnreg: more programs an SM, some spills); 0: Triton's
    fold: bool = False  # with steps: the family's fblock where it has one (bf16 values, scales folded in)
    expert_rows: int = 32  # grouped: the expert tile height moe_prefill.tile_rows cuts for the layout (session 10: 32)


IGEMM_ENV = "SPARKD_IGEMM"
IGEMM_WAYS = ("s13", "s12", "s11")
# "s12" / "s11": session 12's / 11's tables (IGEMM_TILES_S12, IGEMM_TILES_S11: pairx's kblock); the same bits every
# way. (Session 10's "s10", its tile everywhere, went in session 15: last measured in session 11.)
IGEMM_WAY = switches.choice(IGEMM_ENV, IGEMM_WAYS, "s13")
S10_IGEMM = IgemmTile(64, 64, 4, 1, 0, False, False)  # session 10's loop and tile: the layouts without a row below
# by (the layout's qtype name, grouped): the H200's fastest of bench/igemm_bench.py (session 11, prefill25: dense
# 2048x2048, the MoE gate/up 768x2048 and down 2048x768 of 128 experts, top 8, 512 and 2048 tokens; the speedups
# over s10 in docs/performance.md). Q8_0: 2 blocks a step, 4 stages (grouped) and 64-token dense tiles; the
# K-quants 2 stages (3 spill); GGUF Q4_K's grouped GEMM and pairx's dense one faster with iblock's byte loads
# than with kblock's words; Q6_K (no kblock) 3 stages. Packed Q8_0 and the tiled Q6_K (no gain clear of the noise
# in call 2) keep s10's.
IGEMM_TILES = {("Q8_0", False): IgemmTile(64, 64, 4, 4, 2), ("Q8_0", True): IgemmTile(64, 32, 4, 2, 4),
               ("Q4_K", False): IgemmTile(64, 64, 4, 1, 2), ("Q4_K", True): IgemmTile(64, 32, 4, 1, 2, kblock=False),
               ("Q4_K_TILED", False): IgemmTile(64, 32, 4, 1, 2, kblock=False),
               ("Q4_K_TILED", True): IgemmTile(64, 32, 4, 1, 2),
               ("Q6_K", False): IgemmTile(64, 32, 4, 1, 3), ("Q6_K", True): IgemmTile(64, 32, 4, 1, 3)}
IGEMM_TILES_S11 = dict(IGEMM_TILES)
# session 12 (prefill26, H200, bench/results/prefill26_h200_s12*): pairx's grouped GEMM unpacks its nibbles with
# 32-bit word ops (q4_k_pair.wblock; 1.49-1.55x over kblock alone) at most 168 registers a thread (3 programs an
# SM; 1.56-1.87x, 128 registers 1.48-1.61x; kblock capped at 128 0.98-1.05x); 64-row tiles on 8 warps lost to it
IGEMM_TILES[("Q4_K_TILED", True)] = IgemmTile(64, 32, 4, 1, 2, words=True, maxnreg=168)
# q4k21 (bench/results/q4k21_h200_s12*): pairx's dense GEMM (the attention projections) keeps iblock's byte loads
# (wblock 0.87-0.98x, kblock 0.55-0.66x at the 5120x2048 and 2048x4096 projections, 512 and 2048 tokens) at most 168
# registers a thread (0.99-1.08x; 128 registers 0.93-0.97x)
IGEMM_TILES[("Q4_K_TILED", False)] = IgemmTile(64, 32, 4, 1, 2, kblock=False, maxnreg=168)
IGEMM_TILES_S12 = dict(IGEMM_TILES)
# session 13 (prefill28, H200, bench/results/prefill28_h200_s13*): GGUF Q4_K's grouped GEMM (a Q4_K model's MoE down
# below width quant_experts.AUTO_DOWN_MIN_DIM, 2048 since down13; 4096 before) at most 168 registers a thread: 1.14x / 1.10x at 2048x768, 512 /
# 2048 tokens (3 stages 0.80x, 32-row programs on 2 warps 0.97x / 0.89x, 8 warps at 128 registers 1.10x / 1.06x); the
# 12-layer Q4_K prompt 1.01-1.05x (with pairx's gate/up on 2 warps, a tie alone and left out). pairx's grouped launch
# stays: 3 stages 0.91x, 8 warps 0.83x, 128 rows 0.70x, 64-row tiles (wgmma) 0.80x / 0.96x at 768x2048
IGEMM_TILES[("Q4_K", True)] = IgemmTile(64, 32, 4, 1, 2, kblock=False, maxnreg=168)
# session 22 (igemm50; no GPU that session, NOT timed): IQ4_XS's dense GEMM on session 10's loop with 32-token programs,
# the shape its grouped GEMM runs (moe_prefill.PREFILL_TILE): with S10's 64 it spills offline for sm_90 (triton 3.9: 255
# registers and a 96-byte stack; 32: 191 registers, no stack; tests/engine/igemm_compile.py). Q4_0's GEMMs and
# IQ4_XS's grouped one run S10_IGEMM (no stack)
IGEMM_TILES[("IQ4_XS", False)] = dataclasses.replace(S10_IGEMM, block_t=32)
# session 23 (H200, docs/runs/2026-12-02-s23/): the integer GEMM 4.4-45x the float one at "ieee" (IQ4_XS 30-45x
# dense), 1.3-2.9x "tf32"; Q4_0 on the steps loop with 2 stages and iblock's loads: dense 2048x2048 1.11x / 1.20x over
# S10 at 512 / 2048 tokens, grouped 768x2048 1.06x / 1.10x, 2048x768 1.19x / 0.99x; IQ4_XS loses on it (0.67-0.88x)
IGEMM_TILES[("Q4_0", False)] = IGEMM_TILES[("Q4_0", True)] = IgemmTile(64, 32, 4, 1, 2, kblock=False)
# session 26 (not timed): Q4_0's tiled layout (q4_0_tiled: iblock's byte loads at other addresses) takes Q4_0's
IGEMM_TILES.update({("Q4_0_TILED", grouped): IGEMM_TILES[("Q4_0", grouped)] for grouped in (False, True)})
# session 23 (iqgemm; no GPU, NOT timed): the grid i-quants' dense GEMMs take IQ4_XS's, for the same reason: offline
# for sm_90 (triton 3.9) S10's 64 tokens spill (255 registers, 224-400 bytes of stack), 32 do not (IQ2_XXS 195,
# IQ3_XXS 194, IQ2_XS 221, IQ1_S 254 registers); their grouped GEMMs run S10_IGEMM (201-244 registers, no stack).
# The steps loop spills at 64x32 on 4 warps (24-184 bytes), not on 8 (IQ2_XXS 178, IQ1_S 190 registers)
# IQ1_M (session 24, not timed) the same: S10's 64 tokens spill (255 registers, 376 bytes of stack)
IGEMM_TILES.update({(name, False): IGEMM_TILES[("IQ4_XS", False)]
                    for name in ("IQ2_XXS", "IQ3_XXS", "IQ2_XS", "IQ1_S", "IQ1_M", "IQ2_S", "IQ3_S")})
# session 42 (H100, docs/runs/2026-12-05-s42/call2, bench/igemm_bench.py at gpt-oss-20b's 32 experts of 2880x2880, top
# 4): MXFP4's resident tiled experts on 64-row expert tiles, 128 rows a program on 4 warps (wgmma; 244 registers, no
# stack offline): 8.72 ms at 8000 tokens against S10's 13.23 on 32-row tiles (1.52x), 2.46 against 3.63 at 2000
# (1.48x); S10 on 64-row tiles 11.46 / 3.21, 8 warps 0.72-0.96x of it, 3 stages 0.95x of Triton's default. Session 43
# (H100, docs/runs/2026-12-06-s43/call1, the same shape): its blocks folded into bf16 (mxfp4_tiled.fblock) 1.04x /
# 1.05x at 2000 / 8000 tokens (2344 / 8088 us against 2437 / 8456), the same bits; unroll 2, 2 stages, 168 registers,
# 256 rows on 8 warps 0.87-0.96x; the fold on iblock's int8 tile 0.77-0.90x
IGEMM_TILES[("MXFP4_TILED", True)] = IgemmTile(128, 64, 4, 1, 0, kblock=False, expert_rows=64, fold=True)


def igemm_tile(fam: dispatch.Family, grouped: bool) -> IgemmTile:
    """The integer GEMM's launch for a family's layout: IGEMM_TILES' (else session 10's; s12 / s11: that
    session's table)."""
    table = {"s12": IGEMM_TILES_S12, "s11": IGEMM_TILES_S11}.get(IGEMM_WAY, IGEMM_TILES)
    return table.get((fam.qtype.name, grouped), S10_IGEMM)


def _igemm_args(fam: dispatch.Family, tile: IgemmTile, n_blocks: int) -> dict:
    """The integer GEMM kernels' compile-time arguments for a family at a tile, the row's blocks n_blocks."""
    unroll = tile.unroll
    while n_blocks % unroll:
        unroll //= 2
    kb = tile.steps and tile.kblock and fam.kblock is not None
    block = (fam.wblock if tile.words and fam.wblock is not None else fam.kblock) if kb else fam.iblock
    return dict(IBLOCK=block, IGROUP=fam.igroup, HALF=fam.ihalf, BLOCK_N=tile.block_n,
                STEPS=tile.steps, UNROLL=unroll, STAGES=tile.stages or None,
                FBLOCK=fam.fblock if tile.steps and tile.fold else None, num_warps=tile.num_warps,
                **({"maxnreg": tile.maxnreg} if tile.maxnreg else {}))


# INT8 (PRECISIONS, kernels/__init__.py): the integer GEMM, for families with an iblock (Q8_0 and its packed
# layout, Q4_K and its pairx layout, Q6_K and its tiled layout, since session 22 Q4_0 and IQ4_XS and since session 23
# the grid i-quants IQ2_XXS, IQ3_XXS, IQ2_XS and IQ1_S, where their SPARKD_<type>_INT keeps the integer family);
# others (Q4_K's other tiled layouts included) run "ieee"


def float_precision(precision: str, fam: dispatch.Family) -> str:
    """The float GEMM's input precision: "int8" (a family without an integer GEMM) runs "ieee", or "tf32" where the
    family's values are tf32 values (F16, BF16: Family.tf32_exact; exact products over x rounded to their type)."""
    if precision != INT8:
        return precision
    return "tf32" if fam.tf32_exact else "ieee"


def int_gemm(fam: dispatch.Family, precision: str) -> bool:
    """Whether the GEMM of a family at `precision` is the integer one (x quantized to fam.act_fmt)."""
    return precision == INT8 and fam.iblock is not None


def _gemm_qx(fam: dispatch.Family, x: torch.Tensor, qx: act_quant.QuantX | None, what: str) -> act_quant.QuantX:
    """x's QuantX for the integer GEMM: qx (checked: x's rows in the family's format) or x quantized now."""
    if qx is None:
        return act_quant.quantize(x, fam.act_fmt)
    rows, cols = x.shape
    if qx.words.shape != (rows, cols // 4) or qx.scales.shape != (rows, cols // act_quant.BLOCKS[fam.act_fmt]):
        raise dispatch.KernelArgumentError(
            f"could not run {what} on a pre-quantized x: need {rows} rows of {cols} values in {fam.act_fmt}'s "
            f"blocks, got words {list(qx.words.shape)} and scales {list(qx.scales.shape)}")
    return qx


def check_precision(precision: str, what: str) -> None:
    if precision not in PRECISIONS:
        raise dispatch.KernelArgumentError(f"could not run {what}: precision {precision!r} is not one of "
                                           f"{', '.join(PRECISIONS)}")


def gemm(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor,
         precision: str = "tf32", out: torch.Tensor | None = None,
         qx: act_quant.QuantX | None = None) -> torch.Tensor:
    """y = x @ W.T for a few tokens. weight: raw GGUF bytes of W [rows, cols]; x float32 [T, cols].

    precision (PRECISIONS) is tl.dot's input_precision: "tf32" (fast, ~1e-3 relative), "tf32x3"
    (three tf32 products on the tensor cores, near float32) or "ieee" (float32 FMAs); or "int8"
    (int_gemm's families; others run float_precision's: "ieee", F16 and BF16 "tf32" over x rounded to their type by
    the caller, exact products): x quantized to the family's int8 blocks (or qx,
    x so quantized already), int8 tl.dot per block, the decode's integer sums (igemv's, but the
    scaled blocks added in another order)."""
    what = f"the {qtype.name} GEMM"
    check_precision(precision, what)
    fam, rows, cols, row_bytes = checked(weight, qtype, shape, x, 2, what)
    n_tok = x.shape[0]
    dispatch.check_out(out, (n_tok, rows), x.device, what)
    y = torch.empty(n_tok, rows, dtype=torch.float32, device=x.device) if out is None else out
    if n_tok == 0:
        return y
    if int_gemm(fam, precision):
        q = _gemm_qx(fam, x, qx, what)
        tile = igemm_tile(fam, False)
        grid = (triton.cdiv(rows, tile.block_n), triton.cdiv(n_tok, tile.block_t))
        _igemm_kernel[grid](weight, grids.grid_words(fam.grid, x.device), q.words, q.scales, q.sums, y, rows, n_tok,
                            cols // 32, row_bytes, y.stride(0), BLOCK_T=tile.block_t,
                            **_igemm_args(fam, tile, cols // 32))
        return y
    grid = (triton.cdiv(rows, GEMM_BLOCK_N), triton.cdiv(n_tok, GEMM_BLOCK_T))
    _gemm_kernel[grid](weight, aux_arg(fam, cols, x.device), x, y, rows, cols, n_tok, row_bytes,
                       x.stride(0), y.stride(0), DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
                       BLOCK_N=GEMM_BLOCK_N, BLOCK_T=GEMM_BLOCK_T, PRECISION=float_precision(precision, fam),
                       num_warps=GEMM_WARPS)
    return y


def grouped_gemm(weight: torch.Tensor, offsets: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor,
                 src: torch.Tensor, tiles: torch.Tensor, precision: str = "tf32",
                 qx: act_quant.QuantX | None = None, block_t: int = GEMM_BLOCK_T) -> torch.Tensor:
    """y[r] = x[src[r]] @ W_e.T for every row r of every tile (e, first, end) of `tiles` (int32
    [n, 3], moe_prefill.expert_tiles: e's rows [first, end), at most block_t (GROUPED_BLOCK_TS), none for
    first == end): many small GEMMs of one shape in one launch, no host sync. W_e: the [rows, cols]
    matrix of raw GGUF bytes at byte offsets[e] of `weight` (int64 on x's device, checked by the
    caller: moe.prepare); x float32 [T, cols]; src int [R] -> y float32 [R, rows]. precision, qx: gemm's."""
    what = f"the {qtype.name} grouped GEMM"
    check_precision(precision, what)
    if block_t not in GROUPED_BLOCK_TS:
        raise dispatch.KernelArgumentError(f"could not run {what}: tiles of {block_t} rows, not one of "
                                           f"{', '.join(map(str, GROUPED_BLOCK_TS))}")
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(weight, what, fam.align)
    dispatch.check_activations(x, cols, what)
    for name, t, dims, dtypes in (("offsets", offsets, 1, (torch.int64,)), ("src", src, 1, (torch.int32, torch.int64)),
                                  ("tiles", tiles, 2, (torch.int32,))):
        if t.dim() != dims or t.dtype not in dtypes or t.device != x.device or not t.is_contiguous() \
                or (name == "tiles" and t.shape[1] != 3):
            raise dispatch.KernelArgumentError(
                f"could not run {what}: {name} must be contiguous {'/'.join(str(d) for d in dtypes)} "
                f"{'[n, 3]' if name == 'tiles' else '[n]'} on {x.device}, got {t.dtype} {list(t.shape)} on {t.device}")
    if x.dim() != 2 or rows % fam.row_tile:
        raise dispatch.KernelArgumentError(f"could not run {what}: need x [T, {cols}] and rows a multiple of "
                                           f"{fam.row_tile}, got x {list(x.shape)} and {rows} rows")
    y = torch.empty(src.numel(), rows, dtype=torch.float32, device=x.device)
    if src.numel() == 0 or tiles.shape[0] == 0:
        return y
    if int_gemm(fam, precision):
        q = _gemm_qx(fam, x, qx, what)
        tile = igemm_tile(fam, True)
        grid = (triton.cdiv(rows, tile.block_n), tiles.shape[0])
        _grouped_igemm_kernel[grid](weight, offsets, grids.grid_words(fam.grid, x.device), tiles, src, q.words,
                                    q.scales, q.sums, y, rows, cols // 32, row_bytes, y.stride(0), BLOCK_T=block_t,
                                    **_igemm_args(fam, tile, cols // 32))
        return y
    grid = (triton.cdiv(rows, GEMM_BLOCK_N), tiles.shape[0])
    _grouped_gemm_kernel[grid](weight, offsets, aux_arg(fam, cols, x.device), tiles, src, x, y, rows, cols, row_bytes,
                               x.stride(0), y.stride(0), DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
                               BLOCK_N=GEMM_BLOCK_N, BLOCK_T=block_t, PRECISION=float_precision(precision, fam),
                               num_warps=GEMM_WARPS)
    return y

