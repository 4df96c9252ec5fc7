"""Dequantize-and-multiply straight from GGUF blocks: the GEMV for decode (the prefill GEMMs are prefill_gemm.py).

Weights stay raw GGUF bytes ([rows, cols] in torch order, rows one after another); each program
dequantizes a tile of rows one 256-value group at a time in registers, so no dequantized copy
of a weight ever exists in memory. The quant family is a compile-time argument (its `dot`, or its
`dequant` then a multiply).

GEMV work split: a program owns BLOCK_N rows and one of SPLIT contiguous ranges of groups along
the row (split-K). The SPLIT partial sums go to a [SPLIT, rows] buffer; the program of a row tile
that finishes last (a ticket per tile, fold_part) adds them in range order into y, in the same
launch, so y is the same bits on every run (GemvConfig.fold="torch": one torch.sum launch after
the kernel instead, the way of session 3; GemvConfig.atomic: adds in arrival order, the way before
session 3, kept to time against). UNROLL groups are issued per
loop step so more loads are in flight before the first is used; STAGES asks Triton's pipeliner for that many stages.

Families with an integer step (Family.idot: Q8_0, Q4_K, Q6_K, IQ4_XS, Q4_0 and the resident layouts made from
them; IQ2_XXS, IQ3_XXS, IQ2_XS and IQ1_S) take x quantized once per call on the
GPU (act_quant) to the int8 blocks llama.cpp multiplies in, and run row_idot: dp4a on 32-bit words, a float step per
block. Others multiply floats (x rounded by the caller's round_x).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import act_quant, dispatch, grids, pdl, q4_k_tiled
from sparkd.engine.kernels.row_tiles import row_sums

# enough programs to keep every SM of a large GPU busy with a few resident programs each
TARGET_PROGRAMS = 2048
FOLDS = ("kernel", "torch")
FOLD_ENV = "SPARKD_GEMV_FOLD"  # GemvConfig.fold's default, read once: "torch" falls back without a code change
RANGE_GROUPS = 4  # groups (256 values each) per split-K range: 1024 values of a row per program
# split_for's rule when a tile leaves the split to the shape: "wave" (session 6) caps session 5's
# split at one wave of resident programs; "old" is session 5's
SPLIT_ENV = "SPARKD_GEMV_SPLIT"
SPLIT_RULES = ("wave", "old")
SPLIT_RULE = switches.choice(SPLIT_ENV, SPLIT_RULES, "wave")
# Hopper's most resident blocks per SM: a one-warp program at <= 64 registers (every default
# tile) reaches it, so a wave is 32 one-warp programs per SM
PROGRAMS_PER_SM = 32
DEFAULT_SMS = 132  # H200 / H100 SXM: the stand-in off CUDA (the interpreter)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 4  # rows per program
    num_warps: int = 1  # one warp: every reduction stays inside it (H200 sweep, docs/performance.md)
    unroll: int = 2  # groups issued per loop step
    split: int = 0  # ranges along the row (split-K); 0: chosen from the shape
    elementwise: bool = True  # accumulate a tile, reduce once at the end (False: every group)
    dp4a: bool = True  # integer families: the dp4a instruction (False: emulate it, as the interpreter does)
    atomic: bool = False  # partial sums (split-K, MoE experts) meet by atomic adds: last bits vary run to run
    stages: int = 0  # software-pipelining stages of the group loop (tl.range num_stages); 0: Triton's default
    whole_unroll: int = 0  # groups per loop step where a program's range is the whole row (split 1); 0: unroll
    fuse_quant: bool = False  # MoE gate/up tile: quantize h for an integer down in the same launch
    # split-K of 2, 4 or 8 ranges as the warps of one program, their sums added in the program in fold_part's order
    # (Family.kstep; no partials, no ticket); other splits, a family without kstep, or parts: the split-K launch
    warps_k: bool = False
    # split-K partials summed by the last program of a row tile (fold_part); "torch": a torch.sum launch
    fold: str = switches.choice(FOLD_ENV, FOLDS, "kernel")


# the integer families' tiles, best of the session-4 H200 run at the engine's decode shapes
# (bench/gemv_tiles_bench.py, bench/results/gemv_tiles_h200_s4.log): 2 rows per 1-warp program,
# 4 groups issued per loop step into the elementwise tile (no barrier or shuffle in the loop, 16
# words in flight per thread); the packed Q8_0 layout without split-K (no fold at these shapes).
# Q4_K (kern6): 4 rows per 1-warp program, one 128-bit word of qs per thread and group, x loaded
# in the words' shape (no layout conversion through shared memory; bench/kernels_sass.py).
# Q4_K_TILED (session 5, q4k8): kern6's tile on the tiled layout (kernels/q4_k_tiled.py; H200:
# head 0.63 -> 0.68 of copy bandwidth, bench/results/gemv_tiles_h200_s5_q4k.log).
# Session 6 (q4k10): the packed Q8_0 tile keeps split 1 (ranges by the wave rule were 1.3-1.9 us
# slower at 2048x4096 and 4096x2048 on the H200, bench/results/gemv_tiles_h200_s6.log).
# OLD_GEMV_TILES: session 3's, to time against or fall back to (config=OLD_GEMV_TILES[name]).
# Session 8 (q4k17): the tiled Q4_K tile steps 2 groups at a time where the split is 1 (14336x4096, the head; H200
# 11.3 -> 10.8 and 49.0 -> 47.9 us, the same bits; 2 a step was slower at the split shapes, where 4 stays:
# bench/results/q4k17_h200_s8.log); $SPARKD_GEMV_WHOLE_UNROLL=off keeps unroll everywhere (session 7's steps)
WHOLE_UNROLL_ENV = "SPARKD_GEMV_WHOLE_UNROLL"
WHOLE_UNROLL = switches.flag(WHOLE_UNROLL_ENV, True)
# Session 12 (q4k20): the tiled Q4_K's split-K ranges on the warps of one program (GemvConfig.warps_k, the same
# bits: no fold through memory). H200, x quantized before, PDL off (bench/results/q4k20_h200_s12_call2_gemv.log):
# 4096x14336 11.4 -> 10.8 us, 6144x4096 7.0 -> 6.0, 4096x2048 4.4 -> 3.4, 5120x2048 4.7 -> 3.6 (the split-K launch
# without its fold: 10.5 / 5.9 / 3.4 / 3.8); $SPARKD_GEMV_WARPS_K=off: the split-K launch with fold_part (session 8's)
# q4k21: the ranges added after one exchange (q4_k_pair.kstep's tl.split): 4096x14336 10.0-10.1 us (0.77-0.79 of the
# 2 GiB copy), 6144x4096 5.9, 4096x2048 3.3, 5120x2048 3.6 (bench/results/q4k21_h200_s12_gemv*.log)
WARPS_K_ENV = "SPARKD_GEMV_WARPS_K"
WARPS_K = switches.flag(WARPS_K_ENV, True)
KSTEP_WARPS = (2, 4, 8)  # the splits warps_k runs as one program's warps
# the warps_k launch's registers per thread: left to ptxas, a program of 128 threads gets 40 and a group's header
# loads come after its dp4a (a second memory round trip per step: H200 4096x14336 14.3 us against the split-K
# launch's 11.4); at 64 (the one-warp programs' own) all 14 loads of a 2-group step lead (bench/kernels_sass.py)
KSTEP_MAXNREG = 64
GEMV_TILES = {"Q8_0": GemvConfig(block_n=2, num_warps=1, unroll=4, elementwise=True),
              "Q8_0_PACKED": GemvConfig(block_n=2, num_warps=1, unroll=4, split=1, elementwise=True),
              "Q4_K": GemvConfig(block_n=4, num_warps=1, unroll=4, elementwise=True),
              # (q4k19: the pairx step 2 groups a step at every split, bench/results/q4k19_h200_s8.log)
              "Q4_K_TILED": GemvConfig(block_n=4, num_warps=1, unroll=2 if q4_k_tiled.LOADS == "pairx" else 4,
                                       elementwise=True,
                                       whole_unroll=2 if WHOLE_UNROLL else 0, warps_k=WARPS_K),
              "Q6_K": GemvConfig(block_n=2, num_warps=1, unroll=4, elementwise=True),  # best of 5 (q6k_h200_s5)
              # session 6 (q6k9): one 8-row tile of kernels/q6_k_tiled.py per 1-warp program, a group per
              # step (best of 4 at the head, bench/results/gemv_tiles_h200_s6_q6k.log: 0.94 of copy bandwidth)
              "Q6_K_TILED": GemvConfig(block_n=8, num_warps=1, unroll=1, elementwise=True),
              # session 36 (bench/gpu_box/half_gemv_sweep.py, H200): one row a warp, 4 groups a step, best of 10 at
              # 14336x4096 / 4096x14336 / gpt-oss's head 201088x2880: 0.66 / 0.63 / 0.71 of copy bandwidth (4r1w2u
              # 0.56 / 0.60 / 0.66; cuBLAS's torch.mv on the 16-bit matrix 0.91 / 0.87 / 0.98). Session 41: those
              # weights loaded 16 bits at a time (half._load); as 128-bit loads, H100, the same sweep: 0.98 / 0.95 /
              # 1.04 (torch.mv 0.93 / 0.88 / 0.96); 1r1w8u within 2 %, slower at 2880x2880
              "F16": GemvConfig(block_n=1, num_warps=1, unroll=4, elementwise=True),
              "BF16": GemvConfig(block_n=1, num_warps=1, unroll=4, elementwise=True)}
# a grouped launch's tile where the rows are one 256-value group or less (MLA's k matrices, 128 wide:
# KernelLinear.grouped on CUDA). Session 35 (H200, bench/gpu_box/mla_heads_bench.py --sweep, DeepSeek V3's 128 heads
# x 512 x 128): the default tiles' programs read a few hundred bytes each; 16 rows on 2 warps, Q5_0 21.0 -> 7.6 us,
# Q8_0 41.0 -> 9.9 us
SHORT_ROW_TILE = GemvConfig(block_n=16, num_warps=2, unroll=1, split=1)
SHORT_ROW_VALUES = 256
OLD_GEMV_TILES = {"Q8_0": GemvConfig(elementwise=False), "Q8_0_PACKED": GemvConfig(elementwise=False),
                  "Q4_K": GemvConfig(block_n=64, num_warps=4, unroll=1, elementwise=False)}


def default_config(fam: dispatch.Family) -> GemvConfig:
    return GEMV_TILES.get(fam.qtype.name, GemvConfig())


def emulate(cfg: GemvConfig, x: torch.Tensor) -> bool:
    """Whether the integer kernels emulate dp4a: always off CUDA (the interpreter has no PTX)."""
    return not (cfg.dp4a and x.is_cuda)


def stages_arg(cfg: GemvConfig) -> int | None:
    """The group loop's num_stages: None leaves it to Triton."""
    return cfg.stages or None


