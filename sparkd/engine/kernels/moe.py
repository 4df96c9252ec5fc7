"""Routed experts straight from raw GGUF blocks.

Decode (one token, A selected experts): two launches per layer. The first runs over all A
experts at once (grid axis 1), computing gate and up rows, the activation and the routing weight:
h[a] = w[a] * act(gate_a @ x, up_a @ x). The second runs one program per row tile, which sums
its rows over the A experts itself in table order: y = sum_a down_a @ h[a], the same bits on
every run and in a CUDA graph as eagerly. The down tile's split runs that many ranges of experts
as separate programs, their partial sums added in range order by the last program of each row
tile to finish, in the same launch (matmul.fold_part; GemvConfig.fold "torch": one more launch);
its atomic: one program per (row tile, expert) meeting in a zeroed y by atomic adds, the way
before session 3 made the sums ordered, kept to time against. The down launch may add the
block's residual too (y = residual + the sum, the bits of adding it after).
Experts are found through a pointer/offset table, a base buffer per projection (one arena slab
may serve all three) plus a byte offset per expert, so experts in scattered cache slots need no
gathering copy; a selection of a resident table (PreparedTable.select) passes the ids, and the
kernels read offsets[ids[a]] themselves.

Families with an integer step (Q8_0, Q4_K, Q6_K) run the integer variants of both launches: x is
quantized once per call (act_quant) and h once per call after the activation, both as llama.cpp
does (h inside the gate/up launch with GemvConfig.fuse_quant: by the tile itself when it holds
whole blocks, else by the last program of each block), and the routing weight multiplies each
expert's down sums as they are added.

Resident Q4_K experts may come in q4_k_tiled's pairx bytes (repacked at load: tiled_gate_up, session 9;
tiled_down, session 10): the launches then hand the pairx step the expert's matrix as its weight pointer
(constexpr TILED), on its one 4-row tile. Resident MXFP4 experts (gpt-oss's) and Q4_0 ones come in nibble_tiles'
16-row tiles (repacked at load: tiled_nibbles, sessions 25-26), read the same way. gpt-oss's expert biases
(moe_decode's bias) are read by both launches, a selection's rows through its ids: gate and up before the
activation, each range's weighted down biases by the down's programs.

Prefill (many tokens) is moe_prefill.py's: the same tables, grouped GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from sparkd.engine.kernels import (act_quant, dispatch, grids, moe_down_ahead, moe_pipe, mxfp4, mxfp4_tiled,
                                   nibble_tiles, pdl, q4_0, q4_0_tiled, q4_k, q4_k_pair, q4_k_tiled, q8_0_words)
from sparkd.engine.kernels.matmul import (
    GemvConfig,
    check_one_tile,
    check_qx,
    emulate,
    family_args,
    fold_pair,
    fold_part,
    fold_partials,
    int_args,
    kernel_folds,
    pair_slots,
    partials_for,
    row_dot,
    row_idot,
    stages_arg,
    store_part,
    tickets,
)
from sparkd.engine.kernels.moe_tiles import (Kernels, decode_kernels, decode_tiles, down_ahead, down_early,
                                             down_launch_at_start, pair_fold, pairx_down, pairx_way, pipe_programs)
from sparkd.engine.kernels.row_tiles import row_sums

# gpt-oss's clamped swiglu (ggml_swiglu_oai); llama.cpp fixes these in its graph builder
OAI_ALPHA = 1.702
OAI_LIMIT = 7.0
# the activations _activate fuses (layers/ffn.py kernel_act names them, with their constants a and b)
ACT_CODES = {"silu": 0, "swiglu_oai": 1, "swiglu_clamp": 2, "situ": 3}
Act = str | tuple[str, float, float]  # a name, or (name, a, b)


def act_args(act: Act, what: str) -> dict:
    """The kernels' ACT, ACT_A, ACT_B for an activation name or (name, a, b) (ffn.kernel_act); a clear error for
    another."""
    name, a, b = (act, 0.0, 0.0) if isinstance(act, str) else act
    if name not in ACT_CODES:
        raise dispatch.KernelArgumentError(f"could not run {what}: activation {act!r} is not one of "
                                           f"{sorted(ACT_CODES)}")
    return dict(ACT=ACT_CODES[name], ACT_A=float(a), ACT_B=float(b))


@triton.jit
def _soft_cap(x, cap: tl.constexpr):
    """cap * tanh(x / cap) (situ's _soft_cap), tanh as 2 sigmoid(2v) - 1: tl has no tanh on every backend."""
    return cap * (2.0 * tl.sigmoid(2.0 * (x * (1.0 / cap))) - 1.0)


@triton.jit
def _activate(g, u, ACT: tl.constexpr, ACT_A: tl.constexpr, ACT_B: tl.constexpr):
    """h from the gate and up sums: SwiGLU (0), gpt-oss's clamped one (1), DeepSeek V4's clamp at ACT_A (2), or
    Kimi K3's SiTU with beta ACT_A and linear beta ACT_B (3): layers/ffn.py's and layers/situ.py's functions."""
    if ACT == 0:
        h = g * tl.sigmoid(g) * u
    elif ACT == 1:
        xg = tl.minimum(g, 7.0)
        yu = tl.minimum(tl.maximum(u, -7.0), 7.0)
        h = xg * tl.sigmoid(1.702 * xg) * (yu + 1.0)
    elif ACT == 2:
        xg = tl.minimum(g, ACT_A)
        h = xg * tl.sigmoid(xg) * tl.minimum(tl.maximum(u, -ACT_A), ACT_A)
    else:
        h = _soft_cap(g, ACT_A) * tl.sigmoid(g)
        if ACT_B > 0.0:
            h = h * _soft_cap(u, ACT_B)
        else:
            h = h * u
    return h


@triton.jit
def _biased(g, u, a, rows, rmask, b_ptr, BSTRIDE, F, BIAS: tl.constexpr, ids_ptr=None, IDS: tl.constexpr = False):
    """(g, u) plus selected expert a's gate and up biases where BIAS (gpt-oss): columns [0, F) and [F, 2F) of its
    entry's row (_entry) of b_ptr (moe_decode's bias: float32 [entries, 2F + D], the down's after them)."""
    if BIAS:
        b_row = b_ptr + _entry(ids_ptr, a, IDS) * BSTRIDE
        g += tl.load(b_row + rows, mask=rmask, other=0.0)
        u += tl.load(b_row + F + rows, mask=rmask, other=0.0)
    return g, u


@triton.jit
def _down_biases(acc, rows, rmask, first, last, rw_ptr, ids_ptr, IDS: tl.constexpr, b_ptr, BSTRIDE, BOFF,
                 BIAS: tl.constexpr):
    """acc plus the weighted down biases (columns BOFF.. of their entries' rows of b_ptr) of selected experts first
    .. last - 1 where BIAS: the terms llama.cpp adds to each expert's output before the weighted sum."""
    if BIAS:
        for a in range(first, last):
            b_row = b_ptr + _entry(ids_ptr, a, IDS) * BSTRIDE + BOFF
            acc += tl.load(rw_ptr + a) * tl.load(b_row + rows, mask=rmask, other=0.0)
    return acc


@triton.jit
def _entry(ids_ptr, a, IDS: tl.constexpr, L2: tl.constexpr = False):
    """The table entry (int64) of selected expert a: ids[a] (IDS: a selection of the full table), else a (one
    return type both ways: compiled, the branch not taken is typed too). L2: read from the L2, past this SM's L1 (a
    read before the PDL wait, pdl.py's exception: the L2 holds what finished kernels wrote)."""
    if IDS:
        return tl.cast(tl.load(ids_ptr + a, cache_modifier=".cg" if L2 else ""), tl.int64)
    return tl.cast(a, tl.int64)


@triton.jit
def _offset(off_ptr, ids_ptr, a, IDS: tl.constexpr, L2: tl.constexpr = False):
    """Byte offset of selected expert a: offsets[ids[a]] from the full table (IDS), else offsets[a] (L2: _entry's)."""
    return tl.load(off_ptr + _entry(ids_ptr, a, IDS, L2))


@triton.jit
def _aligned_offset(off_ptr, ids_ptr, a, IDS: tl.constexpr, ALIGN: tl.constexpr, L2: tl.constexpr = False):
    """_offset, known to be a multiple of ALIGN bytes (prepare checked it): the compiler may then
    read a 16-byte Q4_K header as one vector load."""
    off = _offset(off_ptr, ids_ptr, a, IDS, L2)
    if ALIGN > 1:
        off = tl.multiple_of(off, ALIGN)
    return off


@triton.jit
def _q4_k_vec(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """q4_k.idot on the GGUF blocks with the elementwise tile's header as one 128-bit load per thread
    (q4_k_tiled.idot_tile_vec on the file's layout: header at the block, qs 16 bytes on; the same
    bits as q4_k.idot_tile_at). Rows and offsets on 16 bytes (moe.prepare: PreparedTable.*_vec)."""
    blk = w_ptr + row_off + g * 144
    if EW:
        acc = q4_k_tiled.idot_tile_vec(blk + 16, blk, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    else:
        acc = q4_k.idot_rows_at(blk + 16, blk, rmask, xw_ptr, xd_ptr, xs_ptr, g, acc, EMU)
    return acc


@triton.jit
def _finish(y_ptr, part_ptr, res_ptr, tickets_ptr, rows, rmask, acc, N, SPLIT: tl.constexpr,
            ATOMIC: tl.constexpr, FOLD: tl.constexpr, RES: tl.constexpr, PAIR_FOLD: tl.constexpr = False):
    """A down program's sums for its rows. SPLIT 1: y = acc (+ the residual if RES). FOLD (SPLIT
    > 1): matmul.fold_part's last-program fold in the launch, the residual added after the
    ordered sum; PAIR_FOLD (SPLIT 2): matmul.fold_pair's, tickets_ptr its int64 slots. Else
    matmul.store_part (a torch fold or atomics after the launch)."""
    if SPLIT == 1:
        if RES:
            acc = acc + tl.load(res_ptr + rows, mask=rmask)
        tl.store(y_ptr + rows, acc, mask=rmask)
    elif PAIR_FOLD:
        fold_pair(y_ptr, tickets_ptr, tl.program_id(1), rows, rmask, acc, res_ptr, RES)
    elif FOLD:
        fold_part(y_ptr, part_ptr, tickets_ptr, tl.program_id(0), tl.program_id(1), rows, rmask, acc, N, SPLIT,
                  res_ptr, RES)
    else:
        store_part(part_ptr, rows, rmask, acc, N, SPLIT, ATOMIC)


@triton.jit
def _gate_up_kernel(gate_ptr, up_ptr, aux_ptr, gate_off, up_off, ids_ptr, x_ptr, rw_ptr, h_ptr, F, D,
                    row_bytes, IDS: tl.constexpr, DOT: tl.constexpr, ACC0: tl.constexpr, TOTAL: tl.constexpr, DEQ: tl.constexpr,
                    USE_DEQ: tl.constexpr, NSUB: tl.constexpr, SUBLEN: tl.constexpr,
                    BLOCK_N: tl.constexpr, UNROLL: tl.constexpr, EW: tl.constexpr, ACT: tl.constexpr,
                    ACT_A: tl.constexpr, ACT_B: tl.constexpr,
                    RW: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False, b_ptr=None, BSTRIDE=0,
                    BIAS: tl.constexpr = False):
    """h[a] = act(gate_a x + gate bias, up_a x + up bias), times the routing weight if RW, for expert program_id(1)
    (BIAS: _biased's biases, else none)."""
    pdl.start(PDL)  # first: pdl's rule
    a = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < F
    rb = rows.to(tl.int64) * row_bytes
    g = row_dot(gate_ptr, aux_ptr, _offset(gate_off, ids_ptr, a, IDS) + rb, rmask, x_ptr, D, 0, 1, DOT, ACC0,
                TOTAL, DEQ, USE_DEQ, NSUB, SUBLEN, UNROLL, EW, STAGES)
    u = row_dot(up_ptr, aux_ptr, _offset(up_off, ids_ptr, a, IDS) + rb, rmask, x_ptr, D, 0, 1, DOT, ACC0, TOTAL,
                DEQ, USE_DEQ, NSUB, SUBLEN, UNROLL, EW, STAGES)
    g, u = _biased(g, u, a, rows, rmask, b_ptr, BSTRIDE, F, BIAS, ids_ptr, IDS)
    h = _activate(g, u, ACT, ACT_A, ACT_B)
    if RW:
        h = h * tl.load(rw_ptr + a)
    tl.store(h_ptr + a * F + rows, h, mask=rmask)


@triton.jit
def _down_kernel(down_ptr, aux_ptr, down_off, ids_ptr, h_ptr, y_ptr, part_ptr, res_ptr, tickets_ptr, D, F, n,
                 row_bytes, IDS: tl.constexpr, RES: tl.constexpr, FOLD: tl.constexpr, DOT: tl.constexpr,
                 ACC0: tl.constexpr, TOTAL: tl.constexpr, DEQ: tl.constexpr, USE_DEQ: tl.constexpr,
                 NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr,
                 UNROLL: tl.constexpr, EW: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                 STAGES: tl.constexpr, PDL: tl.constexpr = False, rw_ptr=None, b_ptr=None, BSTRIDE=0, BOFF=0,
                 BIAS: tl.constexpr = False):
    """y = sum_a down_a @ h[a] (+ the residual if RES): a row tile per program, the experts of its
    range in table order (_experts; the ranges meet as _finish has them meet); BIAS: plus _down_biases' (rw_ptr:
    the routing weights they take; h has them already)."""
    pdl.start(PDL)  # first: pdl's rule
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < D
    rb = rows.to(tl.int64) * row_bytes
    first, last = _experts(n, SPLIT)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for a in range(first, last):
        acc += row_dot(down_ptr, aux_ptr, _offset(down_off, ids_ptr, a, IDS) + rb, rmask, h_ptr + a * F, F, 0, 1,
                       DOT, ACC0, TOTAL, DEQ, USE_DEQ, NSUB, SUBLEN, UNROLL, EW, STAGES)
    acc = _down_biases(acc, rows, rmask, first, last, rw_ptr, ids_ptr, IDS, b_ptr, BSTRIDE, BOFF, BIAS)
    _finish(y_ptr, part_ptr, res_ptr, tickets_ptr, rows, rmask, acc, D, SPLIT, ATOMIC, FOLD, RES)


@triton.jit
def _experts(n, SPLIT: tl.constexpr):
    """The experts a down program sums: range program_id(1) of SPLIT contiguous ranges of the n."""
    per = tl.cdiv(n, SPLIT)
    first = tl.program_id(1) * per
    return first, tl.minimum(first + per, n)


@triton.jit
def _gate_up_idot(gate_ptr, up_ptr, aux_ptr, g_off, u_off, rmask, xw_ptr, xd_ptr, xs_ptr, D, IDOT: tl.constexpr,
                  A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, UNROLL: tl.constexpr, EW: tl.constexpr,
                  EMU: tl.constexpr, STAGES: tl.constexpr, PAIR: tl.constexpr):
    """(gate row sums, up row sums) on quantized x. PAIR: both rows in one loop over x's groups
    (a step issues both rows' loads; the same operations per row in the same order as row_idot,
    so the same bits), else row_idot twice."""
    if PAIR:
        n_groups = tl.cdiv(D, 256)
        if EW:
            acc_g = tl.zeros((rmask.shape[0], A1, A2), tl.float32)
        else:
            acc_g = tl.zeros(rmask.shape, tl.float32)
        acc_u = acc_g
        for g0 in tl.range(0, n_groups, UNROLL, num_stages=STAGES):
            for u in tl.static_range(UNROLL):
                gc = tl.minimum(g0 + u, n_groups - 1)  # past the end: read a valid group, masked out
                m = rmask & (tl.zeros(rmask.shape, tl.int32) + g0 + u < n_groups)
                acc_g = IDOT(gate_ptr, aux_ptr, g_off, m, xw_ptr, xd_ptr, xs_ptr, gc, D, acc_g, EW, EMU)
                acc_u = IDOT(up_ptr, aux_ptr, u_off, m, xw_ptr, xd_ptr, xs_ptr, gc, D, acc_u, EW, EMU)
        if EW:
            acc_g = row_sums(acc_g, A1, A2, A3)
            acc_u = row_sums(acc_u, A1, A2, A3)
    else:
        acc_g = row_idot(gate_ptr, aux_ptr, g_off, rmask, xw_ptr, xd_ptr, xs_ptr, D, 0, 1, IDOT, A1, A2, A3, UNROLL,
                         EW, EMU, STAGES)
        acc_u = row_idot(up_ptr, aux_ptr, u_off, rmask, xw_ptr, xd_ptr, xs_ptr, D, 0, 1, IDOT, A1, A2, A3, UNROLL,
                         EW, EMU, STAGES)
    return acc_g, acc_u


@triton.jit
def _igate_up_kernel(gate_ptr, up_ptr, aux_ptr, gate_off, up_off, ids_ptr, xw_ptr, xd_ptr, xs_ptr, rw_ptr, h_ptr,
                     hd_ptr, hs_ptr, hf_ptr, tickets_ptr, F, D, row_bytes, IDS: tl.constexpr, IDOT: tl.constexpr,
                     A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr,
                     EW: tl.constexpr, EMU: tl.constexpr,
                     ACT: tl.constexpr, ACT_A: tl.constexpr, ACT_B: tl.constexpr, RW: tl.constexpr,
                     STAGES: tl.constexpr, HBLOCK: tl.constexpr,
                     H8K: tl.constexpr, PAIR: tl.constexpr, ALIGN: tl.constexpr, TILED: tl.constexpr = False,
                     DOWN_AT_START: tl.constexpr = True, NG: tl.constexpr = 0, PDL: tl.constexpr = False,
                     b_ptr=None, BSTRIDE=0, BIAS: tl.constexpr = False, DOWN_EARLY: tl.constexpr = False):
    """_gate_up_kernel's integer variant, x quantized. HBLOCK > 0: h leaves quantized for the
    down projection (act_quant's Q8_K if H8K, else Q8_0 blocks of HBLOCK values; h_ptr, hd_ptr,
    hs_ptr its QuantX buffers): a tile of whole blocks quantizes them itself; a smaller tile
    (dividing the block) stores its float h in hf_ptr [n, F], and the last of a block's programs
    to finish (a ticket per (expert, block), acq_rel) quantizes the block and resets the ticket.
    TILED (gate and up in a row-tile layout, q4_k_tiled's): the step gets the expert's matrix as its
    weight pointer and the rows' offsets in it, as a GEMV does (a row's tile follows from its offset).
    DOWN_AT_START False (Kernels.down_at_start): the next kernel may launch only after this one's loop; DOWN_EARLY
    (Kernels.down_early): only after this one's wait.
    NG > 0 (TILED pairx rows, Kernels.pairx_gate_up): q4_k_pair.gate_up's loop over the NG groups of a row, UNROLL a
    step, the same bits."""
    pdl.start(PDL, DOWN_AT_START and not DOWN_EARLY)  # first: pdl's rule
    if DOWN_AT_START and DOWN_EARLY:  # after the wait: the down may read the selection before its own (_idown_kernel)
        pdl.dependents(PDL)
    a = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < F
    rb = rows.to(tl.int64) * row_bytes
    g_off = _aligned_offset(gate_off, ids_ptr, a, IDS, ALIGN)
    u_off = _aligned_offset(up_off, ids_ptr, a, IDS, ALIGN)
    if NG > 0:
        g, u = q4_k_pair.gate_up(gate_ptr + g_off, up_ptr + u_off, xw_ptr, xd_ptr, xs_ptr, NG, UNROLL, EMU)
        g, u = row_sums(g, A1, A2, A3), row_sums(u, A1, A2, A3)
    elif TILED:
        g, u = _gate_up_idot(gate_ptr + g_off, up_ptr + u_off, aux_ptr, rb, rb, rmask, xw_ptr, xd_ptr, xs_ptr, D, IDOT,
                             A1, A2, A3, UNROLL, EW, EMU, STAGES, PAIR)
    else:
        g, u = _gate_up_idot(gate_ptr, up_ptr, aux_ptr, g_off + rb, u_off + rb, rmask, xw_ptr, xd_ptr, xs_ptr, D, IDOT,
                             A1, A2, A3, UNROLL, EW, EMU, STAGES, PAIR)
    if not DOWN_AT_START:
        pdl.dependents(PDL)
    _gate_up_out(g, u, a, tl.program_id(0), rw_ptr, h_ptr, hd_ptr, hs_ptr, hf_ptr, tickets_ptr, F, BLOCK_N, ACT,
                 ACT_A, ACT_B, RW,
                 HBLOCK, H8K, b_ptr, BSTRIDE, BIAS, ids_ptr, IDS)


@triton.jit
def _gate_up_out(g, u, a, tile, rw_ptr, h_ptr, hd_ptr, hs_ptr, hf_ptr, tickets_ptr, F, BLOCK_N: tl.constexpr,
                 ACT: tl.constexpr, ACT_A: tl.constexpr, ACT_B: tl.constexpr, RW: tl.constexpr, HBLOCK: tl.constexpr,
                 H8K: tl.constexpr, b_ptr=None, BSTRIDE=0,
                 BIAS: tl.constexpr = False, ids_ptr=None, IDS: tl.constexpr = False):
    """_igate_up_kernel's end for row tile `tile` of expert a: h from the (gate, up) row sums (plus _biased's biases
    if BIAS), stored as HBLOCK says (a persistent program, moe_pipe, calls it once a tile, without biases)."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < F
    g, u = _biased(g, u, a, rows, rmask, b_ptr, BSTRIDE, F, BIAS, ids_ptr, IDS)
    h = _activate(g, u, ACT, ACT_A, ACT_B)
    if RW:
        h = h * tl.load(rw_ptr + a)
    if HBLOCK == 0:
        tl.store(h_ptr + a * F + rows, h, mask=rmask)
    elif BLOCK_N >= HBLOCK:
        P: tl.constexpr = BLOCK_N // HBLOCK
        b = tile * P + tl.arange(0, P)[:, None]  # [P, 1] block index in h's row
        act_quant.store_blocks(h_ptr + a * (F // 4), hd_ptr + a * (F // HBLOCK), hs_ptr + a * (F // 32),
                               tl.reshape(h, (P, HBLOCK)), b, b * HBLOCK < F, H8K)
    else:
        tl.store(hf_ptr + a * F + rows, h, mask=rmask)
        tl.debug_barrier()  # every thread's h stored before the ticket releases them
        blk = tile // (HBLOCK // BLOCK_N)
        ticket = tickets_ptr + a * (F // HBLOCK) + blk
        if tl.atomic_add(ticket, 1, sem="acq_rel") == HBLOCK // BLOCK_N - 1:
            v = tl.load(hf_ptr + a * F + blk * HBLOCK + tl.arange(0, HBLOCK)[None, :], cache_modifier=".cg")
            b = blk + tl.zeros((1, 1), tl.int32)
            act_quant.store_blocks(h_ptr + a * (F // 4), hd_ptr + a * (F // HBLOCK), hs_ptr + a * (F // 32), v, b,
                                   b * HBLOCK < F, H8K)
            tl.store(ticket, 0)


@triton.jit
def _idown_kernel(down_ptr, aux_ptr, down_off, ids_ptr, hw_ptr, hd_ptr, hs_ptr, rw_ptr, y_ptr, part_ptr, res_ptr,
                  tickets_ptr, D, F, n, row_bytes, IDS: tl.constexpr, RES: tl.constexpr, FOLD: tl.constexpr,
                  IDOT: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, BLOCK_N: tl.constexpr,
                  UNROLL: tl.constexpr, EW: tl.constexpr, EMU: tl.constexpr, XBLOCK: tl.constexpr,
                  SPLIT: tl.constexpr, ATOMIC: tl.constexpr, STAGES: tl.constexpr, ALIGN: tl.constexpr,
                  NG: tl.constexpr = 0, TILED: tl.constexpr = False, AHEAD: tl.constexpr = False,
                  PAIR_FOLD: tl.constexpr = False, PDL: tl.constexpr = False, b_ptr=None, BSTRIDE=0, BOFF=0,
                  BIAS: tl.constexpr = False, EARLY: tl.constexpr = False):
    """_down_kernel's integer variant (BIAS: plus _down_biases'): h quantized per expert row (hw/hd/hs rows of
    act_quant's QuantX), each expert's sums times its routing weight, the range's experts one after another.
    NG > 0 (Kernels.down_full's types where _full holds): the row's NG groups in a loop of constant trip count
    on a mask that is true everywhere (_row_idot_full). TILED (the down in a row-tile layout, q4_k_tiled's):
    the step gets the expert's matrix as its weight pointer and the rows' offsets in it, as _igate_up_kernel.
    AHEAD (Kernels.down_ahead, _ahead_ok; NG the row's groups): the Q8_0 words step's loop with the next step's
    words in flight during this step's dots (moe_down_ahead), the same bits; with TILED (Kernels.pairx_down_ahead,
    _pairx_ahead_ok) the pairx down's (q4_k_pair.down_sums), the same bits. EARLY (Kernels.down_early, with the
    pairx down's AHEAD): down_sums waits for the gate/up after its first step's weight words (pdl.py's exception)."""
    pdl.start(PDL and not EARLY)  # first: pdl's rule (EARLY: down_sums' start, after its first weight words)
    tl.static_assert(not EARLY or (AHEAD and TILED), "EARLY needs the pairx down ahead (AHEAD and TILED): let "
                     "moe._early decide Kernels.down_early")
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < D
    rb = rows.to(tl.int64) * row_bytes
    first, last = _experts(n, SPLIT)
    if AHEAD and TILED:  # the pairx down (Kernels.pairx_down_ahead, _pairx_ahead_ok)
        acc = q4_k_pair.down_sums(down_ptr, down_off, ids_ptr, hw_ptr, hd_ptr, hs_ptr, rw_ptr, first, last, F, IDS,
                                  _aligned_offset, ALIGN, A1, A2, A3, NG, UNROLL, XBLOCK, EMU, PDL and EARLY)
    elif AHEAD:
        acc = moe_down_ahead.range_sums(down_ptr, down_off, ids_ptr, rb, hw_ptr, hd_ptr, rw_ptr, first, last, F, IDS,
                                        _aligned_offset, A1, A2, A3, NG, UNROLL, XBLOCK, EMU)
    else:
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for a in range(first, last):
            e_off = _aligned_offset(down_off, ids_ptr, a, IDS, ALIGN)
            if TILED:
                w_ptr, w_off = down_ptr + e_off, rb
            else:
                w_ptr, w_off = down_ptr, e_off + rb
            if NG > 0:  # every row and group in range (_full), NG groups a row: no clamp, no masks
                part = _row_idot_full(w_ptr, aux_ptr, w_off, hw_ptr + a * (F // 4), hd_ptr + a * (F // XBLOCK),
                                      hs_ptr + a * (F // 32), NG * 256, IDOT, A1, A2, A3, NG, UNROLL, EW, EMU)
            else:
                part = row_idot(w_ptr, aux_ptr, w_off, rmask, hw_ptr + a * (F // 4), hd_ptr + a * (F // XBLOCK),
                                hs_ptr + a * (F // 32), F, 0, 1, IDOT, A1, A2, A3, UNROLL, EW, EMU, STAGES)
            acc += part * tl.load(rw_ptr + a)
    acc = _down_biases(acc, rows, rmask, first, last, rw_ptr, ids_ptr, IDS, b_ptr, BSTRIDE, BOFF, BIAS)
    _finish(y_ptr, part_ptr, res_ptr, tickets_ptr, rows, rmask, acc, D, SPLIT, ATOMIC, FOLD, RES, PAIR_FOLD)


@triton.jit
def _row_idot_full(w_ptr, aux_ptr, row_off, xw_ptr, xd_ptr, xs_ptr, K, IDOT: tl.constexpr, A1: tl.constexpr,
                   A2: tl.constexpr, A3: tl.constexpr, NG: tl.constexpr, UNROLL: tl.constexpr, EW: tl.constexpr,
                   EMU: tl.constexpr):
    """row_idot over all NG groups of rows all in range (UNROLL divides NG: _full): the groups in the
    same order onto the same tile, so the same bits, without the clamp and the per-group mask, and a
    mask true everywhere that the steps' masked loads fold away (Q4_K's _q4_k_vec)."""
    rmask = tl.full(row_off.shape, 1, tl.int1)
    if EW:
        acc = tl.zeros((row_off.shape[0], A1, A2), tl.float32)
    else:
        acc = tl.zeros(row_off.shape, tl.float32)
    for g0 in tl.range(0, NG, UNROLL):
        for u in tl.static_range(UNROLL):
            acc = IDOT(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g0 + u, K, acc, EW, EMU)
    if EW:
        acc = row_sums(acc, A1, A2, A3)
    return acc


@dataclass(frozen=True)
class ExpertTable:
    """Where n experts' raw GGUF blocks are. dim D (model width), width F (expert width):
    gate/up are [F, D] and down [D, F] in torch order; expert i's gate starts at byte
    gate_offsets[i] of `gate`, and so on. The three buffers may be one and the same arena."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_offsets: Sequence[int]
    up_offsets: Sequence[int]
    down_offsets: Sequence[int]
    gate_up_type: GGMLQuantizationType
    down_type: GGMLQuantizationType
    dim: int
    width: int

    def __len__(self) -> int:
        return len(self.gate_offsets)


@dataclass(frozen=True)
class PreparedTable:
    """An ExpertTable checked against one device, its offsets copied there: build it once per
    layer (outside a CUDA graph capture) and pass it to moe_decode as often as needed."""

    table: ExpertTable
    device: torch.device
    gate_up: dispatch.Family
    down: dispatch.Family
    gate_off: torch.Tensor  # int64 [n] on device
    up_off: torch.Tensor
    down_off: torch.Tensor
    gate_up_row_bytes: int
    down_row_bytes: int
    # the families' codebooks on device as their decode step reads them: int8 words for an integer step
    # (grids.grid_words), else float32 (grids.grid_table)
    gate_up_aux: torch.Tensor
    down_aux: torch.Tensor
    # a selection of the table (select()): the kernels read offsets[ids[a]] themselves
    ids: torch.Tensor | None = None
    # Q8_0 rows that start on 4 bytes (q8_0_words): gate/up's, down's
    gate_up_words: bool = False
    down_words: bool = False
    # Q4_K rows and buffers on 16 bytes (_q4_k_vec; a row-tile layout's: its 128-bit loads): gate/up's, down's
    gate_up_vec: bool = False
    down_vec: bool = False

    @property
    def count(self) -> int:
        """How many experts a decode call runs: the selection's, else every entry's."""
        return self.gate_off.numel() if self.ids is None else self.ids.numel()

    def select(self, ids: torch.Tensor, what: str = "the MoE kernels") -> PreparedTable:
        """The table restricted to `ids` (integer [A] on the table's device), in that order,
        without a gathering launch; ids must index the table (no check: it would sync)."""
        if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or ids.device != self.device \
                or ids.stride(0) != 1:
            raise dispatch.KernelArgumentError(
                f"could not run {what}: need expert ids int32/int64 [A] contiguous on {self.device}, got "
                f"{ids.dtype} {list(ids.shape)} strides {list(ids.stride())} on {ids.device}")
        return replace(self, ids=ids)

    def gathered(self) -> PreparedTable:
        """select()'s table as offsets gathered in torch (offsets[ids], a launch per table): the
        layout before the kernels read ids themselves, kept to compare against."""
        if self.ids is None:
            return self
        i = self.ids
        return replace(self, gate_off=self.gate_off[i], up_off=self.up_off[i], down_off=self.down_off[i], ids=None)


def prepare(table: ExpertTable, device: torch.device | str, what: str = "the MoE kernels") -> PreparedTable:
    """Check the table (types, buffers, every expert's bytes inside its buffer) for `device`."""
    probe = torch.empty(0, device=device)  # "cuda" -> "cuda:0", as tensors report it
    device = probe.device
    fgu, fd = dispatch.family(table.gate_up_type), dispatch.family(table.down_type)
    if table.width % fgu.row_tile or table.dim % fd.row_tile:
        raise dispatch.KernelArgumentError(
            f"could not run {what}: a row-tile layout ({fgu.qtype.name} gate/up, {fd.qtype.name} down) needs whole "
            f"tiles ({table.width} gate/up rows, tiles of {fgu.row_tile}; {table.dim} down rows, tiles of "
            f"{fd.row_tile}); keep that projection in GGUF blocks")
    gu_bytes = dispatch.check_cols(fgu, table.dim, what)
    d_bytes = dispatch.check_cols(fd, table.width, what)
    for buf, fam in ((table.gate, fgu), (table.up, fgu), (table.down, fd)):
        dispatch.check_weight(buf, what, fam.align)
        dispatch.device_of(buf, probe, what)
    n = len(table)
    if not len(table.up_offsets) == len(table.down_offsets) == n:
        raise dispatch.KernelArgumentError(
            f"could not run {what}: offset tables differ in length (gate {n}, up "
            f"{len(table.up_offsets)}, down {len(table.down_offsets)})")
    # checked on the host, then one copy for the three (a streaming store prepares a table per token)
    host = [dispatch.offsets_tensor(table.gate_offsets, table.width * gu_bytes, table.gate, "cpu", what, fgu.align),
            dispatch.offsets_tensor(table.up_offsets, table.width * gu_bytes, table.up, "cpu", what, fgu.align),
            dispatch.offsets_tensor(table.down_offsets, table.dim * d_bytes, table.down, "cpu", what, fd.align)]
    return PreparedTable(table, device, fgu, fd, *offsets_on(host, device), gu_bytes, d_bytes,
                         step_aux(fgu, device), step_aux(fd, device),
                         gate_up_words=_aligned(fgu, gu_bytes, (table.gate, table.up), host[:2], Q8_0, 4),
                         down_words=_aligned(fd, d_bytes, (table.down,), host[2:], Q8_0, 4),
                         gate_up_vec=_aligned(fgu, gu_bytes, (table.gate, table.up), host[:2], _vec_type(fgu), 16),
                         down_vec=_aligned(fd, d_bytes, (table.down,), host[2:], _vec_type(fd), 16))


def _vec_type(fam: dispatch.Family) -> object:
    """The type whose rows the *_vec flags are about: a row-tile layout's own (its loads want the offsets known on
    16 bytes), else Q4_K (_q4_k_vec)."""
    return fam.qtype if fam.row_tile > 1 else Q4_K


def step_aux(fam: dispatch.Family, device: torch.device) -> torch.Tensor:
    """The codebook a family's MoE decode step reads: int8 words for its integer step, else float32."""
    return grids.grid_words(fam.grid, device) if fam.idot is not None else grids.grid_table(fam.grid, device)


Q8_0, Q4_K = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K


def tiled_gate_up(table: ExpertTable) -> ExpertTable:
    """The table with its Q4_K gate and up matrices repacked in place into q4_k_tiled's bytes (pack_raw: the
    byte order of the tiled GEMV's step, pairx by default; the same bytes of each matrix regrouped inside its
    4-row tiles, so offsets and sizes stay), their type q4_k_tiled.TILED; the down as it was.
    The buffers' GGUF bytes are gone after: keep a copy for a reference. (Session 9, moe20.)"""
    if table.gate_up_type != Q4_K or not q4_k_tiled.packable((table.width, table.dim)):
        raise dispatch.KernelArgumentError(
            f"could not repack the tiled MoE gate/up: needs Q4_K gate/up of whole {q4_k_tiled.TILE_ROWS}-row tiles, "
            f"got {table.gate_up_type.name} [{table.width}, {table.dim}]")
    _repack(((table.gate, table.gate_offsets), (table.up, table.up_offsets)), (table.width, table.dim), Q4_K,
            q4_k_tiled.pack_raw)
    return replace(table, gate_up_type=q4_k_tiled.TILED)


def tiled_down(table: ExpertTable) -> ExpertTable:
    """tiled_gate_up for the down: each expert's Q4_K down matrix [D, F] repacked in place into q4_k_tiled's
    bytes (whole 4-row tiles of the model width D), its type q4_k_tiled.TILED; gate and up as they were.
    (Session 10, moe21.)"""
    if table.down_type != Q4_K or not q4_k_tiled.packable((table.dim, table.width)):
        raise dispatch.KernelArgumentError(
            f"could not repack the tiled MoE down: needs a Q4_K down of whole {q4_k_tiled.TILE_ROWS}-row tiles, got "
            f"{table.down_type.name} [{table.dim}, {table.width}]")
    _repack(((table.down, table.down_offsets),), (table.dim, table.width), Q4_K, q4_k_tiled.pack_raw)
    return replace(table, down_type=q4_k_tiled.TILED)


# the nibble_tiles layouts by the GGUF type they repack (session 25: MXFP4, gpt-oss's; session 26: Q4_0)
NIBBLE_TILED = {GGMLQuantizationType.MXFP4: mxfp4_tiled, GGMLQuantizationType.Q4_0: q4_0_tiled}


def tiled_nibbles(table: ExpertTable, types: Sequence[GGMLQuantizationType] = tuple(NIBBLE_TILED)) -> ExpertTable:
    """The table with its projections of `types` (of NIBBLE_TILED) repacked in place into their nibble_tiles layout
    (each matrix's bytes regrouped inside its 16-row tiles, so offsets and sizes stay), their type the layout's
    TILED: gate and up [F, D] where F is whole tiles, the down [D, F] where D is, each where its type's integer step
    runs (the layout's step is); the others as they were. The buffers' GGUF bytes are gone after (the layout's
    unpack_raw gives them back). (Sessions 25-26.)"""
    def layout(qtype, shape):
        tiled = NIBBLE_TILED.get(qtype) if qtype in types else None
        return tiled if tiled is not None and tiled.FAMILY.idot is not None and tiled.packable(shape) else None

    gate_up = layout(table.gate_up_type, (table.width, table.dim))
    down = layout(table.down_type, (table.dim, table.width))
    if gate_up is None and down is None:
        raise dispatch.KernelArgumentError(
            f"could not repack the tiled experts: needs a gate/up or down of {' or '.join(t.name for t in types)} "
            f"in whole {nibble_tiles.TILE_ROWS}-row tiles with its integer step (${mxfp4.INT_ENV}, ${q4_0.INT_ENV} "
            f"not 0), got {table.gate_up_type.name} gate/up [{table.width}, {table.dim}], {table.down_type.name} down")
    if gate_up is not None:
        _repack(((table.gate, table.gate_offsets), (table.up, table.up_offsets)), (table.width, table.dim),
                table.gate_up_type, gate_up.pack_raw)
        table = replace(table, gate_up_type=gate_up.TILED)
    if down is not None:
        _repack(((table.down, table.down_offsets),), (table.dim, table.width), table.down_type, down.pack_raw)
        table = replace(table, down_type=down.TILED)
    return table


def _repack(matrices: Sequence[tuple[torch.Tensor, Sequence[int]]], shape: tuple[int, int],
            qtype: GGMLQuantizationType, pack: Callable[[torch.Tensor, tuple[int, int]], torch.Tensor]) -> None:
    """pack (a tiled layout's pack_raw) on each qtype matrix [rows, cols] of (buffer, offsets), in place; a matrix
    two entries share is repacked once."""
    span = shape[0] * dispatch.FAMILIES[qtype].row_bytes(shape[1])
    done = set()
    for buf, offsets in matrices:
        for o in (int(o) for o in offsets):
            if (buf.data_ptr(), o) not in done:
                done.add((buf.data_ptr(), o))
                buf[o:o + span] = pack(buf[o:o + span], shape)


def _aligned(fam: dispatch.Family, row_bytes: int, bufs: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor],
             qtype: GGMLQuantizationType, align: int) -> bool:
    """Whether these rows are qtype's and every one starts on `align` bytes (q8_0_words: 4, _q4_k_vec: 16; a row-tile
    layout's tiles, whatever its rows)."""
    return fam.qtype == qtype and (row_bytes % align == 0 or fam.row_tile > 1) \
        and all(b.data_ptr() % align == 0 for b in bufs) and all(not bool((o % align).any()) for o in offsets)


def offsets_on(tables: Sequence[Sequence[int] | torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Equally long offset tables (gate, up, down) as int64 on device in one host-to-device copy."""
    packed = torch.stack([torch.as_tensor(t, dtype=torch.int64).reshape(-1) for t in tables])
    return packed.to(device, non_blocking=True).unbind(0)


def moe_decode(table: ExpertTable | PreparedTable, x: torch.Tensor, route_weights: torch.Tensor, act: Act = "silu",
               out: torch.Tensor | None = None, gate_up: GemvConfig | None = None,
               down: GemvConfig | None = None, round_h: Callable[[torch.Tensor], torch.Tensor] | None = None,
               round_x: Callable[[torch.Tensor], torch.Tensor] | None = None,
               residual: torch.Tensor | None = None, qx: act_quant.QuantX | None = None,
               kernels: Kernels | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """One token through the table's experts: sum_i w[i] * down_i(act(gate_i x, up_i x)).

    x float32 [D]; route_weights float32 [n] (one per table entry, or per selected expert of a
    PreparedTable.select, on x's device) -> y [D] (written into `out` if given: float32 [D] on
    x's device). residual (float32 [D]): y = that sum + residual, the same bits as adding it
    after, in the down launch where it can. gate_up/down: tile shapes (their split is ignored for
    gate/up, whose activation needs whole sums; down's split and atomic are explained in the
    module docstring, its fold where the ranges meet: "kernel", by the last program of each row
    tile, or "torch", one more launch); None: the families' defaults (decode_tiles).
    A projection whose family has an integer step quantizes its input itself as llama.cpp does
    (x before gate/up, the activations [n, F] before down). For the others, round_x and round_h
    (if given) round x and the activations in torch first (the routing weight then applies after
    the rounding, between the two launches). qx: x already quantized to the gate/up family's
    blocks (by the norm that made x, act_quant.attach): no quantization launch for x.
    kernels: the code the integer launches run (Kernels; None: decode_kernels()).
    bias (gpt-oss's expert biases): float32 [entries, 2F + D] on x's device, a row per entry of the offset tables
    (a selection through ids: the full table's, each selected expert's row read through its id; else in the order of
    route_weights), its gate, up and down biases: act(gate_i x + its gate bias, ...), and y += sum_i w[i] * its down
    bias, added by the down launch (llama.cpp adds it to each expert's output before the weighted sum: the same
    terms). Session 25: read in the launches (before, a selection's rows were gathered and the down's added by an
    addmv: two launches a layer, 6.7 us of gpt-oss's 110 on the H200).
    No host sync: usable in a CUDA graph capture."""
    what = "the MoE decode kernels"
    act_args(act, what)  # a bad activation refused before any launch
    p = table if isinstance(table, PreparedTable) else prepare(table, x.device, what)
    if p.device != x.device:
        raise dispatch.KernelArgumentError(f"could not run {what}: the table was prepared for "
                                           f"{p.device}, activations are on {x.device}")
    dispatch.check_activations(x, p.table.dim, what)
    n, D = p.count, p.table.dim  # a selection may hold fewer than the table
    if x.dim() != 1 or route_weights.shape != (n,) or route_weights.dtype != torch.float32 \
            or route_weights.device != x.device:
        raise dispatch.KernelArgumentError(
            f"could not run {what}: need x [{D}] and float32 route weights [{n}] on {x.device}, got "
            f"x {list(x.shape)}, weights {list(route_weights.shape)} {route_weights.dtype} on "
            f"{route_weights.device}")
    dispatch.check_out(out, (D,), x.device, what)
    check_qx(qx, p.gate_up, D, what)
    if residual is not None:
        dispatch.check_out(residual, (D,), x.device, f"{what} (residual)")
    F, entries = p.table.width, p.gate_off.numel()
    if bias is not None and (bias.shape != (entries, 2 * F + D) or bias.dtype != torch.float32
                             or bias.device != x.device or bias.stride(1) != 1 or bias.stride(0) != 2 * F + D):
        raise dispatch.KernelArgumentError(
            f"could not run {what}: expert biases must be contiguous float32 [{entries}, {2 * F + D}] (gate, up, down; "
            f"a row per entry of the offset tables) on {x.device}, got {bias.dtype} {list(bias.shape)} strides "
            f"{list(bias.stride())} on {bias.device}")
    rw = route_weights.contiguous()
    tiles = decode_tiles(p)
    gate_up, down = gate_up or tiles[0], down or tiles[1]
    kernel_folds(down, 1)  # a bad fold name refused before any launch
    check_one_tile(p.down, down, what)  # (a tiled down's step)
    # the weight goes in after down's input is rounded: in the gate/up launch only if nothing rounds h
    late_rw = p.down.idot is not None or round_h is not None
    kernels = _early(p, down, kernels or decode_kernels())
    h = _gate_up(p, x, rw, not late_rw, act, gate_up, round_x, what, qx, kernels, bias)
    y = torch.empty(D, dtype=torch.float32, device=x.device) if out is None else out
    _down(p, h, rw, y, down, round_h, residual, kernels, bias)
    return y


def down_input(p: PreparedTable, x: torch.Tensor, act: Act = "silu", gate_up: GemvConfig | None = None,
               kernels: Kernels | None = None, rounded: bool = True, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [n, F]: the activations moe_decode's down multiplies (routing weight not in them; bias: moe_decode's),
    from the gate/up launch at this tile; rounded by the engine's act_quant as the down's integer
    step reads them (rounded=False: h before rounding, from the launch without fuse_quant). For
    references: a float64 down over these meets no rounding boundary a near-tie could flip (session 8)."""
    gate_up = gate_up or decode_tiles(p)[0]
    if not rounded:
        gate_up = replace(gate_up, fuse_quant=False)
    ones = torch.ones(p.count, dtype=torch.float32, device=x.device)
    h = _gate_up(p, x, ones, False, act, gate_up, None, "the MoE down's input", None, kernels, bias)
    if not rounded or p.down.idot is None:
        return h
    return (h if isinstance(h, act_quant.QuantX) else act_quant.quantize(h, p.down.act_fmt)).dequantize()


def _ids(p: PreparedTable) -> dict:
    """The kernels' ids arguments: the selection, or (none) any pointer, never read."""
    return dict(ids_ptr=p.gate_off if p.ids is None else p.ids, IDS=p.ids is not None)


def _gate_up(p: PreparedTable, x: torch.Tensor, rw: torch.Tensor, use_rw: bool, act: Act, cfg: GemvConfig,
             round_x: Callable[[torch.Tensor], torch.Tensor] | None, what: str,
             qx: act_quant.QuantX | None = None, kernels: Kernels | None = None,
             bias: torch.Tensor | None = None) -> torch.Tensor | act_quant.QuantX:
    """h [n, F] = act(gate x, up x), times rw if use_rw, one launch over all n experts; quantized
    for the down projection already (act_quant.QuantX) if cfg.fuse_quant. bias: moe_decode's (gate and up biases
    added before the activation; moe_pipe's kernel takes none)."""
    biases = dict(b_ptr=bias, BSTRIDE=bias.stride(0), BIAS=True) if bias is not None else {}
    kernels = kernels or decode_kernels()
    n, D, F = p.count, p.table.dim, p.table.width
    grid = (triton.cdiv(F, cfg.block_n), n)
    if p.gate_up.idot is not None:
        check_one_tile(p.gate_up, cfg, what)
        hq = _fused_h(p, cfg, x.device, what)
        h = torch.empty(n, F, dtype=torch.float32, device=x.device) if hq is None else hq.words
        hd, hs = (h, h) if hq is None else (hq.scales, hq.sums)
        hblock = 0 if hq is None else act_quant.BLOCKS[p.down.act_fmt]
        late = 0 < cfg.block_n < hblock  # blocks quantized by their last program: float h first
        hf = torch.empty(n, F, dtype=torch.float32, device=x.device) if late else h
        q = act_quant.quantize(x[None], p.gate_up.act_fmt) if qx is None else qx
        words = _use_words(kernels, cfg, p.gate_up_words)
        common = dict(rw_ptr=rw, h_ptr=h, hd_ptr=hd, hs_ptr=hs, hf_ptr=hf,
                      tickets_ptr=tickets(n * F // hblock, x.device) if late else hf, F=F, row_bytes=p.gate_up_row_bytes,
                      **_ids(p), DOWN_AT_START=(down_launch_at_start(D) if kernels.down_at_start is None
                                                else kernels.down_at_start),
                      BLOCK_N=cfg.block_n, EMU=emulate(cfg, x), **act_args(act, what), RW=use_rw, HBLOCK=hblock,
                      H8K=p.down.act_fmt == act_quant.Q8_K, num_warps=cfg.num_warps,
                      enable_fp_fusion=hq is None)  # act_quant's exact rounding needs it off
        per_sm = pipe_programs(D, cfg) if kernels.pipe is None else kernels.pipe
        if bias is None and _pipe_ok(per_sm, kernels, cfg, words, F, D):  # session 19: moe_pipe's persistent kernel
            n_tiles = grid[0] * n
            moe_pipe.gate_up_kernel[(moe_pipe.programs(n_tiles, per_sm, x.device),)](
                p.table.gate, p.table.up, p.gate_off, p.up_off, xw_ptr=q.words, xd_ptr=q.scales, n_tiles=n_tiles,
                OFF=_aligned_offset, OUT=_gate_up_out, SUMS=row_sums, G=D // 256, UNROLL=cfg.unroll,
                **{k: v for k, v in int_args(p.gate_up).items() if k != "IDOT"}, **common, **pdl.launch(x.device))
            return h if hq is None else hq
        _igate_up_kernel[grid](p.table.gate, p.table.up, p.gate_up_aux, p.gate_off, p.up_off, xw_ptr=q.words,
                               xd_ptr=q.scales, xs_ptr=q.sums, D=D,
                               **_int_args(p.gate_up, words, _use_vec(kernels.q4k_vec, p.gate_up_vec),
                                           kernels.full and _full(F, D, cfg)),
                               PAIR=kernels.pair, TILED=p.gate_up.row_tile > 1, UNROLL=cfg.unroll,
                               **_pairx_gate_up(p, cfg, kernels), DOWN_EARLY=bool(kernels.down_early),
                               EW=cfg.elementwise, STAGES=stages_arg(cfg), **common, **biases, **pdl.launch(x.device))
        return h if hq is None else hq
    h = torch.empty(n, F, dtype=torch.float32, device=x.device)
    x = x if round_x is None else round_x(x).contiguous()
    _gate_up_kernel[grid](p.table.gate, p.table.up, p.gate_up_aux, p.gate_off, p.up_off, x_ptr=x, rw_ptr=rw,
                          h_ptr=h, F=F, D=D, row_bytes=p.gate_up_row_bytes, **_ids(p), **family_args(p.gate_up),
                          BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, EW=cfg.elementwise, **act_args(act, what),
                          RW=use_rw, STAGES=stages_arg(cfg), num_warps=cfg.num_warps, **biases, **pdl.launch(x.device))
    return h


def _pairx_gate_up(p: PreparedTable, cfg: GemvConfig, kernels: Kernels) -> dict:
    """The gate/up launch's NG: the row's groups for q4_k_pair.gate_up's loop (moe_tiles.pairx_way "steps") where the
    rows are pairx's on the one-warp 4-row tile and a row is whole steps of the tile's groups; else 0 (the loop)."""
    ok = (pairx_way(kernels, p.table.dim) == "steps" and p.gate_up.qtype == q4_k_tiled.TILED
          and (cfg.block_n, cfg.num_warps) == (4, 1) and cfg.elementwise and p.table.dim % (256 * cfg.unroll) == 0)
    return dict(NG=p.table.dim // 256 if ok else 0)


def _pipe_ok(per_sm: int, kernels: Kernels, cfg: GemvConfig, words: bool, rows: int, width: int) -> bool:
    """Whether the gate/up runs moe_pipe's kernel: per_sm > 0 (Kernels.pipe or the width's), and its one step
    (q8_0_words.idot_full, the elementwise tile, gate and up in one loop) where the grid kernel would run it."""
    return per_sm > 0 and words and kernels.full and kernels.pair and cfg.elementwise \
        and _full(rows, width, cfg) and cfg.unroll in (1, 2, 4)


def _ahead_ok(on: bool, kernels: Kernels, cfg: GemvConfig, words: bool, rows: int, width: int) -> bool:
    """Whether the down runs moe_down_ahead's loop: on (Kernels.down_ahead or the width's), and its one step
    (q8_0_words.idot_full, the elementwise tile) where the grid kernel would run it, in steps of 1 to 4 groups."""
    return on and words and kernels.full and cfg.elementwise and _full(rows, width, cfg) and cfg.unroll in (1, 2, 3, 4)


def _pairx_ahead_ok(on: bool, kernels: Kernels, cfg: GemvConfig, rows: int, width: int) -> bool:
    """Whether the pairx down runs q4_k_pair.down_sums: on, and its step where the grid kernel runs the constant trip
    count (Kernels.down_full, moe._full) on the one-warp 4-row elementwise tile, in steps of 1 to 3 groups."""
    return on and "Q4_K_TILED" in kernels.down_full and cfg.block_n == 4 and cfg.num_warps == 1 \
        and cfg.elementwise and _full(rows, width, cfg) and cfg.unroll in (1, 2, 3)


def _pairx_ahead(p: PreparedTable, cfg: GemvConfig, kernels: Kernels) -> bool:
    """Whether the down runs q4_k_pair.down_sums (the pairx down ahead, _pairx_ahead_ok): on pairx's bytes only (not
    $SPARKD_Q4K_LOADS' other layouts), at the width's rule or Kernels.pairx_down_ahead."""
    on = pairx_down(p.table.dim) if kernels.pairx_down_ahead is None else kernels.pairx_down_ahead
    return p.down.idot is q4_k_pair.idot and _pairx_ahead_ok(on, kernels, cfg, p.table.dim, p.table.width)


def _early(p: PreparedTable, down: GemvConfig, kernels: Kernels) -> Kernels:
    """kernels with down_early decided for a layer (Kernels.down_early; None: moe_tiles.down_early): only where the
    down runs down_sums after the pairx gate/up's _igate_up_kernel, which then lets it launch after its own wait
    (pdl.py's exception)."""
    on = down_early() if kernels.down_early is None else kernels.down_early
    return replace(kernels, down_early=on and p.gate_up.qtype == q4_k_tiled.TILED and _pairx_ahead(p, down, kernels))


def _use_words(kernels: Kernels, cfg: GemvConfig, rows_on_words: bool) -> bool:
    """q8_0_words for these rows: not under Triton's pipeliner (cfg.stages), which stages every
    load in shared memory, and words' scale and x loads in the weights' shape overflow it at wide
    tiles (64 rows, 3 stages: 256 KiB on the H200, whose limit is 227)."""
    return kernels.words and rows_on_words and not cfg.stages


def _use_vec(on: bool, rows_on_16: bool) -> bool:
    """_q4_k_vec for these rows (on: the Kernels flag of the launch), else q4_k's step. Every tile
    since session 8 (diag16: row_tiles.row_sums; the H200 had given wrong sums for 2-row tiles with
    the tl.sum row sums, bench/results/moe_tiles_h200_s6_moe10_call2.log)."""
    return on and rows_on_16


def _full(rows: int, width: int, cfg: GemvConfig) -> bool:
    """Whether every row and group a launch's loop steps read is in range: rows a multiple of the
    tile, the width a multiple of a loop step's groups (q8_0_words.idot_full then needs no mask)."""
    return rows % cfg.block_n == 0 and width % (256 * cfg.unroll) == 0


def _int_args(fam: dispatch.Family, words: bool, vec: bool, full: bool = False) -> dict:
    """matmul.int_args, with q8_0_words' step for Q8_0 rows on 4 bytes if words (its unmasked
    idot_full if full: _full), _q4_k_vec's for Q4_K rows on 16 bytes if vec (ALIGN: what the
    offsets are known to be a multiple of; a tiled family keeps its own step)."""
    word_step = q8_0_words.idot_full if full else q8_0_words.idot
    step = dict(IDOT=word_step) if words else dict(IDOT=_q4_k_vec) if vec and fam.row_tile == 1 else {}
    return int_args(fam) | step | dict(ALIGN=16 if vec else 1)


def _fused_h(p: PreparedTable, cfg: GemvConfig, device: torch.device, what: str) -> act_quant.QuantX | None:
    """The buffers gate/up quantizes h into (cfg.fuse_quant), or None: h stays float32."""
    if not cfg.fuse_quant:
        return None
    block = act_quant.BLOCKS.get(p.down.act_fmt or "", 0)
    if not block or (cfg.block_n % block and block % cfg.block_n):
        need = f"a multiple or divisor of {block} rows" if block else "a down type with an integer step"
        raise dispatch.KernelArgumentError(
            f"could not run {what}: fuse_quant needs {need} (gate/up tile of {cfg.block_n} rows, down "
            f"{p.down.qtype.name}); turn fuse_quant off or change the tile")
    return act_quant.empty(p.count, p.table.width, p.down.act_fmt, device)


def _down(p: PreparedTable, h: torch.Tensor | act_quant.QuantX, rw: torch.Tensor, y: torch.Tensor, cfg: GemvConfig,
          round_h: Callable[[torch.Tensor], torch.Tensor] | None, residual: torch.Tensor | None,
          kernels: Kernels | None = None, bias: torch.Tensor | None = None) -> None:
    """y = sum_a down_a @ h[a] (+ residual), the routing weight applied here unless already in h; bias
    (moe_decode's): plus sum_a rw[a] * a's down bias, added by each range's program (_down_biases).
    cfg.split ranges of experts run in parallel and meet in an ordered sum: in the launch
    (cfg.fold "kernel") or by torch after it (cfg.atomic: one expert per program, atomic adds into y
    zeroed first, the way before session 3 made the sums ordered)."""
    kernels = kernels or decode_kernels()
    n, D, F = p.count, p.table.dim, p.table.width
    split = n if cfg.atomic else max(1, min(cfg.split, n))
    fold = kernel_folds(cfg, split)
    part = torch.empty(split, D, dtype=torch.float32, device=y.device) if fold else partials_for(y, split, cfg)
    res = residual is not None and (split == 1 or fold)  # the residual added in the launch
    grid = (triton.cdiv(D, cfg.block_n), split)
    common = dict(y_ptr=y, part_ptr=part, res_ptr=residual if res else y,
                  tickets_ptr=tickets(grid[0], y.device) if fold else y, D=D, F=F, n=n,
                  row_bytes=p.down_row_bytes, RES=res, FOLD=fold, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll,
                  EW=cfg.elementwise, SPLIT=split, ATOMIC=cfg.atomic, STAGES=stages_arg(cfg),
                  num_warps=cfg.num_warps, rw_ptr=rw, **_ids(p))
    if bias is not None:
        common.update(b_ptr=bias, BSTRIDE=bias.stride(0), BOFF=2 * F, BIAS=True)
    if p.down.idot is not None:
        q = h if isinstance(h, act_quant.QuantX) else act_quant.quantize(h, p.down.act_fmt)
        words = _use_words(kernels, cfg, p.down_words)
        if p.down.row_tile > 1:
            ahead = _pairx_ahead(p, cfg, kernels)
        else:
            ahead = _ahead_ok(down_ahead(D) if kernels.down_ahead is None else kernels.down_ahead, kernels, cfg,
                              words, D, F)
        pair = fold and split == 2 and (pair_fold(D, p.down.qtype.name) if kernels.down_pair_fold is None
                                        else kernels.down_pair_fold)
        if pair:  # fold_pair's slots where fold_part's tickets go
            common["tickets_ptr"] = pair_slots(D, y.device)
        _idown_kernel[grid](p.table.down, p.down_aux, p.down_off, hw_ptr=q.words, hd_ptr=q.scales, hs_ptr=q.sums,
                            **_int_args(p.down, words, _use_vec(kernels.q4k_vec_down, p.down_vec),
                                        kernels.full and _full(D, F, cfg)),
                            EMU=emulate(cfg, y), XBLOCK=act_quant.BLOCKS[p.down.act_fmt],
                            NG=F // 256 if ahead or p.down.qtype.name in kernels.down_full and _full(D, F, cfg) else 0,
                            TILED=p.down.row_tile > 1, AHEAD=ahead, PAIR_FOLD=pair,
                            EARLY=bool(kernels.down_early) and ahead,
                            **common, **pdl.launch(y.device))
    else:
        if round_h is not None:
            h = (round_h(h) * rw[:, None]).contiguous()
        _down_kernel[grid](p.table.down, p.down_aux, p.down_off, h_ptr=h, **family_args(p.down), **common,
                           **pdl.launch(y.device))
    if not fold:
        fold_partials(part, y)
    if residual is not None and not res:
        y.add_(residual)  # the same bits as residual + y
