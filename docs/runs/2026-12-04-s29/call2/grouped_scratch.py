"""Scratch (session 29, not kept): where the grouped decode attention's time goes. Variants of one kernel by
constexpr; times a call at each position (CUDA graph over KV buffers past the L2), 32 q heads over 4 KV heads of 128."""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from expert_sort_bench import graph_us

from sparkd.engine.kernels import decode_attention as da
from sparkd.engine.layers.attention import attend

H, HKV, D = 32, 4, 128
G = H // HKV


@triton.jit
def _k(query_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, part_ptr, stat_ptr, ticket_ptr, span, scale,
       BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, N_R: tl.constexpr,
       PREC: tl.constexpr, KV_FIRST: tl.constexpr, FOLD_MODE: tl.constexpr, FOLD: tl.constexpr):
    b, r = tl.program_id(0), tl.program_id(1)
    g = tl.arange(0, BLOCK_H)
    real = g < GROUP
    heads = b * GROUP + g
    pos = tl.load(pos_ptr).to(tl.int32)
    hi = tl.minimum(pos + 1, span)
    blocks = tl.cdiv(hi, BLOCK_S)
    per = tl.cdiv(blocks, N_R)
    used = tl.cdiv(blocks, per)
    if r >= used:
        return
    start = r * per * BLOCK_S
    end = tl.minimum(start + per * BLOCK_S, hi)
    d = tl.arange(0, D)
    q = tl.load(query_ptr + heads[:, None] * D + d[None, :], mask=real[:, None], other=0.0)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    row_stride = HKV_C * D
    for s0 in range(start, end, BLOCK_S):
        rows = s0 + tl.arange(0, BLOCK_S)
        seen = rows < hi
        k = tl.load(k_ptr + rows[:, None].to(tl.int64) * row_stride + b * D + d[None, :], mask=seen[:, None],
                    other=0.0)
        if KV_FIRST:
            v = tl.load(v_ptr + rows[:, None].to(tl.int64) * row_stride + b * D + d[None, :], mask=seen[:, None],
                        other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if not KV_FIRST:
            v = tl.load(v_ptr + rows[:, None].to(tl.int64) * row_stride + b * D + d[None, :], mask=seen[:, None],
                        other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
        m = m_new
    hh = tl.arange(0, BLOCK_H)
    n_b = tl.num_programs(0)
    slot = b * N_R + r
    tl.store(stat_ptr + slot * BLOCK_H + hh, m)
    tl.store(stat_ptr + (n_b * N_R + slot) * BLOCK_H + hh, total)
    tl.store(part_ptr + (slot * BLOCK_H + hh[:, None]) * D + d[None, :], acc)
    if FOLD_MODE == 1:
        tl.debug_barrier()
        if tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel") == used - 1:
            tl.debug_barrier()
            rr = tl.arange(0, N_R)
            here = (rr < used)[:, None]
            slots = (b * N_R + rr)[:, None] * BLOCK_H + hh[None, :]
            ms = tl.load(stat_ptr + slots, mask=here, other=float("-inf"), cache_modifier=".cg")
            ts = tl.load(stat_ptr + n_b * N_R * BLOCK_H + slots, mask=here, other=0.0, cache_modifier=".cg")
            top = tl.max(ms, axis=0)
            tot = tl.sum(ts * tl.exp(ms - top[None, :]), axis=0)
            fr = tl.arange(0, FOLD)
            o = tl.zeros([BLOCK_H, D], tl.float32)
            for c in range(0, used, FOLD):
                some = (c + fr < used)[:, None]
                cs = (b * N_R + c + fr)[:, None] * BLOCK_H + hh[None, :]
                w = tl.exp(tl.load(stat_ptr + cs, mask=some, other=float("-inf"), cache_modifier=".cg") - top[None, :])
                pp = tl.load(part_ptr + cs[:, :, None] * D + d[None, None, :], mask=some[:, :, None], other=0.0,
                             cache_modifier=".cg")
                o += tl.sum(pp * w[:, :, None], axis=0)
            tl.store(out_ptr + heads[:, None] * D + d[None, :], o / tot[:, None], mask=real[:, None])
            tl.store(ticket_ptr + b, 0)


HKV_C = tl.constexpr(HKV)


@triton.jit
def _fold_heads(pos_ptr, out_ptr, part_ptr, stat_ptr, span, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
                D: tl.constexpr, GROUP: tl.constexpr, N_R: tl.constexpr, CH: tl.constexpr):
    """Program h: head h's ranges added (a launch of its own)."""
    h = tl.program_id(0)
    b, hl = h // GROUP, h % GROUP
    pos = tl.load(pos_ptr).to(tl.int32)
    hi = tl.minimum(pos + 1, span)
    blocks = tl.cdiv(hi, BLOCK_S)
    per = tl.cdiv(blocks, N_R)
    used = tl.cdiv(blocks, per)
    n_b = tl.num_programs(0) // GROUP
    rr = tl.arange(0, N_R)
    here = rr < used
    slots = (b * N_R + rr) * BLOCK_H + hl
    ms = tl.load(stat_ptr + slots, mask=here, other=float("-inf"))
    ts = tl.load(stat_ptr + n_b * N_R * BLOCK_H + slots, mask=here, other=0.0)
    top = tl.max(ms, axis=0)
    tot = tl.sum(ts * tl.exp(ms - top), axis=0)
    d = tl.arange(0, D)
    o = tl.zeros([D], tl.float32)
    cr = tl.arange(0, CH)
    for c in range(0, used, CH):
        some = c + cr < used
        cs = (b * N_R + c + cr) * BLOCK_H + hl
        w = tl.exp(tl.load(stat_ptr + cs, mask=some, other=float("-inf")) - top)
        pp = tl.load(part_ptr + cs[:, None] * D + d[None, :], mask=some[:, None], other=0.0)
        o += tl.sum(pp * w[:, None], axis=0)
    tl.store(out_ptr + h * D + d, o / tot)


def run(q, k, v, p, n_r, prec, kv_first, fold_mode, block_s=64, fold=4, ch=32):
    out = torch.empty(1, H, D, device=q.device)
    part = torch.empty(HKV, n_r, 16, D, device=q.device)
    stat = torch.empty(2, HKV, n_r, 16, device=q.device)
    tick = torch.zeros(HKV, dtype=torch.int32, device=q.device)
    span = k.shape[0]
    _k[(HKV, n_r)](q, k, v, p, out, part, stat, tick, span, 0.088, BLOCK_H=16, BLOCK_S=block_s, D=D, GROUP=G,
                   N_R=n_r, PREC=prec, KV_FIRST=kv_first, FOLD_MODE=fold_mode, FOLD=fold, num_warps=4)
    if fold_mode == 2:
        _fold_heads[(H,)](p, out, part, stat, span, BLOCK_H=16, BLOCK_S=block_s, D=D, GROUP=G, N_R=n_r,
                          CH=min(ch, n_r), num_warps=4)
    return out


VARIANTS = {  # name: (ranges, precision, K and V loaded together, fold mode 0 none / 1 in-kernel / 2 own launch)
    "ieee": (32, "ieee", False, 1), "tf3": (32, "tf32x3", False, 1), "tf3kv": (32, "tf32x3", True, 1),
    "tf3kv_nofold": (32, "tf32x3", True, 0), "tf3kv_fold2": (32, "tf32x3", True, 2),
    "tf3kv_r64_fold2": (64, "tf32x3", True, 2), "tf3kv_r128_fold2": (128, "tf32x3", True, 2),
    "tf3kv_r128_nofold": (128, "tf32x3", True, 0), "tf32kv_fold2": (32, "tf32", True, 2),
    "ieeekv_r128_fold2": (128, "ieee", True, 2),
}


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    positions = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "136,2000,8000,16000").split(",")]
    print("pos " + " ".join(f"{n:>18s}" for n in ["auto", *VARIANTS]), flush=True)
    for pos in positions:
        span = 256
        while span <= pos:
            span *= 2
        n_buf = max(12, -(-(128 << 20) // (2 * span * HKV * D * 4)))
        kv = [(torch.randn(span, HKV, D, device=dev), torch.randn(span, HKV, D, device=dev)) for _ in range(n_buf)]
        q = torch.randn(1, H, D, device=dev)
        p = torch.tensor([pos], device=dev)
        want = attend(q.double().cpu(), kv[0][0].double().cpu(), kv[0][1].double().cpu(), 0.088, p.cpu())
        cells = []
        for name in ["auto", *VARIANTS]:
            if name == "auto":
                da.SPLIT_RULE = "auto"

                def one(k, v):
                    return da.decode_attention(q, k, v, p, 0.088)
            else:
                def one(k, v, cfg=VARIANTS[name]):
                    return run(q, k, v, p, *cfg)
            try:
                got = one(*kv[0])

                def every():
                    for k, v in kv:
                        one(k, v)
                us = graph_us(every, 1, 20) / n_buf
                err = float((got.double().cpu() - want).norm() / want.norm())
                cells.append(f"{us:8.2f} ({err:.0e})")
            except Exception as exc:  # a variant that fails to compile: say so, go on
                cells.append(f"{'ERR ' + type(exc).__name__[:12]:>18s}")
                print(exc, file=sys.stderr)
        print(f"{pos:5d} " + " ".join(f"{c:>18s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