def split_for(cfg: GemvConfig, rows: int, groups: int, device: torch.device | str | None = None,
              rule: str | None = None) -> int:
    """The configured split, else session 5's rule ("old"): none when the matrix alone has
    TARGET_PROGRAMS row tiles (the output head), else ranges of RANGE_GROUPS groups; rule "wave"
    (SPLIT_RULE's default) then takes as few ranges as keep the grid within one wave of resident
    programs (the GPU of `device`, else DEFAULT_SMS): H200, tiled Q4_K 4096x14336 14 -> 4 ranges
    17.4 -> 15.2 us, 6144x4096 4 -> 2 9.7 -> 8.1 us, the best split tried at every shape
    (bench/results/gemv_tiles_h200_s6.log). Either way the split only shrinks as the row count
    grows, and rows enter only through the threshold and the cap, so a stack (fused QKV) whose
    parts all get the same split sums every row as the parts alone do (KernelLinear checks). On
    the Q8_0 tile the old rule is the split of the session-3 rule for q and o of a Qwen3-30B-A3B.
    Session 11 (pdl12): ranges of 8 groups ("wave2") lost the 12-layer Q4_K decode (0.988): split 1 paid at
    4096x2048 only, 2 at 4096x4096, the wave rule's at the model's 5120x2048 and 2048x4096."""
    if cfg.split:
        return max(1, min(cfg.split, groups))
    tiles = triton.cdiv(rows, cfg.block_n)
    split = 1 if tiles >= TARGET_PROGRAMS else triton.cdiv(groups, RANGE_GROUPS)
    rule = rule or SPLIT_RULE
    if rule not in SPLIT_RULES:
        raise dispatch.KernelArgumentError(f"could not choose the GEMV's split: rule {rule!r} is not one of "
                                           f"{SPLIT_RULES}")
    if rule == "old":
        return split
    return max(1, min(split, wave_programs(cfg.num_warps, device) // tiles))


def wave_programs(num_warps: int, device: torch.device | str | None = None) -> int:
    """Programs of num_warps warps that the GPU holds at once (PROGRAMS_PER_SM per SM for one warp)."""
    sms = DEFAULT_SMS
    if device is not None and torch.device(device).type == "cuda":
        sms = _sm_count(torch.device(device).index)
    return sms * PROGRAMS_PER_SM // max(1, num_warps)


_SMS: dict[int | None, int] = {}


def _sm_count(index: int | None) -> int:
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(
            torch.cuda.current_device() if index is None else index).multi_processor_count
    return _SMS[index]


@triton.jit
def dot_from_dequant(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, DEQ: tl.constexpr, NSUB: tl.constexpr,
                     SUBLEN: tl.constexpr):
    """A family's dot through its dequant: float32 [BN] for group g."""
    s = tl.arange(0, NSUB)[None, :, None]
    i = tl.arange(0, SUBLEN)[None, None, :]
    k0 = g * (NSUB * SUBLEN) + s * SUBLEN  # [1, NSUB, 1] first column of each sub-block
    kmask = k0 < K
    w = DEQ(w_ptr, aux_ptr, row_off[:, None, None], g, rmask[:, None, None] & kmask)
    x = tl.load(x_ptr + k0 + i, mask=kmask & (i < SUBLEN), other=0.0)
    return tl.sum(tl.sum(w * x, 2), 1)


@triton.jit
def row_dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, K, part, n_parts, DOT: tl.constexpr, ACC0: tl.constexpr,
            TOTAL: tl.constexpr, DEQ: tl.constexpr, USE_DEQ: tl.constexpr, NSUB: tl.constexpr,
            SUBLEN: tl.constexpr, UNROLL: tl.constexpr, EW: tl.constexpr, STAGES: tl.constexpr):
    """sum_k W[row, k] * x[k] over range `part` of `n_parts` of the row's groups: float32 [BN].
    The family's code (family_args): its DOT/ACC0/TOTAL, or DEQ when it has no dot (USE_DEQ);
    aux_ptr its codebook (grids.grid_table)."""
    n_groups = tl.cdiv(K, NSUB * SUBLEN)
    per = tl.cdiv(n_groups, n_parts)
    start = part * per
    end = tl.minimum(start + per, n_groups)
    if USE_DEQ:
        acc = tl.zeros(rmask.shape, tl.float32)
    else:
        acc = ACC0(rmask, EW)
    for g0 in tl.range(start, end, UNROLL, num_stages=STAGES):
        for u in tl.static_range(UNROLL):
            g = g0 + u
            gc = tl.minimum(g, end - 1)  # past the end: read a valid group, masked out
            m = rmask & (tl.zeros(rmask.shape, tl.int32) + g < end)  # (a scalar mask breaks the interpreter)
            if USE_DEQ:
                acc += dot_from_dequant(w_ptr, aux_ptr, row_off, m, x_ptr, gc, K, DEQ, NSUB, SUBLEN)
            else:
                acc = DOT(w_ptr, aux_ptr, row_off, m, x_ptr, gc, K, acc, EW)
    if not USE_DEQ:
        acc = TOTAL(acc, EW)
    return acc


@triton.jit
def row_idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, K, part, n_parts, IDOT: tl.constexpr,
             A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, UNROLL: tl.constexpr, EW: tl.constexpr,
             EMU: tl.constexpr, STAGES: tl.constexpr):
    """row_dot for a family's integer step on quantized x (act_quant.QuantX): float32 [BN]; aux_ptr its
    codebook as int8 words (grids.grid_words)."""
    n_groups = tl.cdiv(K, 256)
    per = tl.cdiv(n_groups, n_parts)
    start = part * per
    end = tl.minimum(start + per, n_groups)
    if EW:
        acc = tl.zeros((rmask.shape[0], A1, A2), tl.float32)  # the family's tile (Family.iacc)
    else:
        acc = tl.zeros(rmask.shape, tl.float32)
    for g0 in tl.range(start, end, UNROLL, num_stages=STAGES):
        for u in tl.static_range(UNROLL):
            g = g0 + u
            gc = tl.minimum(g, end - 1)  # past the end: read a valid group, masked out
            m = rmask & (tl.zeros(rmask.shape, tl.int32) + g < end)
            acc = IDOT(w_ptr, aux_ptr, row_off, m, xw_ptr, xd_ptr, xs_ptr, gc, K, acc, EW, EMU)
    if EW:
        acc = row_sums(acc, A1, A2, A3)
    return acc


