"""Session 8 (q4k18): the tiled Q4_K tile re-laid so that every thread of a one-warp 4-row program owns its own
slice of x (no x word loaded by two threads) and takes the tile's rows in registers: a load-only twin and a real
step on it, bench only (nothing in sparkd/ reads this layout).

The "relaid" bytes (the same 576 bytes per 4-row tile and group as q4_k_tiled's, the same places: qs of every
group first, group g's at g * 512, then the headers, group g's 64 bytes at 512 G + 64 g):
- qs: word 4 c + r is row r's qs for x words 2c, 2c+1 (elements 8c..8c+7): byte b holds element 8c + b in its low
  nibble and 8c + 4 + b in its high one. Thread c (of 32) loads its 4 rows' words in one 128-bit load and its
  2 x words in one 64-bit load; its sub-block is s = c // 4.
- header: words 0-3 d | dmin << 16 of rows 0-3 (one 128-bit load, the same address for every thread); words
  4 + s (s = 0..7) byte r: sc[s] of row r in the low 6 bits, mn[s]'s bits 4-5 in the top 2; words 12 + s // 2
  byte r: mn[s]'s bits 0-3 in nibble s % 2. So a thread loads 1 header vector and 2 words per group.
The step (MODE 1): per thread and row sc * (dp4a(lo, x[2c]) + dp4a(hi, x[2c+1])) and mn * sums[s] in integers,
then d dx isum - dmin dx msum (the min term in the first of a sub-block's 4 threads, xs 0 in the others) into
an accumulator [32, 4], summed over the 32 threads at the end: the integer sums of q4_k's step, another float
order (within the float bound, not its bits). MODE 0 (the twin): the same loads, an integer add of every word, one float multiply.
Grid, split and fold as matmul.igemv's default tile (4/1/4/e; matmul.step_groups' groups a step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, matmul, q4_k_tiled
from sparkd.engine.kernels.act_quant import dp4a, dp4a_add

MODES = ("relaid-loadonly", "relaid")


def pack_raw(raw: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Raw GGUF Q4_K blocks of W [rows, cols] -> the relaid bytes (uint8, the same count, the same device)."""
    blocks = q4_k_tiled.TILES.blocks(raw, shape).long()  # [tiles, G, 4, 144]
    tiles, groups = blocks.shape[:2]
    q = blocks[..., 16:].reshape(tiles, groups, 4, 4, 32)  # chunk j, byte i: elements 64j + i, 64j + 32 + i
    nib = torch.stack([q & 15, q >> 4], 4).reshape(tiles, groups, 4, 256)  # element order
    nib = nib.reshape(tiles, groups, 4, 32, 2, 4)  # [.., row, c, half, b]: element 8c + 4 half + b
    qs = (nib[..., 0, :] | (nib[..., 1, :] << 4)).permute(0, 1, 3, 2, 4)  # [.., c, row, b]
    hdr = blocks[..., :16]
    a, b, c = hdr[..., 4:8], hdr[..., 8:12], hdr[..., 12:16]
    sc = torch.cat([a & 63, (c & 0xF) | ((a >> 6) << 4)], -1)  # [tiles, G, row, 8] (q4_k.scale_min_words)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], -1)
    scw = (sc | ((mn >> 4) << 6)).transpose(2, 3)  # [tiles, G, s, row]
    lo = (mn & 15).transpose(2, 3).reshape(tiles, groups, 4, 2, 4)  # [.., s // 2, s % 2, row]
    mnw = lo[..., 0, :] | (lo[..., 1, :] << 4)
    head = torch.cat([hdr[..., :4].reshape(tiles, groups, 16), scw.reshape(tiles, groups, 32),
                      mnw.reshape(tiles, groups, 16)], -1)
    return torch.cat([qs.reshape(tiles, -1), head.reshape(tiles, -1)], 1).to(torch.uint8).reshape(-1)


@triton.jit
def _f16(bits):
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _group(base, xw_ptr, xd_ptr, xs_ptr, g, G, ok, acc, MODE: tl.constexpr, EMU: tl.constexpr):
    """Group g of the program's tile (base: its first int32 word) added into acc [32, 4] (thread c, row r)."""
    c = tl.arange(0, 32)[:, None]
    r = tl.arange(0, 4)[None, :]
    s = c // 4
    q = tl.load(base + g * 128 + 4 * c + r, mask=ok, other=0)  # [32, 4]
    hb = base + G * 128 + g * 16
    hd = tl.load(hb + r, mask=ok, other=0)  # [1, 4], every thread the same
    scw = tl.load(hb + 4 + s, mask=ok, other=0)  # [32, 1]
    mnw = tl.load(hb + 12 + s // 2, mask=ok, other=0)
    x = tl.load(xw_ptr + g * 64 + 2 * c + tl.arange(0, 2)[None, :])  # [32, 2]
    x0 = tl.sum(tl.where(tl.arange(0, 2)[None, :] == 0, x, 0), 1, keep_dims=True)
    x1 = tl.sum(x, 1, keep_dims=True) - x0
    xs = tl.load(xs_ptr + g * 8 + s, mask=(c % 4 == 0) | (MODE == 0), other=0)  # [32, 1]
    dx = tl.load(xd_ptr + g)
    if MODE == 0:
        t = q + hd + scw + mnw + x0 + x1 + xs
        return acc + t.to(tl.float32) * dx
    sh = 8 * r
    scb = scw & 0x3F3F3F3F  # the 4 rows' sc, a byte each
    mnb = ((mnw >> (4 * (s % 2))) & 0x0F0F0F0F) | ((scw >> 2) & 0x30303030)  # the 4 rows' mn, a byte each
    lo = dp4a(q & 0x0F0F0F0F, x0, EMU)
    isum = ((scb >> sh) & 255) * dp4a_add((q >> 4) & 0x0F0F0F0F, x1 + tl.zeros(lo.shape, tl.int32), lo, EMU)
    msum = ((mnb >> sh) & 255) * xs  # (xs is 0 in 3 of a sub-block's 4 threads: the min term once)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    # (a group past the range loads zeros: d = dmin = 0, so it adds 0; two fused multiply-adds per row)
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
    acc = tl.zeros((32, 4), tl.float32)
    for g0 in range(start, end, UNROLL):
        for u in tl.static_range(UNROLL):
            g = g0 + u
            ok = tl.zeros((1, 1), tl.int32) + g < end  # past the end: a valid group read, masked out
            acc = _group(base, xw_ptr, xd_ptr, xs_ptr, tl.minimum(g, end - 1), G, ok, acc, MODE, EMU)
    matmul.finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, tl.sum(acc, 0), N, SPLIT, False, KFOLD)


def gemv(mode: str, data: torch.Tensor, rows: int, cols: int, qx: act_quant.QuantX, y: torch.Tensor,
         unroll: int | None = None):
    """Launch MODES' mode on relaid bytes data (pack_raw) and pre-quantized x into y (float32 [rows]) with the
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
