"""Bench-only load-only twins of the tiled Q4_K GEMV with the weight tiles brought in by Hopper TMA
(session 8, q4k16), next to a twin of the same kernel shape on plain pointer loads.

Grid and bytes as matmul.igemv's on the default tile (4/1/4/e): a one-warp program per (4-row tile,
K range), the range's groups UNROLL at a time. Each step takes a tile's qs of UNROLL groups
(UNROLL x 512 bytes, one run: the tiled layout puts group g's 4 rows x 128 bytes at g * 512) and
their headers (UNROLL x 64 bytes at 512 G + 64 g), plus x's words, per-32 sums and scales of those
groups, and only adds them up (an integer add per word, a float multiply per group): the time is
the loads'. LOADS "tma": the weight tiles through two tensor descriptors (host-side
triton.tools.tensor_descriptor.TensorDescriptor over the packed bytes as int32 [tiles, G, 128] and
[tiles, G, 16], strides 144 G / 128 / 1 and 144 G / 16 / 1: the bulk async copy's box is one
step's [1, UNROLL, 128] / [1, UNROLL, 16]), x by pointers; "tmax": x's words by a descriptor too;
"ptr": the same blocks by pointer loads. STAGES: the loop's num_stages (0: Triton's default).
The sums meet as matmul.finish_part's (the wave rule's split, folded in the kernel). Not W @ x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sparkd.engine.kernels import act_quant, matmul

LOADS = ("ptr", "tma", "tmax")


@triton.jit
def _tma_twin_kernel(w_ptr, qs_desc, hd_desc, xw_desc, xw_ptr, xd_ptr, xs_ptr, y_ptr, part_ptr, tickets_ptr,
                     N, K, G, MODE: tl.constexpr, UNROLL: tl.constexpr, SPLIT: tl.constexpr,
                     KFOLD: tl.constexpr, STAGES: tl.constexpr):
    tile = tl.program_id(0)
    rows = tile * 4 + tl.arange(0, 4)
    rmask = rows < N
    per = tl.cdiv(G, SPLIT)
    start = tl.program_id(1) * per
    end = tl.minimum(start + per, G)
    u = tl.arange(0, UNROLL)
    xi = tl.arange(0, UNROLL * 64)
    si = tl.arange(0, UNROLL * 8)
    # one accumulator per loaded block, added elementwise: an integer add per word, nothing shuffled
    aq = tl.zeros((1, UNROLL, 128), tl.int32)
    ah = tl.zeros((1, UNROLL, 16), tl.int32)
    ax = tl.zeros((UNROLL * 64,), tl.int32)
    as_ = tl.zeros((UNROLL * 8,), tl.int32)
    ad = tl.zeros((UNROLL,), tl.float32)
    for g0 in tl.range(start, end, UNROLL, num_stages=STAGES):
        if MODE == 0:  # pointers: the same blocks
            base = w_ptr.to(tl.pointer_type(tl.int32)) + tile.to(tl.int64) * (G * 144)
            gq = g0 + u[None, :, None]
            aq += tl.load(base + gq * 128 + tl.arange(0, 128)[None, None, :], mask=gq < end, other=0)
            ah += tl.load(base + G * 128 + gq * 16 + tl.arange(0, 16)[None, None, :], mask=gq < end, other=0)
        else:
            aq += qs_desc.load([tile, g0, 0])
            ah += hd_desc.load([tile, g0, 0])
        if MODE == 2:
            ax += xw_desc.load([g0 * 64])
        else:
            ax += tl.load(xw_ptr + g0 * 64 + xi, mask=g0 * 64 + xi < end * 64, other=0)
        as_ += tl.load(xs_ptr + g0 * 8 + si, mask=g0 * 8 + si < end * 8, other=0)
        ad += tl.load(xd_ptr + g0 + u, mask=g0 + u < end, other=0.0)
    t = tl.sum(tl.sum(tl.sum(aq, 2), 1), 0) + tl.sum(tl.sum(tl.sum(ah, 2), 1), 0) + tl.sum(ax, 0) + tl.sum(as_, 0)
    acc = tl.zeros((4,), tl.float32) + t.to(tl.float32) * tl.sum(ad, 0)
    matmul.finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT, False, KFOLD)


def unroll_for(groups: int, split: int) -> int:
    """Groups per step: 4 (the default tile's) unless a range's groups are not a multiple of it (a TMA box
    past the range would bring bytes the pointer twin masks out): then 2, or 1."""
    per = -(-groups // split)
    return next(u for u in (4, 2, 1) if per % u == 0)


def descriptors(data: torch.Tensor, rows: int, cols: int, unroll: int = 4):
    """The two weight descriptors over tiled Q4_K bytes data (uint8, 16-byte aligned)."""
    tiles, groups = rows // 4, cols // 256
    w32 = data.view(torch.int32)
    qs = TensorDescriptor(w32, [tiles, groups, 128], [144 * groups, 128, 1], [1, unroll, 128])
    hd = TensorDescriptor(w32[128 * groups:], [tiles, groups, 16], [144 * groups, 16, 1], [1, unroll, 16])
    return qs, hd


def gemv(loads: str, data: torch.Tensor, rows: int, cols: int, qx: act_quant.QuantX, y: torch.Tensor,
         stages: int = 0):
    """Launch a twin (LOADS' name) on tiled bytes data and pre-quantized x; returns Triton's compiled kernel
    (its n_regs, n_spills, metadata.shared)."""
    cfg = matmul.GEMV_TILES["Q4_K_TILED"]
    split = matmul.split_for(cfg, rows, cols // 256, y.device)
    in_kernel = matmul.kernel_folds(cfg, split)
    part = matmul.partials_for(y, split, cfg)
    tiles = rows // 4
    unroll = unroll_for(cols // 256, split)
    qd, hd = descriptors(data, rows, cols, unroll)
    xd = TensorDescriptor(qx.words.view(-1), [cols // 4], [1], [unroll * 64])
    k = _tma_twin_kernel[(tiles, split)](
        data, qd, hd, xd, qx.words, qx.scales, qx.sums, y, part, matmul._tickets_arg(in_kernel, tiles, part),
        rows, cols, cols // 256, MODE=LOADS.index(loads), UNROLL=unroll, SPLIT=split, KFOLD=in_kernel,
        STAGES=stages or None, num_warps=1)
    if not in_kernel:
        matmul.fold_partials(part, y)
    return k
