"""Decode attention with a program per (KV head, range of keys) over all the query heads that read
that KV head (GQA), float32: decode_attention's "grouped" rule (session 29, the default).

MLA (session 31): DeepSeek V2/V3, Kimi K2 and GLM-5 attend as MQA over one latent row a position (layers/mla.py:
512 latent columns, then 64 rope columns), every query head over the same rows, and the values are the latent
columns themselves (a view of the keys, `shares_keys`). "auto" read each row once per query head: 128 times
under V3. Here a program loads a [BLOCK_S, 512] latent tile once for both products and the rope columns as a
[BLOCK_S, 64] tile of their own (SHARED). Over float16 latent rows only: over float32 ones the [16, 512] tf32x3
products spilled and lost to "auto" (561 against 477 us at 8000 positions), so those keep "auto". H200, 128 query
heads, us a call, auto over float32 rows / this over float16 (session 31 call 5; calls.md): 19.7 / 10.2 at 136
positions, 69.2 / 14.0 at 1000, 477.0 / 49.3 at 8000; call 4: 1872.1 / 171.7 at 32000.

Float16 cache rows (--kv-type f16, session 30) go to the tensor cores as loaded, against q (times the scale)
and the weights p each split into two float16 parts (hi, and lo = the rest): every product of a part and a row
is exact and the sums float32, so the error stays float32's over the rounded rows. Widening the tiles to
float32 for the tf32x3 products instead was slower than float32 rows from 4000 positions (26.9 against 21.0
us at 8000, 79.1 against 52.9 at 32000, session 30 call 1), likely (not profiled) as the widened copy kept
the loads out of the loop's software pipeline: where a program's range is one tile (2000 positions) it was
faster (10.6 against 11.6 us).

Why: decode_attention "auto" runs a program per (query head, 64 keys), so under GQA every key and
value row is read once per query head of its group (8 times in Qwen3-30B-A3B's 32 over 4), from the
L2 at best: 16 us a layer at 2000 positions, 56 at 8000 and 114 at 16000 on the H200, where the 32 MB
of float32 KV rows a layer at 8000 take ~8 us at copy speed. Here a program loads each key and value
tile once, both at once, and multiplies it with the group's query rows as matrices: the [BLOCK_H, D]
query block against the [BLOCK_S, D] keys, then the [BLOCK_H, BLOCK_S] weights against the values,
BLOCK_H = 16 query heads a block (tl.dot's least M; a group of 8 leaves half the rows empty, never
stored). tl.dot in "tf32x3" (three TF32 tensor-core products: float32's error, 5-7e-7 against float64
where auto has 2e-7; "ieee", float32 on the CUDA cores, took 2-4x as long: compute-bound).

The ranges: the visible keys' blocks of BLOCK_S are cut into at most range_count ranges of whole blocks
(RANGES, more where few head blocks leave fewer than PROGRAMS programs: MLA with 16 heads runs 128), the same
count at every span, so a range's keys depend on the position only (an eager step over the
whole cache and a static one over a bucket add the same ranges the same way, the same bits). Each range
stores its rows' running max, sum and weighted values (online softmax); where one range holds all the
keys it stores the output itself. Else a second launch adds the ranges, a program per query head, in
order. The fold inside the first launch (its block's last program to take a ticket, as "auto" does) took
~40 us more at 2000 positions, likely its [FOLD, 16, D] tiles' registers weighing on the whole kernel (not
profiled).

A sliding-window layer's rows are a ring (layers/kv_cache.py, RING): position p's row is p % span, the keys reach
the position (no span bound) and its ranges are those of a cache of a row per position, the same bits.

H200 (session 29, docs/runs/2026-12-04-s29/calls.md call 3; 32 query heads over 4 KV heads of 128, us a call,
auto / grouped): 2.5 / 5.6 at position 8, 10.6 / 8.7 at 136, 16.0 / 8.6 at 1000, 15.9 / 11.7 at 2000, 56.3 /
20.5 at 8000, 112.6 / 31.7 at 16000, 219.1 / 53.4 at 32000. 64 or 128 ranges were slower from 4000 positions
(call 2: 27-48 us at 8000-16000), 16 too (call 3).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl

RANGES = 32  # least ranges a head block, a power of two (4 KV heads: 128 programs, about one per SM of the H200)
PROGRAMS = 128  # and more where fewer head blocks leave fewer programs (one: 128 ranges); see range_count
BLOCK_H = 16  # query heads a program: tl.dot's least M
TILE_VALUES = 8192  # a [BLOCK_S, D] key or value tile's values: 64 keys at 128 wide
# the most values in the fold's [N_R, columns] tile a program, whose columns then split over more programs: MLA
# with one head block (DeepSeek V2-Lite's 16 heads: 128 ranges of 512 values) in one tile (64k values at 4 warps)
# took 40.6 us at 8000 positions, 18.2 in four (session 31 calls 2 and 5); a 4096 cap split V3's [32, 512] tiles
# too and cost 3-4 us (call 5: 13.3 against 10.2 us at 136 positions, 52.9 against 49.3 at 8000)
FOLD_VALUES = 16384
MAX_WIDTH = 256  # widest key or value head; wider ones run "auto"
MAX_SHARED, MAX_TAIL = 512, 128  # MLA: widest values read inside the keys (the latent) and rest of a key (rope)


def range_count(n_b: int) -> int:
    """Ranges a head block at n_b head blocks: a power of two fixed by the shape, not the span, so the position alone
    sets each range's keys (an eager step's bits are the static step's)."""
    return max(RANGES, triton.next_power_of_2(max(1, PROGRAMS // n_b)))


def shares_keys(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the values are the keys' first columns (MLA's latent rows): one load serves both."""
    return v.data_ptr() == k.data_ptr() and v.stride() == k.stride() and v.shape[-1] < k.shape[-1]


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the grouped kernel takes these rows (else decode_attention runs "auto"): heads up to MAX_WIDTH wide,
    or MLA's float16 latent rows (over float32 ones its [16, 512] tf32x3 products spilled and lost to "auto": 561
    against 477 us at 8000 positions, session 31 call 1)."""
    if shares_keys(k, v):
        return v.shape[-1] <= MAX_SHARED and k.shape[-1] - v.shape[-1] <= MAX_TAIL and k.dtype == torch.float16
    return max(q.shape[-1], v.shape[-1]) <= MAX_WIDTH


@triton.jit
def _ranges(pos_ptr, span, window, BLOCK_S: tl.constexpr, N_R: tl.constexpr, RING: tl.constexpr):
    """(lo, hi, first, per, used): keys [lo, hi) are visible; their blocks of BLOCK_S from `first` on, `per`
    blocks a range, in ranges [0, used). RING: the span's rows are a ring, every key up to the position kept."""
    pos = tl.load(pos_ptr).to(tl.int32)
    if RING:
        hi = pos + 1
    else:
        hi = tl.minimum(pos + 1, span)
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    first = (lo // BLOCK_S) * BLOCK_S  # blocks of BLOCK_S keys from here hold a visible key each
    blocks = tl.cdiv(hi - first, BLOCK_S)
    per = tl.cdiv(blocks, N_R)
    return lo, hi, first, per, tl.cdiv(blocks, per)


@triton.jit
def _halves(x):
    """x (float32) as two float16 parts, hi + lo (22 bits): their products with a float16 row are exact."""
    hi = x.to(tl.float16)
    return hi, (x - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def _scores(q_hi, q_lo, k, acc, HALF: tl.constexpr):
    """acc (None: 0) + the [BLOCK_H, D] query block times the [BLOCK_S, D] tile k transposed: float32 rows in
    tf32x3 (q_hi is q), float16 rows against q's two float16 parts (q·scale = q_hi + q_lo)."""
    if HALF:
        s = tl.dot(q_lo, tl.trans(k), acc=tl.dot(q_hi, tl.trans(k), acc=acc))
    else:
        s = tl.dot(q_hi, tl.trans(k), acc=acc, input_precision="tf32x3")
    return s


@triton.jit
def _query(query_ptr, heads, real, q_head_stride, first, width, scale, BLOCK: tl.constexpr, HALF: tl.constexpr):
    """Columns [first, first + width) of the block's query rows as _scores takes them: (q, q) for float32 rows
    (scaled after the product), q·scale's two float16 parts for float16 rows."""
    d = tl.arange(0, BLOCK)
    q = tl.load(query_ptr + heads[:, None] * q_head_stride + first + d[None, :],
                mask=real[:, None] & (d < width)[None, :], other=0.0)
    if HALF:
        q_hi, q_lo = _halves(q * scale)
    else:
        q_hi, q_lo = q, q
    return q_hi, q_lo


@triton.jit
def _grouped_attention(query_ptr, k_ptr, v_ptr, pos_ptr, sink_ptr, out_ptr, part_ptr, stat_ptr, span, scale,
                       window, q_head_stride, k_row_stride, k_head_stride, v_row_stride, v_head_stride,
                       out_head_stride, DK, DV, GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
                       HAS_SINKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DK: tl.constexpr,
                       BLOCK_DV: tl.constexpr, N_R: tl.constexpr, HALF: tl.constexpr, SHARED: tl.constexpr,
                       BLOCK_DT: tl.constexpr, RING: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program (b, r): head block b (KV head b // HEAD_BLOCKS, its query heads from (b % HEAD_BLOCKS) *
    BLOCK_H on), range r of its visible keys. Its running max and sum go to stat [2, B, N_R, BLOCK_H], its
    weighted values to part [B, N_R, BLOCK_H, BLOCK_DV], for _grouped_attention_fold. HALF: float16 cache rows.
    SHARED (MLA): the values are the keys' first DV columns, loaded once for both, and the keys' other DK - DV
    columns (the rope dims) a tile of BLOCK_DT of their own."""
    pdl.start(PDL)  # first: pdl's rule
    b, r = tl.program_id(0), tl.program_id(1)
    lo, hi, first, per, used = _ranges(pos_ptr, span, window, BLOCK_S, N_R, RING)
    if r >= used:
        return  # no key here
    kvh = b // HEAD_BLOCKS
    g = (b % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)  # the block's heads within the group
    real = g < GROUP
    heads = kvh * GROUP + g
    start = first + r * per * BLOCK_S
    end = tl.minimum(start + per * BLOCK_S, hi)
    dv = tl.arange(0, BLOCK_DV)
    if SHARED:
        q_hi, q_lo = _query(query_ptr, heads, real, q_head_stride, 0, DV, scale, BLOCK_DV, HALF)
        qt_hi, qt_lo = _query(query_ptr, heads, real, q_head_stride, DV, DK - DV, scale, BLOCK_DT, HALF)
    else:
        q_hi, q_lo = _query(query_ptr, heads, real, q_head_stride, 0, DK, scale, BLOCK_DK, HALF)
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
        if RING:
            rows = rows % span  # (the positions' ring rows; seen stays the positions')
        v = tl.load(v_base + rows[:, None].to(tl.int64) * v_row_stride + dv[None, :],  # with the keys: one wait
                    mask=seen[:, None] & (dv < DV)[None, :], other=0.0)
        # (float16 rows: each product exact, summed in float32; a float32 copy of the tiles broke the loads' pipeline)
        if SHARED:  # MLA: the latent tile v is the keys' first columns; the rope columns are a tile of their own
            dt = tl.arange(0, BLOCK_DT)
            tail = tl.load(k_base + rows[:, None].to(tl.int64) * k_row_stride + DV + dt[None, :],
                           mask=seen[:, None] & (dt < DK - DV)[None, :], other=0.0)
            s = _scores(q_hi, q_lo, v, _scores(qt_hi, qt_lo, tail, None, HALF), HALF)  # [BLOCK_H, BLOCK_S]
        else:
            dk = tl.arange(0, BLOCK_DK)
            k = tl.load(k_base + rows[:, None].to(tl.int64) * k_row_stride + dk[None, :],
                        mask=seen[:, None] & (dk < DK)[None, :], other=0.0)
            s = _scores(q_hi, q_lo, k, None, HALF)
        if not HALF:
            s = s * scale
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block holds a visible key
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if HALF:  # p in [0, 1] in two float16 parts too
            p_hi, p_lo = _halves(p)
            pv = tl.dot(p_lo, v, acc=tl.dot(p_hi, v))
        else:
            pv = tl.dot(p, v, input_precision="tf32x3")
        acc = acc * alpha[:, None] + pv
        m = m_new
    if used == 1:  # this range holds the keys: its values are the output (_grouped_attention_fold returns at once)
        tl.store(out_ptr + heads[:, None] * out_head_stride + dv[None, :], acc / total[:, None],
                 mask=real[:, None] & (dv < DV)[None, :])
    else:
        hh = tl.arange(0, BLOCK_H)
        slot = b * N_R + r
        tl.store(stat_ptr + slot * BLOCK_H + hh, m)
        tl.store(stat_ptr + (tl.num_programs(0) * N_R + slot) * BLOCK_H + hh, total)
        tl.store(part_ptr + (slot * BLOCK_H + hh[:, None]) * BLOCK_DV + dv[None, :], acc)


@triton.jit
def _grouped_attention_fold(pos_ptr, out_ptr, part_ptr, stat_ptr, span, window, n_b, out_head_stride, DV,
                            GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, N_R: tl.constexpr, FOLD_DV: tl.constexpr,
                            RING: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program (h, c): query head h's ranges added in order → its output's columns [c FOLD_DV, (c + 1) FOLD_DV)
    (nothing where one range held the keys; each column's sum is its own: the same bits at any FOLD_DV)."""
    pdl.start(PDL)  # first: pdl's rule
    h, c = tl.program_id(0), tl.program_id(1)
    _, _, _, _, used = _ranges(pos_ptr, span, window, BLOCK_S, N_R, RING)
    if used == 1:
        return
    g = h % GROUP
    b = (h // GROUP) * HEAD_BLOCKS + g // BLOCK_H
    rr = tl.arange(0, N_R)
    here = rr < used
    slots = (b * N_R + rr) * BLOCK_H + g % BLOCK_H
    m = tl.load(stat_ptr + slots, mask=here, other=float("-inf"))
    w = tl.exp(m - tl.max(m, axis=0))  # ranges past `used`: 0
    total = tl.sum(tl.load(stat_ptr + n_b * N_R * BLOCK_H + slots, mask=here, other=0.0) * w, axis=0)
    dv = c * FOLD_DV + tl.arange(0, FOLD_DV)
    part = tl.load(part_ptr + slots[:, None] * BLOCK_DV + dv[None, :], mask=here[:, None], other=0.0)
    tl.store(out_ptr + h * out_head_stride + dv, tl.sum(part * w[:, None], axis=0) / total, mask=dv < DV)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, scale: float,
                      window: int, sinks: torch.Tensor | None, ring: bool = False) -> torch.Tensor:
    """decode_attention's arguments (checked there; widths that fit()) → [1, H, Dv] float32."""
    _, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    group = H // Hkv
    head_blocks = triton.cdiv(group, BLOCK_H)
    n_b = Hkv * head_blocks
    shared = shares_keys(k, v)
    block_dv = max(16, triton.next_power_of_2(Dv))  # tl.dot's least
    block_dk = block_dv if shared else max(16, triton.next_power_of_2(Dk))  # the keys' tile: the values' if shared
    block_s = max(16, min(64, TILE_VALUES // max(block_dk, block_dv)))
    out = torch.empty(1, H, Dv, dtype=torch.float32, device=q.device)
    n_r = range_count(n_b)
    part = torch.empty(n_b, n_r, BLOCK_H, block_dv, dtype=torch.float32, device=q.device)
    stat = torch.empty(2, n_b, n_r, BLOCK_H, dtype=torch.float32, device=q.device)
    shape = dict(GROUP=group, HEAD_BLOCKS=head_blocks, BLOCK_H=BLOCK_H, BLOCK_S=block_s, BLOCK_DV=block_dv, N_R=n_r,
                 RING=ring, num_warps=4)
    _grouped_attention[(n_b, n_r)](
        q, k, v, pos, q if sinks is None else sinks, out, part, stat, S, scale, window, q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), out.stride(1), Dk, Dv, HAS_SINKS=sinks is not None,
        BLOCK_DK=block_dk, HALF=k.dtype == torch.float16, SHARED=shared,
        BLOCK_DT=max(16, triton.next_power_of_2(Dk - Dv)) if shared else 16, **shape, **pdl.launch(q.device))
    fold_dv = max(16, min(block_dv, FOLD_VALUES // n_r))
    _grouped_attention_fold[(H, block_dv // fold_dv)](pos, out, part, stat, S, window, n_b, out.stride(1), Dv, **shape,
                                                      FOLD_DV=fold_dv, **pdl.launch(q.device))
    return out