@triton.jit
def store_part(y_ptr, rows, rmask, acc, N, SPLIT: tl.constexpr, ATOMIC: tl.constexpr):
    """A program's sums for its rows: straight into y (SPLIT 1), added to y in arrival order
    (ATOMIC), or into row part of the [SPLIT, N] partials buffer y_ptr (summed in order later)."""
    if SPLIT == 1:
        tl.store(y_ptr + rows, acc, mask=rmask)
    elif ATOMIC:
        tl.atomic_add(y_ptr + rows, acc, mask=rmask, sem="relaxed")
    else:
        tl.store(y_ptr + tl.program_id(1) * N + rows, acc, mask=rmask)


@triton.jit
def fold_part(y_ptr, part_ptr, tickets_ptr, tile, part, rows, rmask, acc, N, SPLIT: tl.constexpr,
              res_ptr=None, RES: tl.constexpr = False):
    """Split-K without a fold launch: store this program's sums as row `part` of the [SPLIT, N]
    partials; the program of row tile `tile` that finishes last (tickets_ptr[tile], int32, zero
    before the launch) adds the SPLIT rows in order 0..SPLIT-1 (from 0.0, as torch.sum does for
    SPLIT <= 4) into y, then the residual res_ptr[rows] if RES, and sets the ticket back to 0 for
    the next launch. The same bits whatever the arrival order; no sum is atomic, only the ticket."""
    tl.store(part_ptr + part * N + rows, acc, mask=rmask)
    tl.debug_barrier()  # every thread's stores are issued before the ticket (acq_rel) publishes them
    ticket = tl.atomic_add(tickets_ptr + tile, 1, sem="acq_rel")
    if ticket == SPLIT - 1:
        total = tl.zeros(acc.shape, tl.float32)
        for s in tl.static_range(SPLIT):
            # .cg: the other programs' stores from L2, never an L1 line (ptxas refuses .cg with volatile)
            total += tl.load(part_ptr + s * N + rows, mask=rmask, other=0.0, cache_modifier=".cg")
        if RES:
            total = total + tl.load(res_ptr + rows, mask=rmask)
        tl.store(y_ptr + rows, total, mask=rmask)
        tl.store(tickets_ptr + tile, 0)


