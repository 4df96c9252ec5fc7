"""Attention of one query token over a static span of cached keys, masked by the query's
device position: the static (CUDA graph) decode step's attention, float32 throughout (float16 cache rows,
--kv-type, are widened as they are loaded here; "grouped" multiplies them as they are, at float32's error).
layers/attention.py's `attend` is the reference.

$SPARKD_DECODE_ATTENTION_SPLIT "grouped" (the default since session 29): kernels/grouped_attention.py,
a program per (KV head, range of keys) over the query heads that share the KV head, then a launch that
adds the ranges (MLA's latent rows too where they are float16; rows it does not take, grouped_attention.fits,
run "auto"). The rest of this docstring is the kernel below: "auto", "serial" and "off".

A program per query head reads its KV head (GQA: head h reads kv head h // group, as ggml
broadcasts) in blocks of keys with a running max and sum (online softmax). Keys past the
position and, with a sliding window, keys at or beyond `window` positions back are skipped: the
loop runs over [lo, pos] only, so a short sequence in a long bucket reads few rows. An attention
sink is one more logit in the denominator with no value: it starts the running max and sum.

Split over the keys (session 15, step26): a program per query head walks its keys one block after
another, so the kernel's time grows with the position at a few us per 64-key block (H200, the
12-layer Qwen3-30B-A3B-shaped models: ~27 us a layer at 296 positions, a third of the step). With
$SPARKD_DECODE_ATTENTION_SPLIT "auto" (default) the span's keys are cut into ranges of RANGE_KEYS,
a program per (head, range) keeps its range's running max, sum and weighted values, and the last
program of a head to finish (a ticket, as the split-K GEMV's fold) rescales and adds the ranges
holding keys in order: deterministic, another summation order than one walk (rounding apart, the
same function); "off" runs one program a head, the bits before.

The fold at short positions (session 16, attn28): step26's fold loaded the ranges' stats one at a
time in two serial loops, and every program of the grid stored its stats and took a ticket, also
the ranges past the position (a 256-key bucket: 4 programs a head, 1-3 of them holding keys at
positions 8-136, where the split lost 2.5 % to one walk). Now ("auto") a program whose range holds
no key returns at once, a head whose keys fit one range stores its result from that range's
program (no ticket: the fold of one range is that range's values, the same bits), and the fold
loads FOLD_RANGES ranges' stats and values at once (a max and two sums over the block, a running
rescale between blocks). Deterministic and position-only as before; the sums' order within a
block is the reduction's, not step26's (other last bits where two ranges or more hold keys, the same
bound: 1.4e-7-1.8e-7 against float64 on the H200). H200, 32 heads over 4 KV heads of 128, the kernel
alone (us a call, off / serial / auto): 3.4 / 3.9 / 2.5 at position 8, 4.3 / 6.3 / 4.7 at 40, 9.0 /
9.1 / 8.6 at 72, 14.9 / 10.9 / 10.6 at 136, 20.3 / 11.7 / 12.4 at 200, 47.2 / 14.5 / 14.7 at 520, 171 /
18.4 / 15.8 at 2000; the 12-layer Q4_K decode (one process, interleaved) 1558 / 1529 / 1558 tok/s at
positions 8-136, 1025 / 1472 / 1512 at 136-648. "serial": step26's fold and grid (its bits; the
kernel alone 0.2-0.7 us faster at 200-520 positions, where 3-9 ranges hold keys: the block fold's
[32, 128] tile for a few ranges, a smaller block the next thing to try).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import grouped_attention as grouped
from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError
from sparkd.engine.kernels.matmul import tickets
from sparkd.engine.kernels.rope_kv import CACHE_TYPES

SPLIT_ENV = "SPARKD_DECODE_ATTENTION_SPLIT"
SPLIT_RULE = switches.choice(SPLIT_ENV, ("grouped", "auto", "serial", "off"), "grouped")
RANGE_KEYS = 64  # "auto": keys a range (two blocks)
RANGE_BLOCK_S = 32  # keys a block there: [32, 128] float32 tiles need no spills at 4 warps
FOLD_RANGES = 32  # "auto": ranges a fold step loads at once (2048 keys: one step up to that span)
# a ring (RING) holds at least this many rows past its window: a range more than the window's keys span, so its
# programs (its rows over the range's keys, "auto"'s and rope_attention's at most 64) cover them
RING_MARGIN = 64


def key_range() -> int:
    """Keys a program's range (0: one program walks all the keys of its head, as before step26)."""
    return 0 if SPLIT_RULE == "off" else RANGE_KEYS


def fold_ranges() -> int:
    """Ranges the fold loads at once (0: step26's fold, one range at a time, every program of the grid counted);
    "grouped" runs "auto" where its kernel does not take the head widths."""
    return FOLD_RANGES if SPLIT_RULE in ("auto", "grouped") else 0


