"""Session 7 (diag12): why the tiled vector integer steps gave wrong sums on the H200 for programs of
part of a row tile (2-row programs on 4-row tiles), right under the interpreter.

The smallest kernel with the pattern (`_probe`): a program loads a [BN, 4, 2, 4] int32 tile the way
q4_k_tiled.idot_tile_vec loads its words (a pointer per row, + j * 8 + 4 * h + v), reshapes it to
[BN, 4, 8] as the step does into matmul.row_idot's accumulator, and sums each row as row_idot does
after the loop (tl.sum(tl.sum(acc, 2), 1)). NESTED=True sums the 4-D tile instead (no reshape).

  offline (no GPU; the local triton compiles for sm_90):
    PYTHONPATH=. python bench/diag12_part_tile.py --offline
  prints per tile: the blocked layout of the loads, the linear layout the reshape gives, and the
  butterfly shuffle offsets of the final row sums (a lane bit that is not the reduced dimension's
  mixes rows).
  on the GPU: PYTHONPATH=. python bench/diag12_part_tile.py
  runs the probe (reshape / nested) and the real steps (q4_k_tiled vector against its
  scalar step; q6_k_tiled's int step against q6_k's GGUF step; moe._q4_k_vec on GGUF Q4_K rows
  against q4_k's) at every tile of TILES, bypassing the guards, and prints the relative error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch
import triton
import triton.language as tl

# (block_n, num_warps): 2-row programs on 1 and 2 warps, the default 4/1, 4 rows on 2 warps, 8 rows
# on 1, 2 and 4 warps, 16/4, 1/1
TILES = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (16, 4), (32, 4)]
STEP_TILES = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2), (8, 4)]  # the real step's (compile time)
FIX_TILES = [(2, 1), (4, 1), (8, 1)]  # the fix tried


@triton.jit
def _probe(w_ptr, y_ptr, row_words, BN: tl.constexpr, NESTED: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.arange(0, 4)[None, :, None, None]
    h = tl.arange(0, 2)[None, None, :, None]
    v = tl.arange(0, 4)[None, None, None, :]
    base = w_ptr + rows.to(tl.int64) * row_words
    t = tl.load(base[:, None, None, None] + j * 8 + 4 * h + v).to(tl.float32)
    if NESTED:
        s = tl.sum(tl.sum(tl.sum(t, 3), 2), 1)
    else:
        s = tl.sum(tl.sum(tl.reshape(t, (BN, 4, 8)), 2), 1)
    tl.store(y_ptr + rows, s)


@triton.jit
def _probe_loop(w_ptr, y_ptr, row_words, BN: tl.constexpr, SPLIT_BACK: tl.constexpr):
    """The tile reshaped into a loop-carried [BN, 4, 8] accumulator (as row_idot's), row_words // 32
    tiles per row; SPLIT_BACK: the accumulator reshaped to [BN, 4, 2, 4] before the row sums."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.arange(0, 4)[None, :, None, None]
    h = tl.arange(0, 2)[None, None, :, None]
    v = tl.arange(0, 4)[None, None, None, :]
    base = w_ptr + rows.to(tl.int64) * row_words
    acc = tl.zeros((BN, 4, 8), tl.float32)
    for t0 in range(0, row_words, 32):
        t = tl.load(base[:, None, None, None] + t0 + j * 8 + 4 * h + v).to(tl.float32)
        acc += tl.reshape(t, (BN, 4, 8))
    if SPLIT_BACK:
        s = tl.sum(tl.sum(tl.sum(tl.reshape(acc, (BN, 4, 2, 4)), 3), 2), 1)
    else:
        s = tl.sum(tl.sum(acc, 2), 1)
    tl.store(y_ptr + rows, s)


@triton.jit
def _row_idot_split(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, K, IDOT: tl.constexpr, A1: tl.constexpr,
                    A2: tl.constexpr, A3: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr):
    """matmul.row_idot (split 1, elementwise tile) whose row sums split the tile's last dimension
    back into (A2 // A3, A3), the step's own [.., 2, 4], before summing: the fix tried here."""
    n_groups = tl.cdiv(K, 256)
    acc = tl.zeros((rmask.shape[0], A1, A2), tl.float32)
    for g0 in tl.range(0, n_groups, UNROLL):
        for u in tl.static_range(UNROLL):
            g = g0 + u
            gc = tl.minimum(g, n_groups - 1)
            m = rmask & (tl.zeros(rmask.shape, tl.int32) + g < n_groups)
            acc = IDOT(w_ptr, aux_ptr, row_off, m, xw_ptr, xd_ptr, xs_ptr, gc, K, acc, True, EMU)
    return tl.sum(tl.sum(tl.sum(tl.reshape(acc, (rmask.shape[0], A1, A2 // A3, A3)), 3), 2), 1)


@triton.jit
def _igemv_split(w_ptr, aux_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, N, K, row_bytes, IDOT: tl.constexpr, A1: tl.constexpr,
                 A2: tl.constexpr, A3: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    acc = _row_idot_split(w_ptr, aux_ptr, rows.to(tl.int64) * row_bytes, rmask, xw_ptr, xd_ptr, xs_ptr, K, IDOT, A1,
                          A2, A3, UNROLL, EMU)
    tl.store(y_ptr + rows, acc, mask=rmask)


def probe_loop(w: torch.Tensor, bn: int, warps: int, split_back: bool) -> torch.Tensor:
    y = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    _probe_loop[(w.shape[0] // bn,)](w, y, w.shape[1], BN=bn, SPLIT_BACK=split_back, num_warps=warps)
    return y


def probe(w: torch.Tensor, bn: int, warps: int, nested: bool) -> torch.Tensor:
    """Row sums of w (int32 [rows, 32]) by _probe."""
    y = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    _probe[(w.shape[0] // bn,)](w, y, w.shape[1], BN=bn, NESTED=nested, num_warps=warps)
    return y


def _compile_probe(bn: int, warps: int, nested: bool):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    kern = _probe
    sig = {"w_ptr": "*i32", "y_ptr": "*fp32", "row_words": "i32", "BN": "constexpr", "NESTED": "constexpr"}
    src = ASTSource(fn=kern, signature=sig, constexprs={(3,): bn, (4,): nested},
                    attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]],
                           (2,): [["tt.divisibility", 16]]})
    return compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def offline() -> None:
    print(f"triton {triton.__version__}, sm_90, offline")
    for bn, warps in TILES:
        for nested in (False, True):
            k = _compile_probe(bn, warps, nested)
            ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
            blocked = re.search(r"#blocked = (#ttg\.blocked<.*?>)", ttgir).group(1)
            linear = re.search(r"#linear = (#ttg\.linear<.*?>)\n", ttgir)
            shfl = re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", ptx)
            print(f"{bn}/{warps} {'nested ' if nested else 'reshape'} shuffles {shfl} bars {ptx.count('bar.sync')}"
                  f"\n    {blocked}" + (f"\n    {linear.group(1)}" if linear and not nested else ""))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def on_gpu() -> None:
    from gguf import GGMLQuantizationType as T

    from sparkd.engine.kernels import act_quant, grids, matmul, moe, q4_k_tiled, q6_k_tiled

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "engine"))  # random valid blocks
    from test_kernels import random_blocks

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, a dry run
    R, C, CN = (4096, 4096, 2816) if dev == "cuda" else (64, 512, 768)
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name() if dev == 'cuda' else dev}")
    w = torch.randint(-1000, 1000, (R, 32), dtype=torch.int32, device=dev)
    want = w.sum(1).float()
    print("probe: tile [BN,4,2,4] -> reshape [BN,4,8] -> sum(sum(,2),1) (rel err vs torch; nested: no reshape)")
    for bn, warps in TILES:
        errs = [rel(probe(w, bn, warps, nested), want) for nested in (False, True)]
        print(f"  {bn}/{warps}: reshape {errs[0]:.3g}  nested {errs[1]:.3g}", flush=True)
    w2 = torch.randint(-1000, 1000, (R, 64), dtype=torch.int32, device=dev)
    want2 = w2.sum(1).float()
    print("probe, loop-carried [BN,4,8] accumulator: row sums as now / split back to [BN,4,2,4] first")
    for bn, warps in TILES:
        errs = [rel(probe_loop(w2, bn, warps, back), want2) for back in (False, True)]
        print(f"  {bn}/{warps}: as now {errs[0]:.3g}  split back {errs[1]:.3g}", flush=True)
    x = torch.randn(C, device=dev)
    x6 = torch.randn(CN, device=dev)
    q4 = random_blocks(T.Q4_K, R * C // 256).to(dev)
    q6 = random_blocks(T.Q6_K, R * C // 256).to(dev)
    q6n = random_blocks(T.Q6_K, R * CN // 256).to(dev)  # rows of 2310 (cuda) / 630 bytes: not on 16 bytes
    t4, t6 = q4_k_tiled.pack(q4, (R, C)), q6_k_tiled.pack(q6, (R, C))
    t6n = q6_k_tiled.pack(q6n, (R, CN))
    ref4 = matmul.gemv(q4, T.Q4_K, (R, C), x, config=matmul.GemvConfig(block_n=4))
    ref6 = matmul.gemv(q6, T.Q6_K, (R, C), x, config=matmul.GemvConfig(block_n=2))
    ref6n = matmul.gemv(q6n, T.Q6_K, (R, CN), x6, config=matmul.GemvConfig(block_n=2))
    q4i, q6i = q4_k_tiled.FAMILIES["vector"].idot, q6_k_tiled.INT_FAMILY.idot
    # (name, weight, step, iacc, row bytes, x, ref, tiles): the guarded steps, most telling tiles first
    steps = [("q4t vector", t4.data, q4i, (4, 8), C // 256 * 144, x, ref4, STEP_TILES),
             ("moe _q4_k_vec", q4, moe._q4_k_vec, (4, 8), C // 256 * 144, x, ref4, [(2, 1), (4, 1), (4, 2), (8, 2)]),
             ("q6t int", t6.data, q6i, (2, 8), C // 256 * 210, x, ref6, [(2, 1), (4, 1), (8, 1), (8, 2), (16, 2)]),
             (f"q6t int, {CN} cols", t6n.data, q6i, (2, 8), CN // 256 * 210, x6, ref6n, [(4, 1), (8, 1), (16, 1)])]
    print("real steps, split 1, unroll 1 (rel err vs the GGUF step: q4_k 4/1, q6_k 2/1)", flush=True)
    for name, data, idot, iacc, rb, xx, ref, tiles in steps:
        line = []
        for bn, warps in tiles:
            cfg = matmul.GemvConfig(block_n=bn, num_warps=warps, unroll=1, split=1)
            y = torch.empty(R, device=dev)
            matmul.igemv(data, idot, iacc, act_quant.Q8_K, (R, xx.numel()), rb, xx, y, cfg)
            line.append(f"{bn}/{warps} {rel(y, ref):.2g}")
        print(f"  {name}: " + "  ".join(line), flush=True)
    print("the fix tried (_igemv_split: the row sums split the last dim back to (2, 4)): rel err at every "
          "tile; 'same' = the same bits as matmul.igemv at 4/1 (unroll 1, 4)", flush=True)
    for name, data, idot, iacc, rb, xx, ref, tiles in steps:
        q = act_quant.quantize(xx[None], act_quant.Q8_K)
        line = []
        for bn, warps in [t for t in tiles if t in FIX_TILES]:
            for unroll in ((1, 4) if (bn, warps) == (4, 1) else (1,)):
                y = torch.empty(R, device=dev)
                _igemv_split[(R // bn,)](data, grids.grid_words(None, dev), q.words, q.scales, q.sums, y, R, xx.numel(),
                                         rb, IDOT=idot, A1=iacc[0], A2=iacc[1], A3=4, BLOCK_N=bn, UNROLL=unroll,
                                         EMU=dev != "cuda", num_warps=warps)
                tag = f"{bn}/{warps} {rel(y, ref):.2g}"
                if (bn, warps) == (4, 1):
                    old = torch.empty(R, device=dev)
                    cfg = matmul.GemvConfig(block_n=4, num_warps=1, unroll=unroll, split=1)
                    matmul.igemv(data, idot, iacc, act_quant.Q8_K, (R, xx.numel()), rb, xx, old, cfg, q)
                    tag += f" u{unroll} {'same' if torch.equal(y, old) else 'DIFFERENT'}"
                line.append(tag)
        print(f"  {name}: " + "  ".join(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 here and print layouts and shuffles")
    args = ap.parse_args()
    offline() if args.offline else on_gpu()


if __name__ == "__main__":
    main()