@triton.jit
def fold_pair(y_ptr, slots_ptr, part, rows, rmask, acc, res_ptr=None, RES: tl.constexpr = False):
    """fold_part for SPLIT 2 in one atomic round trip (session 21, moe48): each program exchanges (1 << 32 | its sums'
    bits) into its rows' int64 slots (zero before the launch); the one that gets a non-zero word back holds the other
    part and leaves y = (0.0 + part 0) + part 1 (+ the residual), fold_part's bits, and the slots zero again. No fence:
    the sums travel in the atomic itself (one location each), where fold_part stores them, fences, takes a ticket and
    reads them back."""
    if RES:  # before the exchange, so its round trip is not a second one after it
        res = tl.load(res_ptr + rows, mask=rmask, other=0.0)
    mine = (acc.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (1 << 32)
    old = tl.atomic_xchg(slots_ptr + rows, mine, mask=rmask, sem="relaxed")
    other = (old & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    second = (old >> 32) != 0
    zero = tl.zeros(acc.shape, tl.float32)
    total = (zero + tl.where(part == 0, acc, other)) + tl.where(part == 0, other, acc)
    if RES:
        total = total + res
    tl.store(y_ptr + rows, total, mask=rmask & second)
    tl.store(slots_ptr + rows, tl.zeros(old.shape, tl.int64), mask=rmask & second)


@triton.jit
def finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                KFOLD: tl.constexpr):
    """store_part, or fold_part (KFOLD) for a grid of (row tiles, SPLIT) programs."""
    if KFOLD and SPLIT > 1 and not ATOMIC:
        fold_part(y_ptr, part_ptr, tickets_ptr, tl.program_id(0), tl.program_id(1), rows, rmask, acc, N, SPLIT)
    else:
        store_part(part_ptr, rows, rmask, acc, N, SPLIT, ATOMIC)


@triton.jit
def prefetch_tile(w_ptr, N, row_bytes, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    """pdl.prefetch_l2 of the program's 1/SPLIT share of its row tile's weight bytes (the tile's BLOCK_N rows lie
    one after another in every layout; the SPLIT programs of a tile, in one wave, ask for all of it once between
    them, not each for the bytes of its own range): before pdl.start, address arithmetic and the prefetch only."""
    if PREFETCH:
        row64 = row_bytes.to(tl.int64)
        tile_bytes = row64 * BLOCK_N
        lo = tl.program_id(0).to(tl.int64) * tile_bytes
        hi = tl.minimum(lo + tile_bytes, row64 * N)  # (N of 1 comes as a Python int: the JIT's specialization)
        share = tl.cdiv(hi - lo, SPLIT)
        lo = lo + tl.program_id(1) * share
        pdl.prefetch_l2(w_ptr.to(tl.int64) + lo, tl.minimum(share, hi - lo), PREFETCH)


@triton.jit
def x_row(xw_ptr, xd_ptr, xs_ptr, g, K, XBLOCK: tl.constexpr):
    """Row g's pointers of a quantized x [G, K] (act_quant.QuantX: K / 4 words, K / XBLOCK scales, K / 32 sums a row;
    Q8_0's sums, a placeholder, are never read)."""
    return xw_ptr + g * (K // 4), xd_ptr + g * (K // XBLOCK), xs_ptr + g * (K // 32)


@triton.jit
def _igemv_kernel(w_ptr, aux_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, part_ptr, tickets_ptr, N, K, row_bytes,
                  IDOT: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, BLOCK_N: tl.constexpr,
                  UNROLL: tl.constexpr, SPLIT: tl.constexpr, EW: tl.constexpr, EMU: tl.constexpr,
                  ATOMIC: tl.constexpr, KFOLD: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False,
                  PREFETCH: tl.constexpr = 0, GROUP_ROWS: tl.constexpr = 0, XBLOCK: tl.constexpr = 32):
    prefetch_tile(w_ptr, N, row_bytes, BLOCK_N, SPLIT, PREFETCH)  # weights only: allowed before the wait
    pdl.start(PDL)  # first after the weights' prefetch: pdl's rule
    if GROUP_ROWS:  # gemv's groups: the program's rows take x's row (first row // GROUP_ROWS)
        xw_ptr, xd_ptr, xs_ptr = x_row(xw_ptr, xd_ptr, xs_ptr, tl.program_id(0) * BLOCK_N // GROUP_ROWS, K, XBLOCK)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    acc = row_idot(w_ptr, aux_ptr, rows.to(tl.int64) * row_bytes, rmask, xw_ptr, xd_ptr, xs_ptr, K,
                   tl.program_id(1), SPLIT, IDOT, A1, A2, A3, UNROLL, EW, EMU, STAGES)
    finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT, ATOMIC, KFOLD)


@triton.jit
def _kgemv_kernel(w_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, N, K, row_bytes, KSTEP: tl.constexpr, KW: tl.constexpr,
                  UNROLL: tl.constexpr, EMU: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0,
                  GROUP_ROWS: tl.constexpr = 0, XBLOCK: tl.constexpr = 32):
    """_igemv_kernel at split KW with the ranges on the program's KW warps (GemvConfig.warps_k): a 4-row tile a
    program, y written once, in the split-K launch's sum order."""
    prefetch_tile(w_ptr, N, row_bytes, 4, 1, PREFETCH)  # weights only: allowed before the wait
    pdl.start(PDL)  # first after the weights' prefetch: pdl's rule
    if GROUP_ROWS:  # as _igemv_kernel's
        xw_ptr, xd_ptr, xs_ptr = x_row(xw_ptr, xd_ptr, xs_ptr, tl.program_id(0) * 4 // GROUP_ROWS, K, XBLOCK)
    rows = tl.program_id(0) * 4 + tl.arange(0, 4)
    tl.store(y_ptr + rows, KSTEP(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW, UNROLL, EMU), mask=rows < N)


@triton.jit
def _gemv_kernel(w_ptr, aux_ptr, x_ptr, y_ptr, part_ptr, tickets_ptr, N, K, row_bytes, DOT: tl.constexpr,
                 ACC0: tl.constexpr, TOTAL: tl.constexpr, DEQ: tl.constexpr, USE_DEQ: tl.constexpr,
                 NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                 EW: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr, KFOLD: tl.constexpr,
                 STAGES: tl.constexpr, PDL: tl.constexpr = False, GROUP_ROWS: tl.constexpr = 0):
    pdl.start(PDL)  # first: pdl's rule
    if GROUP_ROWS:  # as _igemv_kernel's (x rows K apart)
        x_ptr += tl.program_id(0) * BLOCK_N // GROUP_ROWS * K
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    row_off = rows.to(tl.int64) * row_bytes
    acc = row_dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, K, tl.program_id(1), SPLIT, DOT, ACC0, TOTAL,
                  DEQ, USE_DEQ, NSUB, SUBLEN, UNROLL, EW, STAGES)
    finish_part(y_ptr, part_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT, ATOMIC, KFOLD)


def int_args(fam: dispatch.Family) -> dict:
    """The compile-time arguments that pick a family's integer step in row_idot's kernels."""
    return dict(IDOT=fam.idot, A1=fam.iacc[0], A2=fam.iacc[1], A3=fam.isplit)


def family_args(fam: dispatch.Family) -> dict:
    """The compile-time arguments that pick a family's code in row_dot's kernels."""
    own = fam.dot is not None  # else the dequant stands in for the unused slots
    return dict(DOT=fam.dot if own else fam.dequant, ACC0=fam.acc0 if own else fam.dequant,
                TOTAL=fam.total if own else fam.dequant, DEQ=fam.dequant, USE_DEQ=not own,
                NSUB=fam.nsub, SUBLEN=fam.sublen)


def checked(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor, x_dims: int, what: str):
    """The checks GEMV and GEMM share; returns (family, rows, cols, bytes per row)."""
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(weight, what, fam.align)
    dispatch.check_activations(x, cols, what)
    dispatch.device_of(weight, x, what)
    if rows % fam.row_tile:
        raise dispatch.KernelArgumentError(f"could not run {what}: {rows} rows is not a multiple of the layout's "
                                           f"tile of {fam.row_tile} rows")
    if x.dim() != x_dims or weight.numel() != rows * row_bytes:
        x_shape = f"[{cols}]" if x_dims == 1 else f"[T, {cols}]"
        raise dispatch.KernelArgumentError(
            f"could not run {what}: need x {x_shape} and {rows * row_bytes} weight bytes for "
            f"[{rows}, {cols}], got x {list(x.shape)} and {weight.numel()} bytes")
    return fam, rows, cols, row_bytes


def gemv(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor,
         out: torch.Tensor | None = None, config: GemvConfig | None = None,
         round_x: Callable[[torch.Tensor], torch.Tensor] | None = None,
         qx: act_quant.QuantX | None = None, parts: bool = False) -> torch.Tensor:
    """y = W @ x for one token. weight: raw GGUF bytes of W [rows, cols]; x float32 [cols];
    out (optional) float32 [rows] on x's device. A family with an integer step quantizes x
    itself, as llama.cpp does (Family.act_fmt), unless qx brings x already quantized to that
    format (one row, e.g. from rms_norm_quant); for the others round_x (if given) rounds x first.
    parts: return [split, rows], the split-K ranges' partial sums unsummed (no fold in or after the
    launch; the reader adds them in order 0..split-1 from 0.0, fold_part's bits: sum_parts), or
    y[None] where the launch has no ordered split (split 1, atomic adds); out is then y's buffer.

    Grouped (x [G, cols]): W is G matrices of rows / G rows stacked, and matrix g multiplies x[g] (DeepSeek V4's
    grouped output projection): one launch, each program's rows in one group (grouped_tile_fits), y [rows]."""
    what = f"the {qtype.name} GEMV"
    groups = x.shape[0] if x.dim() == 2 else 0
    fam, rows, cols, row_bytes = checked(weight, qtype, shape, x, 2 if groups else 1, what)
    dispatch.check_out(out, (rows,), x.device, what)
    check_qx(qx, fam, cols, what)
    cfg = config or default_config(fam)
    check_one_tile(fam, cfg, what)
    group_rows = 0
    if groups:
        group_rows = rows // groups
        if qx is not None or parts or rows % groups or not grouped_tile_fits(cfg, group_rows):
            raise dispatch.KernelArgumentError(
                f"could not run {what} on {groups} groups: need {rows} rows a multiple of the groups and of the "
                f"tile's rows (grouped_tile_fits: {cfg.block_n}, at least 4) per group, x alone (no qx or parts)")
    kernel_folds(cfg, 1)  # a bad fold name refused whether or not parts replaces it
    cfg = dataclasses.replace(cfg, fold="torch") if parts else cfg  # "torch": the partials stay in part
    y = torch.empty(rows, dtype=torch.float32, device=x.device) if out is None else out
    if fam.idot is not None:
        y = igemv(weight, fam.idot, fam.iacc, fam.act_fmt, (rows, cols), row_bytes, x, y, cfg, qx, fam.isplit, parts,
                  fam.kstep, fam.grid, group_rows)
        return y[None] if parts and y.dim() == 1 else y
    split = split_for(cfg, rows, triton.cdiv(cols, fam.nsub * fam.sublen), x.device)
    in_kernel = kernel_folds(cfg, split)  # checks cfg.fold before anything runs
    part = partials_for(y, split, cfg)
    x = (x if round_x is None else round_x(x)).contiguous()
    tiles = triton.cdiv(rows, cfg.block_n)
    ticket = _tickets_arg(in_kernel, tiles, part)
    _gemv_kernel[(tiles, split)](
        weight, aux_arg(fam, cols, x.device), x, y, part, ticket, rows, cols, row_bytes,
        **family_args(fam), **_launch_args(cfg, split), **pdl.launch(x.device),
        **({"GROUP_ROWS": group_rows} if group_rows else {}))
    if parts:
        return part if part is not y else y[None]
    return y if in_kernel else fold_partials(part, y)


def grouped_config(fam: dispatch.Family, cfg: GemvConfig, cols: int, group_rows: int, on_cuda: bool) -> GemvConfig:
    """A grouped launch's tile from a layer's own cfg: SHORT_ROW_TILE on CUDA for rows of one group or less, and no
    more rows a program than divide a group's (grouped_tile_fits may still refuse it: fewer than 4). A family's fixed
    tile (Family.one_tile, check_one_tile) stays."""
    if fam.one_tile:
        return cfg
    cfg = SHORT_ROW_TILE if on_cuda and cols <= SHORT_ROW_VALUES else cfg
    return dataclasses.replace(cfg, block_n=math.gcd(cfg.block_n, group_rows))


def grouped_tile_fits(cfg: GemvConfig, group_rows: int) -> bool:
    """Whether a grouped GEMV's programs (cfg.block_n rows; the warps_k launch's 4) each fall in one group."""
    return group_rows % max(cfg.block_n, 4) == 0


def check_one_tile(fam: dispatch.Family, cfg: GemvConfig, what: str) -> None:
    """A KernelArgumentError where the family's step runs on one tile only (Family.one_tile) and cfg is another."""
    if fam.one_tile and ((cfg.block_n, cfg.num_warps) != fam.one_tile or not cfg.elementwise):
        raise dispatch.KernelArgumentError(
            f"could not run {what}: its integer step runs on the elementwise tile of {fam.one_tile[0]} rows on "
            f"{fam.one_tile[1]} warp(s) only, not {cfg.block_n} rows on {cfg.num_warps} (elementwise "
            f"{cfg.elementwise}); pass config=None")


def igemv(weight: torch.Tensor, idot, iacc: tuple[int, int], act_fmt: str, shape: tuple[int, int],
          row_bytes: int, x: torch.Tensor, y: torch.Tensor, cfg: GemvConfig,
          qx: act_quant.QuantX | None = None, isplit: int = 0, parts: bool = False, kstep=None,
          grid: str | None = None, group_rows: int = 0) -> torch.Tensor:
    """gemv's integer path, for any byte layout an idot step reads (rows row_bytes apart): x
    quantized to act_fmt (or qx, x quantized so already), y [rows] written; isplit: the rows'
    sum order (Family.isplit, row_sums); parts: gemv's (the [split, rows] partials where there
    are, cfg.fold "torch"); kstep: Family.kstep, run where uses_kstep says; grid: Family.grid, the
    codebook the step gets (grids.grid_words); group_rows: gemv's groups (x [G, cols], each group's rows).
    Arguments checked by the caller."""
    rows, cols = shape
    split = split_for(cfg, rows, triton.cdiv(cols, 256), x.device)
    in_kernel = kernel_folds(cfg, split)  # checks cfg.fold before anything runs
    q = act_quant.quantize(x if group_rows else x[None], act_fmt) if qx is None else qx
    grouped = dict(GROUP_ROWS=group_rows, XBLOCK=act_quant.BLOCKS[act_fmt]) if group_rows else {}
    if in_kernel and not parts and uses_kstep(cfg, split, kstep):
        _kgemv_kernel[(triton.cdiv(rows, cfg.block_n),)](
            weight, q.words, q.scales, q.sums, y, rows, cols, row_bytes, KSTEP=kstep, KW=split,
            UNROLL=step_groups(cfg, split), EMU=emulate(cfg, x), num_warps=split, maxnreg=KSTEP_MAXNREG,
            PREFETCH=pdl.prefetch_mode(x.device, rows * row_bytes), **pdl.launch(x.device), **grouped)
        return y
    part = partials_for(y, split, cfg)
    tiles = triton.cdiv(rows, cfg.block_n)
    ticket = _tickets_arg(in_kernel, tiles, part)
    _igemv_kernel[(tiles, split)](
        weight, grids.grid_words(grid, x.device), q.words, q.scales, q.sums, y, part, ticket, rows, cols, row_bytes,
        IDOT=idot, A1=iacc[0], A2=iacc[1], A3=isplit, EMU=emulate(cfg, x),
        PREFETCH=pdl.prefetch_mode(x.device, rows * row_bytes), **_launch_args(cfg, split), **pdl.launch(x.device),
        **grouped)
    if parts:
        return part
    return y if in_kernel else fold_partials(part, y)


def check_qx(qx: act_quant.QuantX | None, fam: dispatch.Family, cols: int, what: str) -> None:
    """A pre-quantized x must be one row of cols values in the family's activation format."""
    if qx is None:
        return
    block = act_quant.BLOCKS.get(fam.act_fmt or "", 0)
    if fam.idot is None or qx.words.shape != (1, cols // 4) or qx.scales.shape != (1, cols // block):
        raise dispatch.KernelArgumentError(
            f"could not run {what} on a pre-quantized x: need one row of {cols} values in "
            f"{fam.act_fmt or 'an integer family'}'s blocks, got words {list(qx.words.shape)} and "
            f"scales {list(qx.scales.shape)}; pass x alone")


def uses_kstep(cfg: GemvConfig, split: int, kstep) -> bool:
    """Whether a launch at this split runs its ranges as one program's warps (cfg.warps_k, Family.kstep)."""
    return cfg.warps_k and kstep is not None and split in KSTEP_WARPS and cfg.block_n == 4 and cfg.num_warps == 1


def step_groups(cfg: GemvConfig, split: int) -> int:
    """Groups per loop step of a launch: cfg.whole_unroll where a program's range is the whole row, else unroll."""
    return cfg.whole_unroll if split == 1 and cfg.whole_unroll else cfg.unroll


def _launch_args(cfg: GemvConfig, split: int) -> dict:
    return dict(BLOCK_N=cfg.block_n, UNROLL=step_groups(cfg, split), SPLIT=split, EW=cfg.elementwise,
                ATOMIC=cfg.atomic, KFOLD=kernel_folds(cfg, split), STAGES=stages_arg(cfg), num_warps=cfg.num_warps)


def kernel_folds(cfg: GemvConfig, split: int) -> bool:
    """Whether the launch itself leaves the summed y (fold_part): split-K, ordered, fold "kernel".
    Raises for an unknown cfg.fold."""
    if cfg.fold not in FOLDS:
        raise dispatch.KernelArgumentError(f"could not run the GEMV: fold {cfg.fold!r} is not one of {FOLDS} "
                                           f"(GemvConfig.fold, default from ${FOLD_ENV})")
    return split > 1 and not cfg.atomic and cfg.fold == "kernel"


# fold_part's tickets: one zeroed int32 per row tile, per device, kept (every launch leaves them
# zero again; launches on one stream run one after another, so they never share a ticket)
_TICKETS: dict[torch.device, torch.Tensor] = {}
MIN_TICKETS = 1 << 14


def _tickets_arg(in_kernel: bool, tiles: int, part: torch.Tensor) -> torch.Tensor:
    """The launch's tickets, or (no fold in the kernel: never read) any int32-sized buffer."""
    return tickets(tiles, part.device) if in_kernel else part


def tickets(tiles: int, device: torch.device) -> torch.Tensor:
    """At least `tiles` zeroed int32 tickets on device (fold_part), allocated once per device and
    grown (never during a graph capture: MIN_TICKETS covers the decode shapes) when a launch has more."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one buffer per real device
        device = torch.device("cuda", torch.cuda.current_device())
    t = _TICKETS.get(device)
    if t is None or t.numel() < tiles:
        t = _TICKETS[device] = torch.zeros(max(tiles, MIN_TICKETS), dtype=torch.int32, device=device)
    return t


# fold_pair's slots: one zeroed int64 per row, per device, kept as the tickets are
_SLOTS: dict[torch.device, torch.Tensor] = {}


def pair_slots(rows: int, device: torch.device) -> torch.Tensor:
    """At least `rows` zeroed int64 slots on device (fold_pair), as tickets() keeps its tickets."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    t = _SLOTS.get(device)
    if t is None or t.numel() < rows:
        t = _SLOTS[device] = torch.zeros(max(rows, MIN_TICKETS), dtype=torch.int64, device=device)
    return t


def partials_for(y: torch.Tensor, split: int, cfg: GemvConfig) -> torch.Tensor:
    """Where the kernel writes: y itself (no split, or atomic adds into it zeroed), else a
    [split, rows] buffer of the ranges' partial sums."""
    if split == 1:
        return y
    if cfg.atomic:
        return y.zero_()
    return torch.empty(split, y.numel(), dtype=torch.float32, device=y.device)


def sum_parts(part: torch.Tensor) -> torch.Tensor:
    """gemv(parts=True)'s y: rows 0..split-1 added in order from 0.0, fold_part's bits (one row: itself)."""
    if part.shape[0] == 1:
        return part[0]
    total = torch.zeros_like(part[0])
    for row in part:
        total += row
    return total


def fold_partials(part: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if part is not y:
        torch.sum(part, 0, out=y)  # a fixed-order reduction: the same bits on every run
    return y


# tiled layouts' row widths as the dequant's aux_ptr, per (device, width): made on a shape's first
# (eager) call, so a CUDA graph capture of a later call copies nothing from the host
_ROW_WIDTHS: dict[tuple[torch.device, int], torch.Tensor] = {}


def aux_arg(fam: dispatch.Family, cols: int, device: torch.device) -> torch.Tensor:
    """A family's dequant aux_ptr: its codebook, or a tiled layout's row width (int32 [1])."""
    if fam.row_tile == 1:
        return grids.grid_table(fam.grid, device)
    key = (torch.device(device), cols)
    if key not in _ROW_WIDTHS:
        _ROW_WIDTHS[key] = torch.tensor([cols], dtype=torch.int32, device=device)
    return _ROW_WIDTHS[key]
