"""Routed experts for many tokens (prefill) straight from raw GGUF blocks, on moe.py's expert tables.

Tokens are grouped by expert; each projection is one grouped GEMM launch over every expert's token tiles
(prefill_gemm.grouped_gemm); the work around them is a few torch ops and two small launches (PREFILL_GLUE: the
tiles, then each token's weighted slot-ordered sum). PREFILL "loop": a GEMM per expert and projection, the way
before session 9.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from sparkd.engine import switches
from sparkd.engine.kernels import EXPERT_SLAB_BYTES, SLAB_TYPES, act_quant, dispatch, prefill_gemm
from sparkd.engine.kernels.moe import OAI_ALPHA, OAI_LIMIT, Act, ExpertTable, PreparedTable, act_args, prepare
from sparkd.engine.kernels.prefill_gemm import GEMM_BLOCK_T, GROUPED_BLOCK_TS, gemm, grouped_gemm, int_gemm
from sparkd.engine.kernels.dequantize import dequantize_experts

# moe_prefill's way: "grouped" (session 9: three grouped GEMM launches a layer, no sync per expert)
# or "loop" (a GEMM per expert and projection, the way before)
PREFILL = switches.choice("SPARKD_MOE_PREFILL", ("grouped", "loop"), "grouped")
# the grouped integer GEMMs' expert tile height (rows of one expert a program): "auto" each layout's
# (prefill_gemm.IgemmTile.expert_rows: session 10's 32, a weight block read once per 32 rows, the fastest on the H200
# at 512 and 2048 tokens; MXFP4's resident experts 64 since session 42), or one for all ("16" the way before session
# 10); float GEMMs keep GEMM_BLOCK_T
PREFILL_TILE = switches.choice("SPARKD_MOE_PREFILL_TILE", ("auto", *map(str, GROUPED_BLOCK_TS)), "auto")
# the grouped way's glue around its GEMMs: "kernels" (session 10: expert_tiles one launch, the route
# weights and each token's slot-ordered sum one combine launch) or "torch" (~40 torch ops a layer, as before)
PREFILL_GLUE = switches.choice("SPARKD_MOE_PREFILL_GLUE", ("kernels", "torch"), "kernels")


def tile_rows(gate_up: dispatch.Family, down: dispatch.Family, precision: str) -> int:
    """The grouped GEMMs' expert tile height: taller than GEMM_BLOCK_T where all three GEMMs are integer (their sums do
    not depend on the tile): PREFILL_TILE's, under "auto" the shorter of the two layouts' (IgemmTile.expert_rows)."""
    if not (int_gemm(gate_up, precision) and int_gemm(down, precision)):
        return GEMM_BLOCK_T
    if PREFILL_TILE != "auto":
        return int(PREFILL_TILE)
    # (through the module: benches and tests swap igemm_tile)
    return min(prefill_gemm.igemm_tile(f, True).expert_rows for f in (gate_up, down))


def _act_torch(g: torch.Tensor, u: torch.Tensor, act: Act) -> torch.Tensor:
    """moe._activate in torch (the layers' own functions: ffn.py, situ.py)."""
    name, a, b = (act, 0.0, 0.0) if isinstance(act, str) else act
    if name == "silu":
        return torch.nn.functional.silu(g) * u
    if name == "swiglu_clamp":
        return torch.nn.functional.silu(g.clamp(max=a)) * u.clamp(-a, a)
    if name == "situ":
        h = torch.tanh(g * (1.0 / a)) * a * torch.sigmoid(g)
        return h * (torch.tanh(u * (1.0 / b)) * b if b > 0.0 else u)
    xg, yu = g.clamp(max=OAI_LIMIT), u.clamp(-OAI_LIMIT, OAI_LIMIT)
    return xg * torch.sigmoid(OAI_ALPHA * xg) * (yu + 1.0)


@triton.jit
def _lower_bound(keys_ptr, R, target, steps):
    """For each target, how many of the R sorted keys are below it (a binary search of `steps` >=
    bits of R halvings, all targets at once)."""
    lo = tl.zeros(target.shape, tl.int32)
    hi = lo + R
    for _ in range(steps):
        go = lo < hi
        mid = (lo + hi) // 2
        below = go & (tl.load(keys_ptr + mid, mask=go, other=0) < target)
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(go & ~below, mid, hi)
    return lo


# The row and tile counts are plain loop bounds: left unspecialized, else Triton compiles a new variant as they become
# divisible by 16 or not, within the timed first long prompt (session 40: an 8000-token prompt's steps = 16 did so,
# ~0.7 s on the H100 past generate's 16-token warm-up).
@triton.jit(do_not_specialize=["R", "n_tiles_out", "steps"])
def _expert_tiles_kernel(keys_ptr, tiles_ptr, R, n_experts, n_tiles_out, steps, BLOCK_T: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_I: tl.constexpr):
    """expert_tiles in one program: each expert's rows [start, end) by binary search, its tile count
    and their running sum (tile_start, tile_end); tile i then belongs to the one expert whose
    [tile_start, tile_end) holds it (integer sums over a one-hot row: exact), else it is (0, 0, 0)."""
    e = tl.arange(0, BLOCK_E)
    start = _lower_bound(keys_ptr, R, e, steps)
    end = _lower_bound(keys_ptr, R, e + 1, steps)  # integer keys: those <= e
    count = tl.where(e < n_experts, (end - start + BLOCK_T - 1) // BLOCK_T, 0)
    tile_end = tl.cumsum(count, 0)
    tile_start = tile_end - count
    for i0 in range(0, n_tiles_out, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        hit = (i[:, None] >= tile_start[None, :]) & (i[:, None] < tile_end[None, :])  # [BLOCK_I, BLOCK_E]
        first = tl.sum(tl.where(hit, start[None, :] + (i[:, None] - tile_start[None, :]) * BLOCK_T, 0), 1)
        last = tl.minimum(first + BLOCK_T, tl.sum(tl.where(hit, end[None, :], 0), 1))
        m = i < n_tiles_out
        tl.store(tiles_ptr + i * 3, tl.sum(tl.where(hit, e[None, :], 0), 1), mask=m)
        tl.store(tiles_ptr + i * 3 + 1, first, mask=m)
        tl.store(tiles_ptr + i * 3 + 2, last, mask=m)


def expert_tiles(keys: torch.Tensor, n_experts: int, block_t: int) -> torch.Tensor:
    """The grouped GEMM's tiles of expert-sorted rows: keys (sorted expert ids, one per row) ->
    int32 [n, 3] of (expert, first row, end row), each expert's rows cut in runs of block_t, then
    empty tiles (0, 0, 0) up to n = cdiv(R, block_t) + min(experts, R), the most there can be,
    so the launch's size is known without a host sync. Ids outside [0, n_experts) get no tile.
    PREFILL_GLUE "kernels": one launch (_expert_tiles_kernel), else expert_tiles_torch's ~25 ops."""
    if PREFILL_GLUE != "kernels":
        return expert_tiles_torch(keys, n_experts, block_t)
    n_rows = keys.numel()
    n = triton.cdiv(n_rows, block_t) + min(n_experts, n_rows)
    tiles = torch.empty(n, 3, dtype=torch.int32, device=keys.device)
    if n:
        block_e = triton.next_power_of_2(max(n_experts, 16))
        _expert_tiles_kernel[(1,)](keys, tiles, n_rows, n_experts, n, n_rows.bit_length(), BLOCK_T=block_t,
                                   BLOCK_E=block_e, BLOCK_I=max(16, 8192 // block_e))
    return tiles


def expert_tiles_torch(keys: torch.Tensor, n_experts: int, block_t: int) -> torch.Tensor:
    """expert_tiles in torch ops (the way before session 10's glue kernels: PREFILL_GLUE "torch")."""
    dev, n_rows = keys.device, keys.numel()
    ids = torch.arange(n_experts, device=dev, dtype=keys.dtype)
    starts, ends = torch.searchsorted(keys, ids), torch.searchsorted(keys, ids, right=True)
    n_tiles = (ends - starts + block_t - 1) // block_t
    tile_end = n_tiles.cumsum(0)
    i = torch.arange(triton.cdiv(n_rows, block_t) + min(n_experts, n_rows), device=dev)
    e = torch.searchsorted(tile_end, i, right=True).clamp_(max=n_experts - 1)
    first = starts[e] + (i - tile_end[e] + n_tiles[e]) * block_t
    used = i < tile_end[-1]
    end = torch.minimum(first + block_t, ends[e])
    return torch.stack([e.where(used, 0), first.where(used, 0), end.where(used, 0)], 1).to(torch.int32).contiguous()


@triton.jit
def _combine_kernel(out_ptr, pos_ptr, w_ptr, y_ptr, D, A: tl.constexpr, BLOCK_D: tl.constexpr):
    """y[t] = sum_k out[pos[t, k]] * w[t, k], k = 0..A-1 one after another: the torch glue's products
    and adds in its order (launched without fp fusion: no fma of a product into the sum)."""
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = d < D
    for k in tl.static_range(A):
        r = tl.load(pos_ptr + t * A + k).to(tl.int64)
        part = tl.load(out_ptr + r * D + d, mask=m) * tl.load(w_ptr + t * A + k)
        if k == 0:
            acc = part  # not 0.0 + part: -0.0 stays -0.0
        else:
            acc = acc + part
    tl.store(y_ptr + t.to(tl.int64) * D + d, acc, mask=m)


def _weighted_sum(out: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """moe_prefill's last step: out's row r is the pair order[r] (token * A + slot) of weights [T, A]; each token's A
    rows times their weights, added in slot order (PREFILL_GLUE: _combine's launches, or torch ops)."""
    rows = torch.arange(order.numel(), device=out.device)
    if PREFILL_GLUE == "kernels":
        return _combine(out, order, rows, weights)
    out *= weights.reshape(-1)[order, None]
    parts = torch.empty_like(out).index_copy_(0, order, out).view(*weights.shape, out.shape[1])
    y = parts[:, 0].contiguous()
    for k in range(1, weights.shape[1]):
        y += parts[:, k]
    return y


def _combine(out: torch.Tensor, order: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """_weighted_sum in two launches (rows: out's row numbers)."""
    T, A = weights.shape
    D = out.shape[1]
    pos = torch.empty_like(order).index_copy_(0, order, rows)  # pair -> its row of out
    y = torch.empty(T, D, dtype=torch.float32, device=out.device)
    if y.numel():
        block_d = min(1024, triton.next_power_of_2(D))
        _combine_kernel[(T, triton.cdiv(D, block_d))](out, pos, weights.contiguous(), y, D, A=A, BLOCK_D=block_d,
                                                       num_warps=4, enable_fp_fusion=False)
    return y


def _slab_experts(p: PreparedTable, x: torch.Tensor, keys: torch.Tensor, order: torch.Tensor, top_k: int,
                  route_weights: torch.Tensor, act: Act, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The grouped way's rows (keys: each row's expert, sorted; order: its (token, slot) pair) through 16-bit slabs
    (sessions 46-47): the table's experts in ranges whose weights' values fit EXPERT_SLAB_BYTES, each range's gate | up
    and down dequantized to dtype by one launch a matrix kind (dequantize_experts) and multiplied over its experts'
    rows by one grouped GEMM each (torch._grouped_mm: CUTLASS's tensor-core kernels for bf16 on sm90+; x and the
    activations rounded to dtype, the products' sums returned in dtype); then the grouped way's combine. A table that
    fits is one range and syncs nowhere (a prompt graph could capture it); a larger one syncs once a layer, for its
    ranges' rows. What a prompt of many rows an expert pays for: a copy of every expert's weights' values each call.
    Rows of a slot outside the table (unchecked slots) come out zero."""
    table, n, D, F = p.table, len(p.table), p.table.dim, p.table.width
    # each expert's rows end: sorted keys' count up to it (no sync, unlike bincount's, which sizes its output)
    ends = torch.searchsorted(keys, torch.arange(n, device=keys.device, dtype=keys.dtype), right=True)
    span = max(1, EXPERT_SLAB_BYTES // (3 * F * D * 2))  # experts a range
    if span >= n:
        ranges = [(0, n, 0, keys.numel())]
    else:  # the sync: each range's rows
        at = [0, *ends.tolist()]
        ranges = [(e, min(e + span, n), at[e], at[min(e + span, n)]) for e in range(0, n, span)]
    xh, tok = x.to(dtype), order // top_k
    out = torch.empty(keys.numel(), D, dtype=torch.float32, device=x.device)
    for e0, e1, first, last in ranges:
        if first == last:
            continue
        offs = (ends[e0:e1] - first).to(torch.int32)  # grouped_mm's: each expert's rows end within the range
        w = torch.empty(e1 - e0, 2 * F, D, dtype=dtype, device=x.device)
        dequantize_experts(table.gate, p.gate_off[e0:e1], p.gate_up.qtype, (F, D), w[:, :F])
        dequantize_experts(table.up, p.up_off[e0:e1], p.gate_up.qtype, (F, D), w[:, F:])
        gu = torch._grouped_mm(xh.index_select(0, tok[first:last]), w.transpose(1, 2), offs=offs).float()
        g, u = gu[:, :F], gu[:, F:]
        b = None if bias is None else bias.index_select(0, keys[first:last].clamp(max=n - 1))
        if b is not None:
            g, u = g + b[:, :F], u + b[:, F:2 * F]
        h = _act_torch(g, u, act).to(dtype)
        w = dequantize_experts(table.down, p.down_off[e0:e1], p.down.qtype, (D, F),
                               torch.empty(e1 - e0, D, F, dtype=dtype, device=x.device))
        out[first:last] = torch._grouped_mm(h, w.transpose(1, 2), offs=offs)
        if b is not None:
            out[first:last] += b[:, 2 * F:]
    out.masked_fill_((keys >= n)[:, None], 0.0)  # grouped_mm leaves the rows past its last group unwritten
    return _weighted_sum(out, order, route_weights)


def _expert(table: ExpertTable, gate_up: dispatch.Family, down: dispatch.Family, e: int, h: torch.Tensor, act: Act,
            bias: torch.Tensor | None, precision: str, round_h: Callable | None = None) -> torch.Tensor:
    """Expert e of the table over its rows h [t, D] -> [t, D] (the "loop" way): down(act(gate h, up h)) with its
    biases (bias: the table's, or None), each a gemm at precision; round_h: the down's input rounded first."""
    D, F = table.dim, table.width
    gu_span, d_span = F * gate_up.row_bytes(D), D * down.row_bytes(F)
    go, uo, do = (int(o[e]) for o in (table.gate_offsets, table.up_offsets, table.down_offsets))
    g = gemm(table.gate[go:go + gu_span], gate_up.qtype, (F, D), h, precision)
    u = gemm(table.up[uo:uo + gu_span], gate_up.qtype, (F, D), h, precision)
    if bias is not None:
        g, u = g + bias[e, :F], u + bias[e, F:2 * F]
    a = _act_torch(g, u, act)
    out = gemm(table.down[do:do + d_span], down.qtype, (D, F), (a if round_h is None else round_h(a)).contiguous(),
               precision)
    return out if bias is None else out + bias[e, 2 * F:]


def moe_prefill(table: ExpertTable | PreparedTable, x: torch.Tensor, slots: torch.Tensor, route_weights: torch.Tensor,
                act: Act = "silu", precision: str = "tf32",
                round_h: Callable[[torch.Tensor], torch.Tensor] | None = None,
                check_slots: bool = True, bias: torch.Tensor | None = None,
                slab: torch.dtype | None = None) -> torch.Tensor:
    """Many tokens: x float32 [T, D]; slots int [T, A] index the table's experts (an ExpertTable,
    or the PreparedTable of all of them that prepare() made); route_weights
    float32 [T, A] -> y [T, D]; round_h as in moe_decode; precision prefill_gemm.gemm's (at "int8" x
    comes unrounded where gate/up run integer: quantized here, as round_x would). PREFILL "grouped": the (token, slot)
    pairs sorted by expert, gate, up and down each one grouped GEMM launch over every expert's
    tiles (no host sync), the same bits as "loop": a GEMM per expert and projection, each expert's
    tokens found by a host sync. check_slots: the slots' range checked on the host (one sync); False
    where the caller vouches for them (a router's top-k over the table's experts): "grouped" then
    syncs nowhere, and a slot outside the table gets no tile (its rows are not computed, nothing
    outside the table is read; "loop" checks always). bias: every table expert's biases, float32 [n, 2F + D] (gpt-oss:
    gate | up before the activation, down before the routing weight; moe_decode's, for the whole table). slab: a 16-bit
    type (SLAB_TYPES' values): under "grouped", _slab_experts instead of the grouped GEMMs."""
    what = "the MoE prefill kernels"
    act_args(act, what)  # a bad activation refused before any launch
    p = table if isinstance(table, PreparedTable) else prepare(table, x.device, what)
    if p.ids is not None:
        raise dispatch.KernelArgumentError(f"could not run {what}: give the whole table, not a selection "
                                           f"of it (slots index the table's experts)")
    table = p.table
    dispatch.check_activations(x, table.dim, what)
    if x.dim() != 2 or slots.shape != route_weights.shape or slots.dim() != 2 or slots.shape[0] != x.shape[0]:
        raise dispatch.KernelArgumentError(
            f"could not run {what}: need x [T, {table.dim}], slots and route weights [T, A], got x "
            f"{list(x.shape)}, slots {list(slots.shape)}, weights {list(route_weights.shape)}")
    if slab is not None and slab not in SLAB_TYPES.values():
        raise dispatch.KernelArgumentError(f"could not run {what}: slab {slab} is not one of "
                                           f"{', '.join(map(str, SLAB_TYPES.values()))} (or None: no slabs)")
    n = p.gate_off.numel()
    if check_slots or PREFILL != "grouped":
        low, high = torch.stack(torch.aminmax(slots)).tolist() if slots.numel() else (0, 0)  # one sync
        if low < 0 or high >= n:
            raise dispatch.KernelArgumentError(f"could not run {what}: slots must lie in [0, {n})")
    fgu, fd = p.gate_up, p.down
    D, F = table.dim, table.width
    if bias is not None and (bias.shape != (n, 2 * F + D) or bias.dtype != torch.float32 or bias.device != x.device):
        raise dispatch.KernelArgumentError(f"could not run {what}: expert biases must be float32 [{n}, {2 * F + D}] "
                                           f"on {x.device}, got {bias.dtype} {list(bias.shape)} on {bias.device}")
    if PREFILL == "grouped":
        # each token's experts in ascending order, its A outputs then added one after another: the
        # loop's sums to the bit (its index_add_ met a token's experts in that order)
        slots, by_expert = torch.sort(slots, dim=1, stable=True)
        route_weights = route_weights.gather(1, by_expert)
        keys, order = torch.sort(slots.reshape(-1), stable=True)
        if slab is not None:
            return _slab_experts(p, x, keys, order, slots.shape[1], route_weights, act, bias, slab)
        block_t = tile_rows(fgu, fd, precision)
        tiles = expert_tiles(keys, n, block_t)
        tok = order // slots.shape[1]
        qx = act_quant.quantize(x, fgu.act_fmt) if int_gemm(fgu, precision) else None  # once for gate and up
        g = grouped_gemm(table.gate, p.gate_off, fgu.qtype, (F, D), x, tok, tiles, precision, qx, block_t)
        u = grouped_gemm(table.up, p.up_off, fgu.qtype, (F, D), x, tok, tiles, precision, qx, block_t)
        # each row's expert's biases (an unchecked slot outside the table: clamped, its row has no tile anyway)
        b = None if bias is None else bias.index_select(0, keys.clamp(0, n - 1))
        if b is not None:
            g, u = g + b[:, :F], u + b[:, F:2 * F]
        h = _act_torch(g, u, act)
        # the integer GEMM quantizes h itself (to the values round_h gives)
        h = (h if round_h is None or int_gemm(fd, precision) else round_h(h)).contiguous()
        rows = torch.arange(keys.numel(), device=x.device)
        out = grouped_gemm(table.down, p.down_off, fd.qtype, (D, F), h, rows, tiles, precision, block_t=block_t)
        if b is not None:
            out += b[:, 2 * F:]
        return _weighted_sum(out, order, route_weights)
    y = torch.zeros_like(x)
    round_down = None if int_gemm(fd, precision) else round_h  # the integer GEMM quantizes h itself
    for j in torch.unique(slots).tolist():
        tok, k = (slots == j).nonzero(as_tuple=True)
        out = _expert(table, fgu, fd, j, x.index_select(0, tok), act, bias, precision, round_down)
        y.index_add_(0, tok, out * route_weights[tok, k, None])
    return y
