"""Decode attention with a program per (KV head, range of keys) over all the query heads that read
that KV head (GQA), float32: decode_attention's "grouped" rule (session 29).

Why: decode_attention "auto" runs a program per (query head, 64 keys), so under GQA every key and
value row is read once per query head of its group (8 times in Qwen3-30B-A3B's 32 over 4), from the
L2 at best. At long spans that is the cost: 17 us a layer at 2000 positions and 59 at 8000 on the H200,
where the 32 MB of float32 KV rows a layer at 8000 take ~8 us at copy speed. Here a program loads each
key and value tile once and multiplies it with the group's query rows as matrices (tl.dot in IEEE
float32: the [BLOCK_H, D] query block against the [BLOCK_S, D] keys, then the [BLOCK_H, BLOCK_S]
weights against the values), BLOCK_H = 16 query heads a block (tl.dot's least M; a group of 8 leaves
half the rows empty, never stored).

The ranges: the visible keys' blocks of BLOCK_S are cut into at most RANGES ranges of whole blocks,
the same count at every span, so a range's keys depend on the position only (an eager step over the
whole cache and a static one over a bucket add the same ranges the same way, the same bits). Each range
keeps its rows' running max, sum and weighted values (online softmax); a head block whose keys fit one
range stores its result from that program; else the block's last program to take its ticket adds the
ranges in order: every range's maxima at once, then FOLD ranges' values a step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.matmul import tickets

RANGES = 32  # ranges a head block, a power of two (4 KV heads: 128 programs, about one per SM of the H200)
BLOCK_H = 16  # query heads a program: tl.dot's least M
TILE_VALUES = 8192  # a [BLOCK_S, D] key or value tile's values: 64 keys at 128 wide
STAGES = 3  # software pipelining of a range's tile loads
PRECISION = "ieee"


@triton.jit
def _grouped_attention(query_ptr, k_ptr, v_ptr, pos_ptr, sink_ptr, out_ptr, part_ptr, stat_ptr, ticket_ptr, span,
                       scale, window, q_head_stride, k_row_stride, k_head_stride, v_row_stride, v_head_stride,
                       out_head_stride, DK, DV, GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
                       HAS_SINKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DK: tl.constexpr,
                       BLOCK_DV: tl.constexpr, N_R: tl.constexpr, FOLD: tl.constexpr, PRECISION: tl.constexpr = "ieee",
                       PDL: tl.constexpr = False):
    """Program (b, r): head block b (KV head b // HEAD_BLOCKS, its query heads from (b % HEAD_BLOCKS) *
    BLOCK_H on), range r of its visible keys. Stats [2, B, R, BLOCK_H] and values [B, R, BLOCK_H, BLOCK_DV]
    hold the ranges for the fold."""
    pdl.start(PDL)  # first: pdl's rule
    b, r = tl.program_id(0), tl.program_id(1)
    kvh = b // HEAD_BLOCKS
    g = (b % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)  # the block's heads within the group
    real = g < GROUP
    heads = kvh * GROUP + g
    pos = tl.load(pos_ptr).to(tl.int32)
    hi = tl.minimum(pos + 1, span)  # keys [lo, hi) are visible
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    first = (lo // BLOCK_S) * BLOCK_S  # blocks of BLOCK_S keys from here hold a visible key each
    blocks = tl.cdiv(hi - first, BLOCK_S)
    per = tl.cdiv(blocks, N_R)  # blocks a range
    used = tl.cdiv(blocks, per)  # ranges holding keys: [0, used)
    if r >= used:
        return  # no key here: neither stats nor a ticket
    start = first + r * per * BLOCK_S
    end = tl.minimum(start + per * BLOCK_S, hi)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(query_ptr + heads[:, None] * q_head_stride + dk[None, :], mask=real[:, None] & (dk < DK)[None, :],
                other=0.0)
    if HAS_SINKS:  # the sink joins range 0 only: a logit with no value, exp(sink - m) = 1 in the sum
        m = tl.where(r == 0, tl.load(sink_ptr + heads, mask=real, other=0.0), float("-inf"))
        total = tl.where(r == 0, 1.0, 0.0) + tl.zeros([BLOCK_H], tl.float32)
    else:
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    k_base = k_ptr + kvh * k_head_stride
    v_base = v_ptr + kvh * v_head_stride
    for s0 in range(start, end, BLOCK_S):
        rows = s0 + tl.arange(0, BLOCK_S)
        seen = (rows >= lo) & (rows < hi)
        k = tl.load(k_base + rows[:, None].to(tl.int64) * k_row_stride + dk[None, :],
                    mask=seen[:, None] & (dk < DK)[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_H, BLOCK_S]
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block holds a visible key
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + rows[:, None].to(tl.int64) * v_row_stride + dv[None, :],
                    mask=seen[:, None] & (dv < DV)[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    out_rows = out_ptr + heads[:, None] * out_head_stride + dv[None, :]
    out_mask = real[:, None] & (dv < DV)[None, :]
    if used == 1:  # this range holds the block's keys: its values are the result
        tl.store(out_rows, acc / total[:, None], mask=out_mask)
    else:
        n_b = tl.num_programs(0)
        hh = tl.arange(0, BLOCK_H)
        slot = b * N_R + r
        tl.store(stat_ptr + slot * BLOCK_H + hh, m)
        tl.store(stat_ptr + (n_b * N_R + slot) * BLOCK_H + hh, total)
        tl.store(part_ptr + (slot * BLOCK_H + hh[:, None]) * BLOCK_DV + dv[None, :], acc)
        tl.debug_barrier()  # every thread's stores before the ticket releases them
        if tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel") == used - 1:
            tl.debug_barrier()
            tl.store(out_rows, _fold(stat_ptr, part_ptr, b, n_b, used, BLOCK_H, BLOCK_DV, N_R, FOLD), mask=out_mask)
            tl.store(ticket_ptr + b, 0)


@triton.jit
def _fold(stat_ptr, part_ptr, b, n_b, used, BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr, N_R: tl.constexpr,
          FOLD: tl.constexpr):
    """Head block b's ranges [0, used) added → [BLOCK_H, BLOCK_DV]: the ranges' maxima and sums loaded at once
    (N_R ranges), then FOLD ranges' weighted values a step, in order."""
    hh = tl.arange(0, BLOCK_H)
    rr = tl.arange(0, N_R)
    here = (rr < used)[:, None]
    slots = (b * N_R + rr)[:, None] * BLOCK_H + hh[None, :]  # [N_R, BLOCK_H]
    m = tl.load(stat_ptr + slots, mask=here, other=float("-inf"), cache_modifier=".cg")
    t = tl.load(stat_ptr + n_b * N_R * BLOCK_H + slots, mask=here, other=0.0, cache_modifier=".cg")
    top = tl.max(m, axis=0)  # [BLOCK_H]; rows past the group: 0 from their zero queries
    total = tl.sum(t * tl.exp(m - top[None, :]), axis=0)
    dv = tl.arange(0, BLOCK_DV)
    fr = tl.arange(0, FOLD)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for c in range(0, used, FOLD):
        some = (c + fr < used)[:, None]
        cs = (b * N_R + c + fr)[:, None] * BLOCK_H + hh[None, :]  # [FOLD, BLOCK_H]
        w = tl.exp(tl.load(stat_ptr + cs, mask=some, other=float("-inf"), cache_modifier=".cg") - top[None, :])
        p = tl.load(part_ptr + cs[:, :, None] * BLOCK_DV + dv[None, None, :], mask=some[:, :, None], other=0.0,
                    cache_modifier=".cg")
        acc += tl.sum(p * w[:, :, None], axis=0)
    return acc / total[:, None]


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, scale: float,
                      window: int, sinks: torch.Tensor | None) -> torch.Tensor:
    """decode_attention's arguments (checked there) → [1, H, Dv] float32."""
    _, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    group = H // Hkv
    head_blocks = triton.cdiv(group, BLOCK_H)
    n_b = Hkv * head_blocks
    block_dk, block_dv = max(16, triton.next_power_of_2(Dk)), max(16, triton.next_power_of_2(Dv))  # tl.dot's least
    block_s = max(16, min(64, TILE_VALUES // max(block_dk, block_dv)))
    out = torch.empty(1, H, Dv, dtype=torch.float32, device=q.device)
    part = torch.empty(n_b, RANGES, BLOCK_H, block_dv, dtype=torch.float32, device=q.device)
    stat = torch.empty(2, n_b, RANGES, BLOCK_H, dtype=torch.float32, device=q.device)
    _grouped_attention[(n_b, RANGES)](
        q, k, v, pos, q if sinks is None else sinks, out, part, stat, tickets(n_b, q.device), S, scale, window,
        q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(1), Dk, Dv,
        GROUP=group, HEAD_BLOCKS=head_blocks, HAS_SINKS=sinks is not None, BLOCK_H=BLOCK_H, BLOCK_S=block_s, BLOCK_DK=block_dk,
        BLOCK_DV=block_dv, N_R=RANGES, FOLD=max(1, 8192 // (BLOCK_H * block_dv)), PRECISION=PRECISION, num_warps=4,
        num_stages=STAGES, **pdl.launch(q.device))
    return out
