"""Rope, the KV write and the attention of one decode token in one launch: the static (CUDA graph) and eager
one-token step's rope_kv then decode_attention ("auto"), without the launch between them and with each
program's keys read in one load. The references: kernels/rope_kv.py then kernels/decode_attention.py, and
layers/attention.py's torch path (apply_rope, KVCache.append, attend).

Why (session 28): in the H200 profile of the 12-layer Qwen3-30B-A3B-shaped decode, rope + KV write and
attention added ~2 and ~10.6 us a layer at positions 8-136 where their bytes take well under a microsecond:
a chain of dependent memory round trips (rope_kv's launch; then attention's position, each 32-key block's
keys, then its values, the next block's, the fold's ticket). Here a program per (query head h, range r of
KEYS keys) waits once, reads the position, and then loads its range's keys and values, its head's q, the new
k and v rows and the rope angles all at once: the new row's k and v are normalised and rotated in the
registers (rope_kv.roped_row) and stand in for row pos of the loaded keys, so no program waits for another's
write; the first query head of each KV head writes them into the cache row for the steps after. The ranges'
softmaxes are added as decode_attention's "auto" adds them (finish_ranges: one range stores its result, more
take a ticket and the last folds them in order), so the bits depend on the position only, as there.

KEYS keys a range: TILE_VALUES // the padded head width (32 at 128 wide), so a [KEYS, D] float32 tile of keys
and one of values take 32 registers a thread each at 4 warps. H200, 32 query heads over 4 KV heads of 128, the
kernel alone against rope_kv + "auto" (bench/gpu_box/decode_attention_bench.py --fused, session 28 call 1):
4.6 / 4.0 us at position 8, 7.4 / 10.5 at 72, 7.4 / 11.6 at 264, 13.2 / 15.4 at 1000, but 24.0 / 17.3 at 2000
(2016 programs, each roping q and k again): layers/attention.py keeps the two launches for static buckets
over fused.ROPE_ATTENTION_SPAN and eager positions from it. Tried and not kept (call 2): 64-key tiles (8 warps;
5.8 us at position 8), and a head's tiles cut into at most 8 or 16 ranges, each program loading its next tile
before adding the one it held (2000 positions 21.0-40.2 us, 8000 69-105 against 58.9: the per-tile loop costs
~2.4 us a tile). Session 29's decode_attention "grouped" (a program per KV head over its group's query heads,
the keys read once, not 8 times) beats this kernel from the 1024 bucket on (rope_kv + grouped 10.6 us at 1000
positions against 13.3), so fused.ROPE_ATTENTION_SPAN is now 512.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.decode_attention import (FOLD_RANGES, finish_ranges, range_program, ring_problem,
                                                    shape_problem)
from sparkd.engine.kernels.family import KernelArgumentError
from sparkd.engine.kernels.matmul import tickets
from sparkd.engine.kernels.rope_kv import problem as rope_problem
from sparkd.engine.kernels.rope_kv import roped_row

TILE_VALUES = 4096  # values in a program's [KEYS, D] tile of keys (and one of values)


def range_keys(block_d: int) -> int:
    """Keys a program's range at a padded head width block_d (the wider of k's and v's)."""
    return max(16, min(64, TILE_VALUES // block_d))


@triton.jit
def _rope_attention(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, q_norm_ptr, k_norm_ptr, eps,
                    k_cache_ptr, v_cache_ptr, sink_ptr, out_ptr, part_ptr, stat_ptr, ticket_ptr, span, scale,
                    window, q_head_stride, k_head_stride, v_head_stride, kc_row_stride, kc_head_stride,
                    vc_row_stride, vc_head_stride, out_head_stride, DK, DV, HALF, GROUP: tl.constexpr,
                    NEOX: tl.constexpr, NORM: tl.constexpr, HAS_SINKS: tl.constexpr, KEYS: tl.constexpr,
                    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, FOLD: tl.constexpr, RING: tl.constexpr = False,
                    PDL: tl.constexpr = False):
    """Program (h, r): query head h over the cache rows [r KEYS, (r + 1) KEYS); a range holding no visible key
    returns at once (no stats, no ticket). RING: the span's rows are a ring (position p's row p % span), the keys
    reach the position and program r runs range range_program(r, r0, ...), as decode_attention's."""
    pdl.start(PDL)  # first: pdl's rule
    h, r = tl.program_id(0), tl.program_id(1)
    kvh = h // GROUP
    pos = tl.load(pos_ptr).to(tl.int32)
    if RING:
        hi = pos + 1  # keys [lo, hi) are visible
    else:
        hi = tl.minimum(pos + 1, span)
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    r0, r1 = lo // KEYS, tl.cdiv(hi, KEYS)  # the ranges holding keys
    if RING:
        r = range_program(r, r0, tl.num_programs(1))
    if (r < r0) | (r >= r1):
        return
    rows = r * KEYS + tl.arange(0, KEYS)
    seen = (rows >= lo) & (rows < hi)
    row = pos
    if RING:
        rows, row = rows % span, pos % span  # the positions' ring rows (seen stays the positions')
    dk, dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    k = tl.load(k_cache_ptr + kvh * kc_head_stride + rows[:, None].to(tl.int64) * kc_row_stride + dk[None, :],
                mask=seen[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
    v = tl.load(v_cache_ptr + kvh * vc_head_stride + rows[:, None].to(tl.int64) * vc_row_stride + dv[None, :],
                mask=seen[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
    cos_row, sin_row = cos_ptr + pos.to(tl.int64) * HALF, sin_ptr + pos.to(tl.int64) * HALF
    q = roped_row(q_ptr + h * q_head_stride, cos_row, sin_row, q_norm_ptr, eps, DK, HALF, NEOX, NORM, BLOCK_DK)
    new_k = roped_row(k_ptr + kvh * k_head_stride, cos_row, sin_row, k_norm_ptr, eps, DK, HALF, NEOX, NORM,
                      BLOCK_DK)
    new_v = tl.load(v_ptr + kvh * v_head_stride + dv, mask=dv < DV, other=0.0)
    new_k = new_k.to(k_cache_ptr.dtype.element_ty)  # rounded to the cache rows' type, as the later steps read it
    new_v = new_v.to(v_cache_ptr.dtype.element_ty)
    now = (rows == row)[:, None]  # the new row stands in for the cache's, written or not yet
    k = tl.where(now, new_k.to(tl.float32)[None, :], k)
    v = tl.where(now, new_v.to(tl.float32)[None, :], v)
    if (h % GROUP == 0) & (r == pos // KEYS):  # one writer a KV head: the rows the later steps read
        tl.store(k_cache_ptr + row.to(tl.int64) * kc_row_stride + kvh * kc_head_stride + dk, new_k, mask=dk < DK)
        tl.store(v_cache_ptr + row.to(tl.int64) * vc_row_stride + kvh * vc_head_stride + dv, new_v, mask=dv < DV)
    s = tl.where(seen, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))  # [KEYS]
    m0 = tl.full([], float("-inf"), tl.float32)
    t0 = tl.full([], 0.0, tl.float32)
    if HAS_SINKS:  # the sink joins the first range holding keys only: one more logit, no value
        m0 = tl.where(r == r0, tl.load(sink_ptr + h).to(tl.float32), m0)
        t0 = tl.where(r == r0, 1.0, t0)
    m = tl.maximum(m0, tl.max(s, axis=0))  # finite: the range holds a visible key
    p = tl.exp(s - m)
    total = t0 * tl.exp(m0 - m) + tl.sum(p, axis=0)
    acc = tl.sum(p[:, None] * v, axis=0)
    finish_ranges(out_ptr, part_ptr, stat_ptr, ticket_ptr, h, m, total, acc, r0, r1, out_head_stride, DV,
                  BLOCK_DV, FOLD)


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, neox: bool,
                   norms: tuple[torch.Tensor, torch.Tensor, float] | None, scale: float, window: int = 0,
                   sinks: torch.Tensor | None = None, ring: int = 0) -> torch.Tensor:
    """q [1, H, Dk], k [1, Hkv, Dk], v [1, Hkv, Dv]: the token's projections, not yet normalised or rotated;
    cos, sin [C, n_rot/2] the tables of every position; pos [1] on the device (< S); k_cache [S, Hkv, Dk],
    v_cache [S, Hkv, Dv]: the cache rows attention reads (from row 0); norms (q weight [Dk], k weight [Dk], eps)
    to RMS-normalise each head first; ring: S where the caches are a sliding window's ring (decode_attention's).
    Writes rope(k) and v at row pos (pos % S) of the caches → [1, H, Dv] float32, as
    decode_attention(rope_kv(q, k, v, ...), k_cache, v_cache, pos, scale, window, sinks, ring)."""
    bad = (rope_problem(q, k, v, cos, sin, k_cache, v_cache, norms, ring)
           or shape_problem(q, k_cache, v_cache, sinks, "1"))
    bad = bad or ring_problem(ring, k_cache, window)
    if not bad and (pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64)):
        bad = "pos must be one integer position"
    if bad:
        raise KernelArgumentError(f"could not run rope_attention on q {list(q.shape)}, k {list(k.shape)}, "
                                  f"caches {list(k_cache.shape)}: {bad}")
    _, H, Dk = q.shape
    S, Hkv, Dv = v_cache.shape
    block_dk, block_dv = triton.next_power_of_2(Dk), triton.next_power_of_2(Dv)
    keys = range_keys(max(block_dk, block_dv))
    n_r = triton.cdiv(S, keys)
    out = torch.empty(1, H, Dv, dtype=torch.float32, device=q.device)
    part = torch.empty(H, n_r, block_dv, dtype=torch.float32, device=q.device)
    stat = torch.empty(2, H, n_r, dtype=torch.float32, device=q.device)
    q_w, k_w, eps = (q, q, 0.0) if norms is None else norms
    _rope_attention[(H, n_r)](
        q, k, v, cos, sin, pos, q_w, k_w, eps, k_cache, v_cache, q if sinks is None else sinks, out, part, stat,
        tickets(H, q.device), S, scale, window, q.stride(1), k.stride(1), v.stride(1), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), out.stride(1), Dk, Dv, cos.shape[1],
        GROUP=H // Hkv, NEOX=neox, NORM=norms is not None, HAS_SINKS=sinks is not None, KEYS=keys,
        BLOCK_DK=block_dk, BLOCK_DV=block_dv, FOLD=FOLD_RANGES, RING=ring > 0, num_warps=4, **pdl.launch(q.device))
    return out