@triton.jit
def _attend_keys(q, k_base, v_base, k_row_stride, v_row_stride, dk, dv, DK, DV, lo, hi, first, end, scale,
                 m, total, acc, ring, BLOCK_S: tl.constexpr, RING: tl.constexpr):
    """The running (max, sum, weighted values) after the key blocks [first, end) (keys outside
    [lo, hi) masked): online softmax, a block at a time. RING: position p's row is p % ring."""
    for start in range(first, end, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        seen = (rows >= lo) & (rows < hi)
        if RING:
            rows = rows % ring
        k = tl.load(k_base + rows[:, None].to(tl.int64) * k_row_stride + dk[None, :],
                    mask=seen[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_S]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: every block holds a visible key
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        total = total * alpha + tl.sum(p, axis=0)
        v = tl.load(v_base + rows[:, None].to(tl.int64) * v_row_stride + dv[None, :],
                    mask=seen[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    return m, total, acc


@triton.jit
def _fold_ranges(stat_ptr, part_ptr, h, n_h, n_r, r0, r1, BLOCK_DV: tl.constexpr,
                 FOLD: tl.constexpr):
    """Head h's ranges [r0, r1) (each holding keys: finite maxima) added → its output [BLOCK_DV], FOLD
    ranges a step: their maxima, sums and weighted values loaded at once, rescaled to the running max.
    Range r's are in slot r % n_r (range_program: at most n_r ranges hold keys)."""
    dv = tl.arange(0, BLOCK_DV)
    top = tl.full([], float("-inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for c in range(r0, r1, FOLD):
        rr = c + tl.arange(0, FOLD)
        here = rr < r1
        slot = h * n_r + rr % n_r
        m = tl.load(stat_ptr + slot, mask=here, other=float("-inf"), cache_modifier=".cg")
        t = tl.load(stat_ptr + n_h * n_r + slot, mask=here, other=0.0, cache_modifier=".cg")
        p = tl.load(part_ptr + slot[:, None] * BLOCK_DV + dv[None, :], mask=here[:, None], other=0.0,
                    cache_modifier=".cg")
        new_top = tl.maximum(top, tl.max(m, axis=0))
        alpha = tl.exp(top - new_top)  # the first step: exp(-inf) = 0 times the zeros
        w = tl.exp(m - new_top)  # ranges past r1: 0
        total = total * alpha + tl.sum(t * w, axis=0)
        acc = acc * alpha + tl.sum(p * w[:, None], axis=0)
        top = new_top
    return acc / total


@triton.jit
def _decode_attention(q_ptr, k_ptr, v_ptr, pos_ptr, sink_ptr, out_ptr, part_ptr, stat_ptr, ticket_ptr, span, scale,
                      window, q_head_stride, k_row_stride, k_head_stride, v_row_stride, v_head_stride,
                      out_head_stride, DK, DV, GROUP: tl.constexpr, HAS_SINKS: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                      RANGE: tl.constexpr = 0, FOLD: tl.constexpr = 0, RING: tl.constexpr = False,
                      PDL: tl.constexpr = False):
    """Program (h, r): query head h; RANGE 0: all its keys, the result stored; else its keys [r *
    RANGE, (r + 1) * RANGE), its running max and sum stored in stat [2, H, R] and its weighted values
    in part [H, R, BLOCK_DV], and the head's last program to take its ticket adds the ranges holding
    keys in order (where they are depends on the position only, not on the span: an eager step over
    the whole cache and a static one over a bucket add the same ranges the same way). FOLD > 0: only
    the ranges holding keys run (the others return at once), one such range stores the result itself,
    and the fold loads FOLD ranges at a time (_fold_ranges); FOLD 0: step26's fold. RING (RANGE 0 or FOLD > 0): the
    span's rows are a ring (position p's row p % span), the keys reach the position and program r runs range
    range_program(r, r0, ...): the ranges of a cache of a row per position, the same bits."""
    pdl.start(PDL)  # first: pdl's rule
    h = tl.program_id(0)
    kvh = h // GROUP
    pos = tl.load(pos_ptr).to(tl.int32)
    if RING:
        hi = pos + 1  # keys [lo, hi) are visible
    else:
        hi = tl.minimum(pos + 1, span)
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    first = (lo // BLOCK_S) * BLOCK_S  # blocks of BLOCK_S keys from here hold a visible key each
    if RANGE > 0:
        r0 = first // RANGE  # the ranges [r0, r1) hold keys
        r1 = tl.cdiv(hi, RANGE)
    else:
        r0, r1 = 0, 1
    r = tl.program_id(1)
    if RING:
        r = range_program(r, r0, tl.num_programs(1))
    if FOLD > 0:
        if (r < r0) | (r >= r1):
            return  # no key here: neither stats nor a ticket
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + h * q_head_stride + dk, mask=dk < DK, other=0.0)
    if HAS_SINKS:
        m = tl.load(sink_ptr + h).to(tl.float32)  # exp(sink - m) = 1 in the sum
        total = tl.full([], 1.0, tl.float32)
    else:
        m = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
    start, end = first, hi
    if RANGE > 0:  # whole blocks a range (RANGE a multiple of BLOCK_S): the blocks of one walk
        start = tl.maximum(r * RANGE, first)
        end = tl.minimum((r + 1) * RANGE, hi)
        if HAS_SINKS:  # the sink joins the first range holding keys only
            here = r == r0
            m = tl.where(here, m, float("-inf"))
            total = tl.where(here, total, 0.0)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    m, total, acc = _attend_keys(q, k_ptr + kvh * k_head_stride, v_ptr + kvh * v_head_stride, k_row_stride,
                                 v_row_stride, dk, dv, DK, DV, lo, hi, start, end, scale, m, total, acc, span,
                                 BLOCK_S, RING)
    if FOLD > 0:
        finish_ranges(out_ptr, part_ptr, stat_ptr, ticket_ptr, h, m, total, acc, r0, r1, out_head_stride, DV,
                      BLOCK_DV, FOLD)
    elif RANGE == 0:  # this program's values are the head's
        tl.store(out_ptr + h * out_head_stride + dv, acc / total, mask=dv < DV)
    else:  # step26's fold: every program stores its stats and takes a ticket, the last adds them one at a time
        n_h, n_r = _store_range(part_ptr, stat_ptr, h, m, total, acc, BLOCK_DV)
        if tl.atomic_add(ticket_ptr + h, 1, sem="acq_rel") == n_r - 1:
            tl.debug_barrier()
            top = tl.full([], float("-inf"), tl.float32)
            for r in range(r0, r1):  # the ranges holding keys: finite maxima
                top = tl.maximum(top, tl.load(stat_ptr + h * n_r + r, cache_modifier=".cg"))
            total = tl.full([], 0.0, tl.float32)
            acc = tl.zeros([BLOCK_DV], tl.float32)
            for r in range(r0, r1):  # in order: the same bits every run
                w = tl.exp(tl.load(stat_ptr + h * n_r + r, cache_modifier=".cg") - top)
                total += tl.load(stat_ptr + n_h * n_r + h * n_r + r, cache_modifier=".cg") * w
                acc += tl.load(part_ptr + (h * n_r + r) * BLOCK_DV + dv, cache_modifier=".cg") * w
            tl.store(out_ptr + h * out_head_stride + dv, acc / total, mask=dv < DV)
            tl.store(ticket_ptr + h, 0)


@triton.jit
def range_program(r, r0, n_r):
    """The range program r of n_r runs where the ranges holding keys start at r0 (a ring's: any index; at most
    n_r of them): r0 + (r - r0) mod n_r, so range j's program, and its slot in the fold, is j % n_r (in a cache of a
    row per position: program r runs range r, or none)."""
    return r0 + (r + n_r - r0 % n_r) % n_r


@triton.jit
def _store_range(part_ptr, stat_ptr, h, m, total, acc, BLOCK_DV: tl.constexpr):
    """Program (h, r)'s range: its max and sum into stat [2, H, R], its weighted values into part [H, R, BLOCK_DV],
    every thread's stores done before the ticket that follows releases them → (H, R)."""
    n_h, n_r = tl.num_programs(0), tl.num_programs(1)
    slot = h * n_r + tl.program_id(1)
    tl.store(stat_ptr + slot, m)
    tl.store(stat_ptr + n_h * n_r + slot, total)
    tl.store(part_ptr + slot * BLOCK_DV + tl.arange(0, BLOCK_DV), acc)
    tl.debug_barrier()
    return n_h, n_r


@triton.jit
def finish_ranges(out_ptr, part_ptr, stat_ptr, ticket_ptr, h, m, total, acc, r0, r1, out_head_stride, DV,
                  BLOCK_DV: tl.constexpr, FOLD: tl.constexpr):
    """Program (h, r)'s running max m, sum total and weighted values acc over its range of keys ("auto"; the
    ranges [r0, r1) hold the head's keys, r among them): the head's output where one range holds them all (the
    fold's weight would be 1), else its stats [2, H, R] and values [H, R, BLOCK_DV] stored and the head's last
    program to take its ticket adds the ranges in order (_fold_ranges) and hands the ticket back."""
    dv = tl.arange(0, BLOCK_DV)
    if r1 - r0 == 1:
        tl.store(out_ptr + h * out_head_stride + dv, acc / total, mask=dv < DV)
    else:
        n_h, n_r = _store_range(part_ptr, stat_ptr, h, m, total, acc, BLOCK_DV)
        if tl.atomic_add(ticket_ptr + h, 1, sem="acq_rel") == r1 - r0 - 1:
            tl.debug_barrier()
            tl.store(out_ptr + h * out_head_stride + dv,
                     _fold_ranges(stat_ptr, part_ptr, h, n_h, n_r, r0, r1, BLOCK_DV, FOLD), mask=dv < DV)
            tl.store(ticket_ptr + h, 0)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     scale: float, window: int = 0, sinks: torch.Tensor | None = None, ring: int = 0) -> torch.Tensor:
    """q [1, H, Dk] float32, k [S, Hkv, Dk], v [S, Hkv, Dv] (views of the cache, float32 or float16; last dims
    contiguous), pos [1] the query's position on the device (< S) → [1, H, Dv] float32, as
    attend(q, k, v, scale, pos, window, sinks). ring: S where the rows are a sliding window's ring (layers/kv_cache:
    position p's row p % S, any position); a ring takes "auto"'s fold where "serial" is asked (step26's fold takes
    every range of the span by its index)."""
    _check(q, k, v, pos, sinks)
    if bad := ring_problem(ring, k, window):
        raise KernelArgumentError(f"could not run decode_attention over a ring of {ring} rows: {bad}")
    if SPLIT_RULE == "grouped" and grouped.fits(q, k, v):
        return grouped.grouped_attention(q, k, v, pos, scale, window, sinks, ring > 0)
    _, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    out = torch.empty(1, H, Dv, dtype=torch.float32, device=q.device)
    block_dk, block_dv = triton.next_power_of_2(Dk), triton.next_power_of_2(Dv)
    keys = key_range()
    fold = fold_ranges() or (FOLD_RANGES if ring else 0)
    if keys == 0:
        block_s, n_r = max(16, min(64, 8192 // max(block_dk, block_dv))), 1  # a [BLOCK_S, D] tile of ~8k values
        part = stat = ticket = out  # not read
    else:
        block_s, n_r = RANGE_BLOCK_S, triton.cdiv(S, keys)
        part = torch.empty(H, n_r, block_dv, dtype=torch.float32, device=q.device)
        stat = torch.empty(2, H, n_r, dtype=torch.float32, device=q.device)
        ticket = tickets(H, q.device)
    _decode_attention[(H, n_r)](
        q, k, v, pos, q if sinks is None else sinks, out, part, stat, ticket, S, scale, window,
        q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(1), Dk, Dv,
        GROUP=H // Hkv, HAS_SINKS=sinks is not None, BLOCK_S=block_s, BLOCK_DK=block_dk,
        BLOCK_DV=block_dv, RANGE=keys, FOLD=fold if keys else 0, RING=ring > 0, num_warps=4, **pdl.launch(q.device))
    return out


def _check(q, k, v, pos, sinks) -> None:
    bad = shape_problem(q, k, v, sinks, "1")
    if not bad and (pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64)):
        bad = "pos must be one integer position"
    if bad:
        raise KernelArgumentError(f"could not run decode_attention on q {list(q.shape)}, k {list(k.shape)}, "
                                  f"v {list(v.shape)}: {bad}")


def ring_problem(ring: int, k: torch.Tensor, window: int) -> str | None:
    """What is wrong with a ring of `ring` rows (0: none) for keys k [S, ...] and a sliding window (None: nothing)."""
    if ring and ring != k.shape[0]:
        return f"the keys have {k.shape[0]} rows"
    if ring and not 0 < window <= ring - RING_MARGIN:
        return f"it must hold the window ({window}) and {RING_MARGIN} rows more"
    return None


def shape_problem(q, k, v, sinks, rows: str) -> str | None:
    """What is wrong with an attention kernel's q [rows, H, Dk], k, v [S, Hkv, D] and sinks [H] (None: nothing);
    rows "1": one query row (the decode), "T": any (prefill_attention)."""
    if q.dim() != 3 or (rows == "1" and q.shape[0] != 1) or k.dim() != 3 or v.dim() != 3:
        return f"q must be [{rows}, H, Dk] and k, v [S, Hkv, D]"
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        return "k and v must share [S, Hkv], q and k their Dk, and H be a multiple of Hkv"
    if any(t.stride(-1) != 1 for t in (q, k, v)) or q.dtype != torch.float32 or k.dtype != v.dtype \
            or k.dtype not in CACHE_TYPES:
        return "q must be float32 and k, v both float32 or both float16, each with a contiguous last dim"
    if sinks is not None and (sinks.shape != (q.shape[1],) or sinks.dtype != torch.float32):
        return "sinks must be float32 [H]"
    return None
