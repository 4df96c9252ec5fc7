"""Session 8 (q4k19): q4k18's re-laid tile with 2 rows a thread instead of 4 (16 lanes along K per row pair, x
loaded twice instead of 4 times): a thread makes the per-row values (d and dmin to float32 and times x's scale,
the 6-bit scale and min taken out) for 2 rows per group, q4k18's step for 4. A load-only twin and a real step,
bench only (nothing in sparkd/ reads this layout).

The "pair" bytes (the same 576 bytes per 4-row tile and group in the same places as q4_k_tiled's: qs of every
group first, group g's at g * 512, then the headers, group g's 64 bytes at 512 G + 64 g):
- qs: thread t = 2 c + p (c = 0..15 along K, p the row pair: rows 2p, 2p+1) owns elements 16c..16c+15 of its 2
  rows; word 4 t + 2 r + k is row 2p + r's for elements 16c + 8k .. 16c + 8k + 7 (byte b: element 16c + 8k + b in
  the low nibble, 16c + 8k + 4 + b in the high one, so x word 4c + 2k pairs with the low nibbles, 4c + 2k + 1
  with the high ones). A thread's 4 words are one 128-bit load, its 4 x words another (threads 2c and 2c + 1 the
  same address); its sub-block is s = c // 2.
- header: q4t_relaid's (words 0-3 d | dmin << 16 of rows 0-3; words 4 + s byte r: sc[s] of row r with mn[s]'s
  bits 4-5 on top; words 12 + s // 2 byte r: mn[s]'s bits 0-3 in nibble s % 2): a thread loads its 2 rows' d |
  dmin as one 64-bit load and 2 words of scales.
The step (MODE 1): per thread and row sc * (4 chained dp4a) and mn * sums[s] in integers (the min term in the
first of a sub-block's 2 threads, xs 0 in the other), d dx isum - dmin dx msum into an accumulator [32, 2],
summed over the 16 threads of each row pair at the end: q4_k's integer sums, another float order (within the
float bound, not the bytes step's bits). MODE 0 (the twin): the same loads, an integer add of every word, one
float multiply. Grid, split and fold as matmul.igemv's default tile (4/1/4/e; matmul.step_groups' groups a step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, matmul, q4_k_pair, q4_k_tiled
from sparkd.engine.kernels.q4_k_pair import _col, _f16, _partner, _row_isum

MODES = ("pair-loadonly", "pair", "pairx")


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q4_K blocks of W [rows, cols] -> the pair bytes (uint8, the same count, the same device): since
    q4k19's engine path, kernels/q4_k_pair.py's pack_blocks."""
    return q4_k_pair.pack_blocks(q4_k_tiled.TILES.blocks(raw, shape))


