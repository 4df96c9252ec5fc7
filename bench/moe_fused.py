"""The MoE decode layer in one launch, split over the expert width: a bench-only variant (session 14,
moe24f), timed against the engine's two launches by moe_tiles_bench.py --fused; it lost 10-30x at every
shape (docs/performance.md, "Session 14: the MoE layer in one launch"), so the engine does not run it.

A program per (chunk of `chunk` expert rows, selected expert) computes its chunk's gate and up rows over the
whole model width (x quantized once, the engine's gate/up step moe._gate_up_idot), the activation, stores the
chunk's h and quantizes it in the down's own blocks (act_quant: Q8_0's 32 or Q8_K's 256; the chunk holds whole
blocks, as the engine's gate/up tile does when it holds whole blocks), then multiplies the down's columns
[i0, i0 + chunk) of every model-width row by it (the down's GGUF rows as they are: a chunk of whole 256-column
groups takes the family's step per group; a Q8_0 down on 4-byte words q8_0_words.idot_blocks, one step of the
chunk's blocks, so chunks of 64 and 128 too), times the routing weight, and stores the partial y as row
(expert, chunk) of [A * F / chunk, D] partials. The model width's row tiles fall in at most FOLD_SEGMENTS
segments with a ticket each (acq_rel, as matmul.fold_part): the last program to finish a segment adds its
partials, FOLD_PARTS a load in the compiled tl.sum's order, the loads in partial order (the same bits on every
run and in a CUDA graph), the residual after, and sets the ticket back to 0.

The same integer sums per block as the engine's two launches, the float sums in another order: within the
float32 bound of the references over the launch's own h (fused_decode returns it). Row-tile layouts (resident
Q4_K's pairx) are refused: q4_k_pair's step finds its row tile by the program id.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, dispatch, pdl, q8_0_words
from sparkd.engine.kernels.matmul import tickets
from sparkd.engine.kernels.moe import (ACT_CODES, PreparedTable, _activate, _aligned_offset, _full,
                                       _gate_up_idot, _ids, _int_args, _use_vec, _use_words)
from sparkd.engine.kernels.moe_tiles import Kernels, decode_kernels
from sparkd.engine.kernels.row_tiles import row_sums

# the fold: the model width's row tiles in at most FOLD_SEGMENTS segments, a ticket each (a program takes one
# ticket per segment, not per row tile: each is a fence), FOLD_PARTS partials a load of the folding program
FOLD_SEGMENTS = 16
FOLD_PARTS = tl.constexpr(32)


@dataclass(frozen=True)
class FusedTile:
    """The launch's shape: chunk expert rows a program (the down's columns it multiplies), gate_rows of
    them a gate/up step (unroll groups of x a loop step, elementwise: the family's elementwise tile),
    down_rows model-width rows a down step (down_elementwise likewise), num_warps a program; fold False
    (benches: the fold's cost) stores the partials only, y left unwritten."""

    chunk: int = 256
    gate_rows: int = 4
    down_rows: int = 16
    num_warps: int = 4
    unroll: int = 1
    elementwise: bool = True
    down_elementwise: bool = True
    fold: bool = True


def tag(t: FusedTile) -> str:
    """A tile as text (benches): chunk c, gate rows g, down rows d, warps w, unroll u, e|g twice, nf: no fold."""
    ew = "".join("e" if e else "g" for e in (t.elementwise, t.down_elementwise))
    return f"c{t.chunk}g{t.gate_rows}d{t.down_rows}w{t.num_warps}u{t.unroll}{ew}" + ("" if t.fold else "nf")


def _misfit(p: PreparedTable, t: FusedTile) -> str:
    """Why tile t cannot run p's layer in one launch ("" if it can)."""
    F = p.table.width
    hblock = act_quant.BLOCKS[p.down.act_fmt]
    sliced = p.down.qtype.name == "Q8_0" and t.chunk in (64, 128)  # q8_0_words.idot_blocks
    if p.gate_up.idot is None or p.down.idot is None:
        return "gate/up and down types with an integer step"
    if t.chunk % hblock or not (t.chunk % 256 == 0 or sliced):
        return f"a chunk of whole 256-column groups (or 64 / 128 for a Q8_0 down), holding whole {hblock}-value blocks"
    if F % t.chunk:
        return f"an expert width that is a multiple of the chunk ({F} rows)"
    if t.chunk % t.gate_rows:
        return "gate/up steps of rows that divide the chunk"
    if p.gate_up.row_tile > 1 or p.down.row_tile > 1:  # (q4_k_pair's step finds its row tile by the program id)
        return "GGUF rows (not a row-tile layout such as resident Q4_K's pairx)"
    if sliced and not p.down_words:
        return "a Q8_0 down on 4-byte words (q8_0_words) for a chunk below 256"
    return ""


@triton.jit(do_not_specialize=["n_parts", "seg_tiles"])
def _fused_kernel(gate_ptr, up_ptr, down_ptr, gate_off, up_off, down_off, ids_ptr, xw_ptr, xd_ptr, xs_ptr, rw_ptr,
                  hf_ptr, hw_ptr, hd_ptr, hs_ptr, part_ptr, tickets_ptr, y_ptr, res_ptr, F, D, n_parts, seg_tiles,
                  gu_row_bytes, d_row_bytes, IDS: tl.constexpr, GIDOT: tl.constexpr, GA1: tl.constexpr,
                  GA2: tl.constexpr, GA3: tl.constexpr, GALIGN: tl.constexpr, DIDOT: tl.constexpr, DA1: tl.constexpr,
                  DA2: tl.constexpr, DA3: tl.constexpr, DALIGN: tl.constexpr, CHUNK: tl.constexpr,
                  GBN: tl.constexpr, BD: tl.constexpr, UNROLL: tl.constexpr, GEW: tl.constexpr, DEW: tl.constexpr,
                  EMU: tl.constexpr, ACT: tl.constexpr, HBLOCK: tl.constexpr, H8K: tl.constexpr, PAIR: tl.constexpr,
                  FOLD: tl.constexpr, RES: tl.constexpr, SLICE: tl.constexpr, STAGES: tl.constexpr = None,
                  PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    c = tl.program_id(0)
    a = tl.program_id(1)
    i0 = c * CHUNK
    g_off = _aligned_offset(gate_off, ids_ptr, a, IDS, GALIGN)
    u_off = _aligned_offset(up_off, ids_ptr, a, IDS, GALIGN)
    for r0 in range(0, CHUNK, GBN):  # the chunk's gate and up rows, GBN a step, into float h
        rows = i0 + r0 + tl.arange(0, GBN)
        rmask = rows < F
        rb = rows.to(tl.int64) * gu_row_bytes
        g, u = _gate_up_idot(gate_ptr, up_ptr, g_off + rb, u_off + rb, rmask, xw_ptr, xd_ptr, xs_ptr, D, GIDOT, GA1,
                             GA2, GA3, UNROLL, GEW, EMU, STAGES, PAIR)
        tl.store(hf_ptr + a * F + rows, _activate(g, u, ACT), mask=rmask)
    tl.debug_barrier()  # every thread's h stored before the block's threads quantize it
    NB: tl.constexpr = CHUNK // HBLOCK
    b = c * NB + tl.arange(0, NB)[:, None]  # [NB, 1] the chunk's blocks of h's row
    v = tl.load(hf_ptr + a * F + b * HBLOCK + tl.arange(0, HBLOCK)[None, :])
    hw, hd, hs = hw_ptr + a * (F // 4), hd_ptr + a * (F // HBLOCK), hs_ptr + a * (F // 32)
    act_quant.store_blocks(hw, hd, hs, v, b, b * HBLOCK < F, H8K)
    tl.debug_barrier()  # the quantized h stored before the down's steps read it
    w = tl.load(rw_ptr + a)
    e_off = _aligned_offset(down_off, ids_ptr, a, IDS, DALIGN)
    part = a * tl.num_programs(0) + c
    n_tiles = tl.cdiv(D, BD)
    for t in range(0, n_tiles):
        rows = t * BD + tl.arange(0, BD)
        rmask = rows < D
        rb = rows.to(tl.int64) * d_row_bytes
        if DEW:
            acc = tl.zeros((BD, DA1, DA2), tl.float32)
        else:
            acc = tl.zeros((BD,), tl.float32)
        if SLICE:  # a Q8_0 words down: the chunk's blocks in one step
            acc = q8_0_words.idot_blocks(down_ptr, e_off + rb, rmask, hw, hd, hs, c, F, acc, DEW, EMU, CHUNK // 32)
        else:  # the chunk's whole groups of the row
            for j in tl.static_range(CHUNK // 256):
                acc = DIDOT(down_ptr, e_off + rb, rmask, hw, hd, hs, c * (CHUNK // 256) + j, F, acc, DEW, EMU)
        if DEW:
            acc = row_sums(acc, DA1, DA2, DA3)
        tl.store(part_ptr + part * D + rows, acc * w, mask=rmask)
        if FOLD:
            if ((t + 1) % seg_tiles == 0) | (t == n_tiles - 1):  # a fold segment's rows done
                seg = t // seg_tiles
                tl.debug_barrier()  # every thread's stores are issued before the ticket (acq_rel) publishes them
                if tl.atomic_add(tickets_ptr + seg, 1, sem="acq_rel") == n_parts - 1:
                    for t2 in range(seg * seg_tiles, t + 1):
                        _fold_tile(part_ptr, y_ptr, res_ptr, t2 * BD + tl.arange(0, BD), D, n_parts, RES)
                    tl.store(tickets_ptr + seg, 0)


@triton.jit
def _fold_tile(part_ptr, y_ptr, res_ptr, rows, D, n_parts, RES: tl.constexpr):
    """y[rows] = the sum of the n_parts partials' rows (+ the residual): FOLD_PARTS partials a step, each step's
    sum in the compiled tl.sum's fixed order, the steps in partial order (the same bits on every run)."""
    rmask = rows < D
    total = tl.zeros(rows.shape, tl.float32)
    for s0 in range(0, n_parts, FOLD_PARTS):
        s = s0 + tl.arange(0, FOLD_PARTS)[:, None]
        # .cg: the other programs' stores from L2, never an L1 line
        v = tl.load(part_ptr + s * D + rows[None, :], mask=(s < n_parts) & rmask[None, :], other=0.0,
                    cache_modifier=".cg")
        total += tl.sum(v, 0)
    if RES:
        total = total + tl.load(res_ptr + rows, mask=rmask)
    tl.store(y_ptr + rows, total, mask=rmask)


def _named(args: dict, prefix: str) -> dict:
    """moe._int_args' step arguments under the kernel's names for one projection (G: gate/up, D: down)."""
    return {prefix + k: v for k, v in args.items()}


def fused_decode(p: PreparedTable, x: torch.Tensor, rw: torch.Tensor, act: str, y: torch.Tensor, tile: FusedTile,
                 residual: torch.Tensor | None = None, qx: act_quant.QuantX | None = None,
                 kernels: Kernels | None = None, what: str = "the fused MoE decode kernel") -> torch.Tensor:
    """y = sum_a rw[a] * down_a(act(gate_a x, up_a x)) (+ residual) in one launch at tile (p prepared for x's
    device, rw float32 [A], y float32 [D]; the tile checked here) -> the float32 h [A, F] (routing weight not in
    it) the launch quantized for the down (references: the down over it, rounded by act_quant, meets no rounding
    boundary apart)."""
    why = _misfit(p, tile)
    if why:
        raise dispatch.KernelArgumentError(f"could not run {what}: tile {tag(tile)} needs {why} "
                                           f"({p.gate_up.qtype.name} gate/up, {p.down.qtype.name} down, "
                                           f"[{p.table.dim}, {p.table.width}])")
    kernels = kernels or decode_kernels()
    n, D, F = p.count, p.table.dim, p.table.width
    chunks = F // tile.chunk
    hf = torch.empty(n, F, dtype=torch.float32, device=x.device)
    hq = act_quant.empty(n, F, p.down.act_fmt, x.device)
    part = torch.empty(n * chunks, D, dtype=torch.float32, device=x.device)
    q = act_quant.quantize(x[None], p.gate_up.act_fmt) if qx is None else qx
    sliced = p.down.qtype.name == "Q8_0" and p.down_words  # q8_0_words.idot_blocks: one step a chunk
    rows = _Rows(tile.gate_rows, tile.unroll)
    gu = _int_args(p.gate_up, _use_words(kernels, rows, p.gate_up_words), _use_vec(kernels.q4k_vec, p.gate_up_vec),
                   kernels.full and _full(F, D, rows))
    dn = _int_args(p.down, _use_words(kernels, rows, p.down_words), _use_vec(kernels.q4k_vec_down, p.down_vec))
    if sliced:  # the elementwise tile of idot_blocks
        dn["A1"] = tile.chunk // 32
    res = residual is not None and tile.fold
    _fused_kernel[(chunks, n)](
        p.table.gate, p.table.up, p.table.down, p.gate_off, p.up_off, p.down_off, xw_ptr=q.words, xd_ptr=q.scales,
        xs_ptr=q.sums, rw_ptr=rw, hf_ptr=hf, hw_ptr=hq.words, hd_ptr=hq.scales, hs_ptr=hq.sums, part_ptr=part,
        tickets_ptr=tickets(FOLD_SEGMENTS, x.device), y_ptr=y, res_ptr=residual if res else y, F=F, D=D,
        n_parts=n * chunks, seg_tiles=triton.cdiv(triton.cdiv(D, tile.down_rows), FOLD_SEGMENTS),
        gu_row_bytes=p.gate_up_row_bytes, d_row_bytes=p.down_row_bytes, **_ids(p), **_named(gu, "G"),
        **_named(dn, "D"), CHUNK=tile.chunk,
        GBN=tile.gate_rows, BD=tile.down_rows, UNROLL=tile.unroll, GEW=tile.elementwise,
        DEW=tile.down_elementwise, EMU=not x.is_cuda, ACT=ACT_CODES[act],
        HBLOCK=act_quant.BLOCKS[p.down.act_fmt], H8K=p.down.act_fmt == act_quant.Q8_K,
        PAIR=kernels.pair, FOLD=tile.fold, RES=res, SLICE=sliced, num_warps=tile.num_warps,
        enable_fp_fusion=False,  # act_quant's exact rounding needs it off
        **pdl.launch(x.device))
    if residual is not None and not res:
        y.add_(residual)
    return hf


@dataclass(frozen=True)
class _Rows:
    """What moe._full and moe._use_words read of a GemvConfig: a step's rows and groups, no pipeliner stages."""

    block_n: int
    unroll: int
    stages: int = 0
