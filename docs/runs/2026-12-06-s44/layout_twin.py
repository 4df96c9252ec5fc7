"""Session 44: does the pairx experts' byte order bound the Q4_KXD MoE layer's loads? Load-only twins of the gate/up
(3072 one-warp programs at 4096x1536 top-8: 4-row tiles, 16 groups, 2 a step, gate and up) and the down (1024 tiles x
RANGES ranges of experts, 6 groups, 3 a step) read each 4-row tile's group as pairx has it (576 bytes: qs 512 + header
64) in three orders of an expert's matrix:
  tile   - pairx today: tile t's bytes together, its qs of every group first, then the headers (t * G * 576)
  tileh  - tile t's bytes together, each group's qs and header side by side ((t * G + g) * 576)
  group  - group g of every tile together ((g * T + t) * 576): programs running side by side read adjacent bytes
Each warp loads what the kernel loads (a 128-bit qs word a thread, 3 header words a thread), xors it into a sum the
store depends on. Timed as moe_tiles_bench times (CUDA graph over weight sets rotated past the L2), against a copy
of the same bytes and the 2 GiB copy. Usage: python layout_twin.py [--shape 4096x1536x8] [--sets 8]."""
import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from kernels_bench import copy_bandwidth, graph_seconds  # noqa: E402

ORDERS = {"tile": 0, "tileh": 1, "group": 2}


@triton.jit
def _chunk(m_ptr, t, g, T, NG: tl.constexpr, ORDER: tl.constexpr):
    """(qs, header) int32 pointers of group g of tile t in a matrix of T tiles at m_ptr (int32 words)."""
    if ORDER == 0:
        q = m_ptr + t.to(tl.int64) * (NG * 144) + g * 128
        h = m_ptr + t.to(tl.int64) * (NG * 144) + NG * 128 + g * 16
    elif ORDER == 1:
        q = m_ptr + (t.to(tl.int64) * NG + g) * 144
        h = q + 128
    else:
        q = m_ptr + (g * T + t.to(tl.int64)) * 144
        h = q + 128
    return q, h


@triton.jit
def _group_words(m_ptr, t, g, T, lane, NG: tl.constexpr, ORDER: tl.constexpr):
    q, h = _chunk(m_ptr, t, g, T, NG, ORDER)
    c = lane // 2
    w = tl.load(q + 4 * lane + tl.arange(0, 4)[None, :])
    hd = tl.load(h + (2 * (lane % 2) + c % 2))
    return w + hd + tl.load(h + 4 + c // 2) + tl.load(h + 12 + c // 4)


@triton.jit
def _gate_up_twin(gate_ptr, up_ptr, out_ptr, T, MAT: tl.constexpr, NG: tl.constexpr, STEP: tl.constexpr,
                  ORDER: tl.constexpr):
    pid = tl.program_id(0)
    e, t = pid // T, pid % T
    lane = tl.arange(0, 32)[:, None]
    gb = gate_ptr.to(tl.pointer_type(tl.int32)) + e.to(tl.int64) * (MAT // 4)
    ub = up_ptr.to(tl.pointer_type(tl.int32)) + e.to(tl.int64) * (MAT // 4)
    acc = tl.zeros((32, 4), tl.int32)
    for g0 in tl.range(0, NG, STEP):
        for u in tl.static_range(STEP):
            acc ^= _group_words(gb, t, g0 + u, T, lane, NG, ORDER)
            acc ^= _group_words(ub, t, g0 + u, T, lane, NG, ORDER)
    tl.store(out_ptr + pid * 128 + 4 * lane + tl.arange(0, 4)[None, :], acc)


@triton.jit
def _down_twin(down_ptr, out_ptr, T, E, R, MAT: tl.constexpr, NG: tl.constexpr, STEP: tl.constexpr,
               ORDER: tl.constexpr):
    t, r = tl.program_id(0), tl.program_id(1)
    lane = tl.arange(0, 32)[:, None]
    per = tl.cdiv(E, R)
    acc = tl.zeros((32, 4), tl.int32)
    for e in range(r * per, tl.minimum(r * per + per, E)):
        b = down_ptr.to(tl.pointer_type(tl.int32)) + e.to(tl.int64) * (MAT // 4)
        for g0 in tl.range(0, NG, STEP):
            for u in tl.static_range(STEP):
                acc ^= _group_words(b, t, g0 + u, T, lane, NG, ORDER)
    tl.store(out_ptr + (r * T + t) * 128 + 4 * lane + tl.arange(0, 4)[None, :], acc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x1536x8", help="D x F x top-k")
    ap.add_argument("--sets", type=int, default=8, help="weight sets rotated past the L2")
    ap.add_argument("--ranges", default="1,2,4", help="the down's ranges of experts")
    ap.add_argument("--gu-steps", default="2", help="gate/up groups a step")
    ap.add_argument("--down-steps", default="3", help="down groups a step")
    a = ap.parse_args()
    D, F, A = map(int, a.shape.split("x"))
    copy_bw = copy_bandwidth()
    print(f"2 GiB copy {copy_bw / 1e9:.0f} GB/s (read + written)")
    gu_tiles, gu_ng = F // 4, D // 256
    dn_tiles, dn_ng = D // 4, F // 256
    gu_mat, dn_mat = gu_tiles * gu_ng * 576, dn_tiles * dn_ng * 576
    gate = [torch.randint(0, 256, (A * gu_mat,), dtype=torch.uint8, device="cuda") for _ in range(a.sets)]
    up = [torch.randint(0, 256, (A * gu_mat,), dtype=torch.uint8, device="cuda") for _ in range(a.sets)]
    down = [torch.randint(0, 256, (A * dn_mat,), dtype=torch.uint8, device="cuda") for _ in range(a.sets)]
    layer = torch.cat([gate[0], up[0], down[0]])
    dst = torch.empty_like(layer)
    src = [torch.cat([gate[i], up[i], down[i]]) for i in range(a.sets)]
    frac = lambda nbytes, sec: nbytes / sec / copy_bw  # noqa: E731
    sec = graph_seconds(lambda i: dst.copy_(src[i % a.sets]), a.sets)
    print(f"copy of the layer's {layer.numel() / 1e6:.1f} MB: {sec * 1e6:.1f} us ({2 * frac(layer.numel(), sec):.2f})")
    out = torch.empty(A * gu_tiles * 128 * 4, dtype=torch.int32, device="cuda")
    for step in map(int, a.gu_steps.split(",")):
        for name, order in ORDERS.items():
            fn = lambda i: _gate_up_twin[(A * gu_tiles,)](gate[i % a.sets], up[i % a.sets], out, gu_tiles,  # noqa
                                                          MAT=gu_mat, NG=gu_ng, STEP=step, ORDER=order, num_warps=1)
            sec = graph_seconds(fn, a.sets)
            print(f"gate/up twin step {step} {name:6s}: {sec * 1e6:6.1f} us ({frac(2 * A * gu_mat, sec):.2f})")
    for step in map(int, a.down_steps.split(",")):
        for ranges in map(int, a.ranges.split(",")):
            for name, order in ORDERS.items():
                fn = lambda i: _down_twin[(dn_tiles, ranges)](down[i % a.sets], out, dn_tiles, A, ranges,  # noqa
                                                              MAT=dn_mat, NG=dn_ng, STEP=step, ORDER=order,
                                                              num_warps=1)
                sec = graph_seconds(fn, a.sets)
                print(f"down twin step {step} ranges {ranges} {name:6s}: {sec * 1e6:6.1f} us "
                      f"({frac(A * dn_mat, sec):.2f})")


if __name__ == "__main__":
    main()
