"""Bench-only steps of the tiled Q4_K GEMV with compact loads (session 8, q4k17; negative: slower than the bytes
step, bench/results/q4k17_h200_s8.log). Both keep q4_k_tiled.idot_bytes' arithmetic on the bytes layout; what
differs is how x's words, per-32 sums and scales and the tile's headers arrive:

- idot_compact (an idot of matmul's contract, run by matmul._igemv_kernel): once per group and program, each in
  its own compact shape (x's 64 words 2 a thread, the 4 rows' headers [4, 4] words), broadcast to the words'
  tile afterwards (the compiler's layout conversion, through shared memory): 28 -> 20 loads a thread per 4
  groups, + 4 STS, 16 LDS, 4 BAR (bench/kernels_sass.py --types Q4TC). The same bits as bytes on the H200.
- _kernel / step: row_idot's loop stepping UNROLL groups at once, the loads once per step and program
  ([UNROLL, 64], [UNROLL, 8], [UNROLL] and [UNROLL, BN, 4] words: as bench/q4t_tma.py's ptr twin) and the
  words' tile [UNROLL, BN, 4, 2, 4], its groups added into the accumulator one after another as row_idot does
  (the interpreter: bytes' bits; the H200: other last bits, not explained).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, matmul, q4_k_tiled
from sparkd.engine.kernels.act_quant import dp4a
from sparkd.engine.kernels.row_tiles import row_sums


@triton.jit
def _x_halves(xw_ptr, g):
    """Group g's 64 x words as the tiles [1, 4, 2, 4] of sub-blocks 2j (lo) and 2j+1 (hi): word j * 16 + w
    and j * 16 + 8 + w (w = 4 h + v), from one compact load."""
    xv = tl.reshape(tl.load(xw_ptr + g * 64 + tl.arange(0, 64)), (4, 2, 8))  # [chunk j, lo|hi, w]
    lo, hi = tl.split(tl.permute(xv, (0, 2, 1)))
    return tl.reshape(lo, (1, 4, 2, 4)), tl.reshape(hi, (1, 4, 2, 4))


@triton.jit
def _head_words(hdr, rmask):
    """Header words 0-3 of each row (hdr: its 16 bytes; a tile's rows are one 64-byte run) as [BN, 1, 1, 1]
    each, from one compact [BN, 4] load."""
    head = tl.load(hdr[:, None].to(tl.pointer_type(tl.int32)) + tl.arange(0, 4)[None, :], mask=rmask[:, None],
                   other=0)
    h02, h13 = tl.split(tl.reshape(head, (hdr.shape[0], 2, 2)))  # words 0, 2 and 1, 3
    w0, w2 = tl.split(h02)
    w1, w3 = tl.split(h13)
    return w0[:, None, None, None], w1[:, None, None, None], w2[:, None, None, None], w3[:, None, None, None]


@triton.jit
def idot_compact(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr,
                 EMU: tl.constexpr):
    """idot_bytes with compact loads of x and the headers (the same values, arithmetic and order: the same bits);
    the rows tile (EW False) runs idot_bytes."""
    if EW:
        qs, hdr = q4_k_tiled._group(w_ptr, row_off, g, K)
        j = tl.arange(0, 4)[None, :, None, None]
        m = rmask[:, None, None, None]
        words = q4_k_tiled._qs_words(qs, m)
        zero = tl.zeros(words.shape, tl.int32)
        w0, w1, w2, w3 = _head_words(hdr, rmask)
        sc_lo, mn_lo, sc_hi, mn_hi = q4_k_tiled.chunk_scales(w1 + zero, w2 + zero, w3 + zero, j)
        xlo, xhi = _x_halves(xw_ptr, g)
        isum = sc_lo * dp4a(words & 0x0F0F0F0F, xlo + zero, EMU) \
            + sc_hi * dp4a((words >> 4) & 0x0F0F0F0F, xhi + zero, EMU)
        s_lo, s_hi = tl.split(tl.reshape(tl.load(xs_ptr + g * 8 + tl.arange(0, 8)), (4, 2)))
        msum = mn_lo * tl.reshape(s_lo, (1, 4, 1, 1)) + mn_hi * tl.reshape(s_hi, (1, 4, 1, 1))
        dx = tl.load(xd_ptr + g)
        hd = w0 + zero
        d = q4_k_tiled._f16(hd & 0xFFFF) * dx
        dmin = q4_k_tiled._f16(hd >> 16) * dx
        part = d * isum.to(tl.float32) - (dmin * 0.125) * msum.to(tl.float32)
        acc = acc + tl.reshape(part, acc.shape)
    else:
        acc = q4_k_tiled.idot_bytes(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU)
    return acc


@triton.jit
def _lanes(t):
    """A [..., 2] tensor's two halves along its last dimension (tl.split)."""
    a, b = tl.split(t)
    return a, b


@triton.jit
def _add_groups(acc, part, U: tl.constexpr):
    """acc + part[0] + part[1] + ... (part [U, BN, 4, 2, 4]), in group order, each reshaped to acc's tile."""
    if U == 1:
        acc = acc + tl.reshape(part, acc.shape)
    else:
        last = tl.permute(part, (1, 2, 3, 4, 0))  # [BN, 4, 2, 4, U]
        if U == 2:
            p0, p1 = _lanes(last)
            acc = acc + tl.reshape(p0, acc.shape)
            acc = acc + tl.reshape(p1, acc.shape)
        else:  # U == 4: u = 2 a + b
            even, odd = _lanes(tl.reshape(last, (part.shape[1], 4, 2, 4, 2, 2)))  # b = 0: u 0, 2; b = 1: u 1, 3
            p0, p2 = _lanes(even)
            p1, p3 = _lanes(odd)
            acc = acc + tl.reshape(p0, acc.shape)
            acc = acc + tl.reshape(p1, acc.shape)
            acc = acc + tl.reshape(p2, acc.shape)
            acc = acc + tl.reshape(p3, acc.shape)
    return acc


@triton.jit
def step(w_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, end, K, acc, EMU: tl.constexpr):
    """Groups g ([U] int32, consecutive; those >= end masked out) of the tile's rows added into acc
    [BN, 4, 8] in order: idot_bytes' values and arithmetic, the x / header loads compact."""
    U: tl.constexpr = g.shape[0]
    BN: tl.constexpr = rmask.shape[0]
    gc = tl.minimum(g, end - 1)  # past the end: read a valid group, masked out
    m2 = rmask[None, :] & (g < end)[:, None]  # [U, BN]
    qs, hdr = q4_k_tiled._group(w_ptr, row_off[None, :], gc[:, None], K)  # [U, BN] pointers
    j = tl.arange(0, 4)[None, None, :, None, None]
    w = 4 * tl.arange(0, 2)[None, None, None, :, None] + tl.arange(0, 4)[None, None, None, None, :]
    m = m2[:, :, None, None, None]
    words = tl.load(qs[:, :, None, None, None].to(tl.pointer_type(tl.int32)) + j * 8 + w, mask=m, other=0)
    zero = tl.zeros(words.shape, tl.int32)
    head = tl.load(hdr[:, :, None].to(tl.pointer_type(tl.int32)) + tl.arange(0, 4)[None, None, :],
                   mask=m2[:, :, None], other=0)  # [U, BN, 4]
    h02, h13 = _lanes(tl.reshape(head, (U, BN, 2, 2)))
    w0, w2 = _lanes(h02)
    w1, w3 = _lanes(h13)
    sc_lo, mn_lo, sc_hi, mn_hi = q4_k_tiled.chunk_scales(w1[:, :, None, None, None] + zero,
                                                        w2[:, :, None, None, None] + zero,
                                                        w3[:, :, None, None, None] + zero, j)
    xv = tl.load(xw_ptr + gc[:, None] * 64 + tl.arange(0, 64)[None, :])  # [U, 64]: [j, lo|hi, w]
    xlo, xhi = _lanes(tl.permute(tl.reshape(xv, (U, 4, 2, 8)), (0, 1, 3, 2)))  # [U, 4, 8] each
    isum = sc_lo * dp4a(words & 0x0F0F0F0F, tl.reshape(xlo, (U, 1, 4, 2, 4)) + zero, EMU) \
        + sc_hi * dp4a((words >> 4) & 0x0F0F0F0F, tl.reshape(xhi, (U, 1, 4, 2, 4)) + zero, EMU)
    s_lo, s_hi = _lanes(tl.reshape(tl.load(xs_ptr + gc[:, None] * 8 + tl.arange(0, 8)[None, :]), (U, 4, 2)))
    msum = mn_lo * tl.reshape(s_lo, (U, 1, 4, 1, 1)) + mn_hi * tl.reshape(s_hi, (U, 1, 4, 1, 1))
    dx = tl.load(xd_ptr + gc)[:, None, None, None, None]
    hd = w0[:, :, None, None, None] + zero
    d = q4_k_tiled._f16(hd & 0xFFFF) * dx
    dmin = q4_k_tiled._f16(hd >> 16) * dx
    part = d * isum.to(tl.float32) - (dmin * 0.125) * msum.to(tl.float32)
    return _add_groups(acc, part, U)


@triton.jit
def _kernel(w_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, part_ptr, tickets_ptr, N, K, row_bytes, BLOCK_N: tl.constexpr,
            UNROLL: tl.constexpr, SPLIT: tl.constexpr, EMU: tl.constexpr, ATOMIC: tl.constexpr,
            KFOLD: tl.constexpr, STAGES: tl.constexpr):
    """matmul._igemv_kernel with row_idot's group loop stepping UNROLL groups at once (step)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    n_groups = tl.cdiv(K, 256)
    per = tl.cdiv(n_groups, SPLIT)
    start = tl.program_id(1) * per
    end = tl.minimum(start + per, n_groups)
    acc = tl.zeros((BLOCK_N, 4, 8), tl.float32)
    for g0 in tl.range(start, end, UNROLL, num_stages=STAGES):
        acc = step(w_ptr, rows.to(tl.int64) * row_bytes, rmask, xw_ptr, xd_ptr, xs_ptr, g0 + tl.arange(0, UNROLL),
                   end, K, acc, EMU)
    acc = row_sums(acc, 4, 8, 4)  # row_idot's row sums (the same order: the same bits)
    matmul.finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT, ATOMIC, KFOLD)


def gemv(w, x: torch.Tensor, cfg: matmul.GemvConfig, qx: act_quant.QuantX | None = None, maxnreg: int = 0):
    """y = W @ x on a q4_k_tiled.Tiled of the bytes layout with the per-step kernel (_kernel); maxnreg: the
    compiler's register cap (0: none). Only the elementwise tile."""
    if w.layout != "bytes" or not cfg.elementwise:
        raise ValueError(f"could not run the compact-step GEMV: need the bytes layout and an elementwise tile, "
                         f"got layout {w.layout!r}, elementwise {cfg.elementwise}")
    data, rows, cols = w.data, w.rows, w.cols
    y = torch.empty(rows, dtype=torch.float32, device=x.device)
    split = matmul.split_for(cfg, rows, triton.cdiv(cols, 256), x.device)
    in_kernel = matmul.kernel_folds(cfg, split)
    part = matmul.partials_for(y, split, cfg)
    q = act_quant.quantize(x[None], act_quant.Q8_K) if qx is None else qx
    tiles = triton.cdiv(rows, cfg.block_n)
    args = dict(matmul._launch_args(cfg, split), **({"maxnreg": maxnreg} if maxnreg else {}))
    del args["EW"]
    k = _kernel[(tiles, split)](data, q.words, q.scales, q.sums, y, part, matmul._tickets_arg(in_kernel, tiles, part),
                            rows, cols, cols // 256 * 144, EMU=matmul.emulate(cfg, x), **args)
    return (y if in_kernel else matmul.fold_partials(part, y)), k