@triton.jit
def _group_x(base, xw_ptr, xd_ptr, xs_ptr, g, G, ok, acc, EMU: tl.constexpr):
    """"pairx": _group's integer sums, then the 2 threads of a sub-block and row pair (e = c % 2) trade one
    row's sum (one shuffle) so that thread e makes the per-row values (d, dmin times dx, sc, mn) of row 2p + e
    only; acc [32, 1]."""
    t = tl.arange(0, 32)[:, None]
    w = tl.arange(0, 4)[None, :]
    c = t // 2
    s = c // 2
    e = c % 2
    q = tl.load(base + g * 128 + 4 * t + w, mask=ok, other=0)  # [32, 4]: words (r, k) = 2r + k
    x = tl.load(xw_ptr + g * 64 + 4 * c + w)  # [32, 4]: x words 4c .. 4c + 3
    hb = base + G * 128 + g * 16
    sh = 8 * (2 * (t % 2) + e)  # [32, 1]: the thread's row 2p + e
    hd = tl.load(hb + sh // 8, mask=ok, other=0)
    scw = tl.load(hb + 4 + s, mask=ok, other=0)
    mnw = tl.load(hb + 12 + s // 2, mask=ok, other=0)
    xs = tl.load(xs_ptr + g * 8 + s)  # [32, 1]
    dx = tl.load(xd_ptr + g)
    x0, x1, x2, x3 = _col(x, 0), _col(x, 1), _col(x, 2), _col(x, 3)
    i0 = _row_isum(_col(q, 0), _col(q, 1), x0, x1, x2, x3, EMU)
    i1 = _row_isum(_col(q, 2), _col(q, 3), x0, x1, x2, x3, EMU)
    isum = tl.where(e == 0, i0, i1) + _partner(tl.where(e == 0, i1, i0), EMU)
    sc = (scw >> sh) & 63
    mn = ((mnw >> (sh + 4 * (s % 2))) & 15) | (((scw >> sh) >> 2) & 48)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    return acc + d * (sc * isum).to(tl.float32) - dmin * (mn * xs).to(tl.float32)


@triton.jit
def _group(base, xw_ptr, xd_ptr, xs_ptr, g, G, ok, acc, MODE: tl.constexpr, EMU: tl.constexpr):
    """Group g of the program's tile (base: its first int32 word) added into acc [32, 2] (thread t, row 2 (t % 2) + r)."""
    t = tl.arange(0, 32)[:, None]
    w = tl.arange(0, 4)[None, :]
    r = tl.arange(0, 2)[None, :]
    c = t // 2
    s = c // 2
    q = tl.load(base + g * 128 + 4 * t + w, mask=ok, other=0)  # [32, 4]: words (r, k) = 2r + k
    x = tl.load(xw_ptr + g * 64 + 4 * c + w)  # [32, 4]: x words 4c .. 4c + 3
    hb = base + G * 128 + g * 16
    hd = tl.load(hb + 2 * (t % 2) + r, mask=ok, other=0)  # [32, 2]: the thread's 2 rows' d | dmin << 16
    scw = tl.load(hb + 4 + s, mask=ok, other=0)  # [32, 1]
    mnw = tl.load(hb + 12 + s // 2, mask=ok, other=0)
    xs = tl.load(xs_ptr + g * 8 + s, mask=(c % 2 == 0) | (MODE == 0), other=0)  # [32, 1]
    dx = tl.load(xd_ptr + g)
    if MODE == 0:
        tw = tl.sum(q + x, 1, keep_dims=True) + hd + scw + mnw + xs
        return acc + tw.to(tl.float32) * dx
    x0, x1, x2, x3 = _col(x, 0), _col(x, 1), _col(x, 2), _col(x, 3)
    i0 = _row_isum(_col(q, 0), _col(q, 1), x0, x1, x2, x3, EMU)
    i1 = _row_isum(_col(q, 2), _col(q, 3), x0, x1, x2, x3, EMU)
    sh = 8 * (2 * (t % 2) + r)  # [32, 2]: the row's byte in the scale words
    sc = (scw >> sh) & 63
    mn = ((mnw >> (sh + 4 * (s % 2))) & 15) | (((scw >> sh) >> 2) & 48)
    isum = sc * tl.where(r == 0, i0, i1)
    msum = mn * xs  # (xs is 0 in the second thread of a sub-block: the min term once)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    # (a group past the range loads zeros: d = dmin = 0, so it adds 0)
    return acc + d * isum.to(tl.float32) - dmin * msum.to(tl.float32)


@triton.jit
def _kernel(w_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, part_ptr, tickets_ptr, N, G, MODE: tl.constexpr,
            UNROLL: tl.constexpr, SPLIT: tl.constexpr, KFOLD: tl.constexpr, EMU: tl.constexpr):
    tile = tl.program_id(0)
    rows = tile * 4 + tl.arange(0, 4)
    rmask = rows < N
    per = tl.cdiv(G, SPLIT)
    start = tl.program_id(1) * per
    end = tl.minimum(start + per, G)
    base = w_ptr.to(tl.pointer_type(tl.int32)) + tile.to(tl.int64) * (G * 144)
    acc = tl.zeros((32, 1 if MODE == 2 else 2), tl.float32)
    for g0 in range(start, end, UNROLL):
        for u in tl.static_range(UNROLL):
            g = g0 + u
            ok = tl.zeros((1, 1), tl.int32) + g < end  # past the end: a valid group read, masked out
            if MODE == 2:
                acc = _group_x(base, xw_ptr, xd_ptr, xs_ptr, tl.minimum(g, end - 1), G, ok, acc, EMU)
            else:
                acc = _group(base, xw_ptr, xd_ptr, xs_ptr, tl.minimum(g, end - 1), G, ok, acc, MODE, EMU)
    if MODE == 2:  # thread t = 4s + 2e + p holds row 2p + e
        out = tl.reshape(tl.permute(tl.sum(tl.reshape(acc, (8, 2, 2)), 0), (1, 0)), (4,))
    else:  # thread t = 2c + p holds rows 2p, 2p + 1
        out = tl.reshape(tl.sum(tl.reshape(acc, (16, 2, 2)), 0), (4,))
    matmul.finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, out, N, SPLIT, False, KFOLD)


def gemv(mode: str, data: torch.Tensor, rows: int, cols: int, qx: act_quant.QuantX, y: torch.Tensor,
         unroll: int | None = None):
    """Launch MODES' mode on pair bytes data (pack_raw) and pre-quantized x into y (float32 [rows]) with the
    default tile's split and groups a step (or unroll); returns Triton's compiled kernel."""
    cfg = matmul.GEMV_TILES["Q4_K_TILED"]
    groups = cols // 256
    split = matmul.split_for(cfg, rows, groups, y.device)
    in_kernel = matmul.kernel_folds(cfg, split)
    part = matmul.partials_for(y, split, cfg)
    tiles = rows // 4
    k = _kernel[(tiles, split)](
        data, qx.words, qx.scales, qx.sums, y, part, matmul._tickets_arg(in_kernel, tiles, part), rows, groups,
        MODE=MODES.index(mode), UNROLL=unroll or matmul.step_groups(cfg, split), SPLIT=split, KFOLD=in_kernel,
        EMU=not y.is_cuda, num_warps=1)
    if not in_kernel:
        matmul.fold_partials(part, y)
    return k
