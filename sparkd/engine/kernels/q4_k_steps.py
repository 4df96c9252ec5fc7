"""The tiled Q4_K GEMV with whole-step compact loads (session 8, q4k17): the bytes step's arithmetic and sum
order on the bytes layout, but each loop step of UNROLL groups loads x's words, per-32 sums and scales and
the tile's headers once per program in their own compact shapes ([UNROLL, 64], [UNROLL, 8], [UNROLL] and
[UNROLL, BN, 4] words: 2 + 1 + 1 + 1 loads a thread for 4 groups, as bench/q4t_tma.py's ptr twin) and
broadcasts them to the words' tile [UNROLL, BN, 4, 2, 4] (the compiler's layout conversion, through shared
memory), where the bytes step has every thread load its row's header and its lanes' x words per group (28
loads a thread per 4 groups). The groups' tiles are then added into the accumulator one after another, as
matmul.row_idot does, so y is the bytes step's bits (tests/engine/test_q4_k_tiled.py, interpreter).

Not an idot of matmul's contract (a step here is UNROLL groups, not one): its own kernel on matmul's grid,
split and fold; q4_k_tiled.gemv(loads="step") runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, matmul, q4_k_tiled
from sparkd.engine.kernels.act_quant import dp4a


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
    acc = tl.sum(tl.sum(acc, 2), 1)  # row_idot's row sums (the same order: the same bits)
    matmul.finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT, ATOMIC, KFOLD)


def igemv(data: torch.Tensor, shape: tuple[int, int], x: torch.Tensor, y: torch.Tensor, cfg: matmul.GemvConfig,
          qx: act_quant.QuantX | None = None) -> torch.Tensor:
    """matmul.igemv's launch for the bytes layout's tiled data with this module's kernel (arguments checked
    by q4_k_tiled.gemv)."""
    rows, cols = shape
    split = matmul.split_for(cfg, rows, triton.cdiv(cols, 256), x.device)
    in_kernel = matmul.kernel_folds(cfg, split)
    part = matmul.partials_for(y, split, cfg)
    q = act_quant.quantize(x[None], act_quant.Q8_K) if qx is None else qx
    tiles = triton.cdiv(rows, cfg.block_n)
    args = matmul._launch_args(cfg, split)
    del args["EW"]
    _kernel[(tiles, split)](data, q.words, q.scales, q.sums, y, part, matmul._tickets_arg(in_kernel, tiles, part),
                            rows, cols, cols // 256 * 144, EMU=matmul.emulate(cfg, x), **args)
    return y if in_kernel else matmul.fold_partials(part, y)
