"""The prefill GEMMs (prefill_gemm.gemm, and grouped_gemm over many experts as moe_prefill runs it) per weight layout
at prompt shapes on CUDA: the integer GEMM ("int8") at several launches, and the float GEMM, side by side in one
process.

A row: one layout (Q8_0, Q8_0P packed, Q4_K, Q4T the pairx tiled Q4_K, Q6_K, Q6T its tiled layout, Q4_0, IQ4_XS, and
since session 23 the grid i-quants IQ2_XXS, IQ3_XXS, IQ2_XS, IQ1_S; since session 42 MXFP4 and MXFP4T its
resident tiled layout, gpt-oss's experts), a [rows, cols] weight of random valid blocks
(grouped: --experts of them, one buffer, the tokens routed to --top-k random experts each and cut in expert tiles of
--block-t rows by moe_prefill.expert_tiles; a shape with rows > cols is a down projection: one x row per routed row, as
moe_prefill's down), x float32 [tokens, cols] quantized before the timed calls (as the engine quantizes a stack's or
a MoE layer's x once), a way (--ways): "s11" / "s12" (session 11's / 12's table), "s13" (prefill_gemm.IGEMM_TILES,
the default), or a launch bn/bt/warps/unroll/stages/kblock[/maxnreg[/fold]] (prefill_gemm.IgemmTile with steps: bt
the dense GEMM's tokens a program; kblock 0 iblock, 1 kblock, 2 the family's wblock where it has one; maxnreg 0 or
left out: Triton's; fold 1: the family's fblock where it has one, MXFP4T's bf16 blocks, session 43), or a float
precision (FLOAT_WAYS: the float GEMM on x unquantized, what a family without an iblock runs; "ieee" is what Q4_0's
and IQ4_XS's prompts ran before session 22, the grid i-quants' before session 23), or slab-bf16 / slab-f16[-MiB]
(kernels/slab_gemm, dense only: session 46):
median µs of CUDA-event-timed calls, TOPS (2 rows cols routed rows / s), the speedup over the first way, whether the
output is the first way's bits and its relative difference from it (Frobenius; a float way against an integer one:
x's int8 rounding) and, dense, its relative error against float64 over the blocks' values (err64, x's first 512 rows).
    python3 bench/igemm_bench.py --types Q8_0,Q4T --shapes 2048x2048 --grouped 768x2048,2048x768 --tokens 512,2048
    python3 bench/igemm_bench.py --types Q4_0,IQ4_XS --grouped-types Q4_0,IQ4_XS --ways ieee,s13,tf32
    python3 bench/igemm_bench.py --types Q4T,Q8_0 --shapes 18432x7168,7168x18432 --grouped '' \
        --ways s13,slab-bf16,slab-f16 --tokens 1024,8000
    python3 bench/igemm_bench.py --types IQ2_XXS,IQ3_XXS,IQ2_XS,IQ1_S --grouped-types IQ2_XXS,IQ3_XXS,IQ2_XS,IQ1_S \
        --ways ieee,s13,tf32,64/32/8/1/2/0
"""

from __future__ import annotations

import argparse
import json

import torch
from gguf import GGMLQuantizationType as T
from kernels_bench import events_seconds, random_blocks

from sparkd.engine.kernels import (INT8, PRECISIONS, SLAB_TYPES, act_quant, dispatch, moe_prefill, mxfp4_tiled,
                                   prefill_gemm, q4_k_tiled, q6_k_tiled, q8_0_packed, slab_gemm)
from sparkd.engine.kernels.dequantize import dequantize

# --types name: (GGUF type of the random blocks, the layout's qtype, its packing or None)
LAYOUTS = {"Q8_0": (T.Q8_0, T.Q8_0, None), "Q8_0P": (T.Q8_0, q8_0_packed.PACKED, q8_0_packed.pack_raw),
           "Q4_K": (T.Q4_K, T.Q4_K, None),
           "Q4T": (T.Q4_K, q4_k_tiled.TILED, lambda raw, shape: q4_k_tiled.pack_raw(raw, shape, "pairx")),
           "Q6_K": (T.Q6_K, T.Q6_K, None), "Q6T": (T.Q6_K, q6_k_tiled.TILED, q6_k_tiled.pack_raw),
           "Q4_0": (T.Q4_0, T.Q4_0, None), "IQ4_XS": (T.IQ4_XS, T.IQ4_XS, None),
           **{t.name: (t, t, None) for t in (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ1_S)},
           "MXFP4": (T.MXFP4, T.MXFP4, None), "MXFP4T": (T.MXFP4, mxfp4_tiled.TILED, mxfp4_tiled.pack_raw)}
FLOAT_WAYS = tuple(p for p in PRECISIONS if p != INT8)  # --ways that time the float GEMM at that tl.dot precision
# --ways that time kernels/slab_gemm (dense only, session 46): the blocks dequantized to bf16 / f16 slabs, cuBLAS;
# "slab-bf16-16" etc. cap the slab at that many MiB (default slab_gemm.SLAB_BYTES)
SLAB_PREFIX = "slab-"


DEVICE = "cuda"


def use_way(way: str) -> None:
    """Set matmul's integer GEMM launch to a --ways entry (a bn/bt/... launch: for every layout; a float way: the
    default)."""
    prefill_gemm.IGEMM_WAY = way if way in prefill_gemm.IGEMM_WAYS else DEFAULT_WAY
    prefill_gemm.igemm_tile = TABLE
    if way not in prefill_gemm.IGEMM_WAYS + FLOAT_WAYS:
        bn, bt, warps, unroll, stages, kb, *reg = (int(v) for v in way.split("/"))
        tile = prefill_gemm.IgemmTile(bn, bt, warps, unroll, stages, True, kb > 0, kb == 2, *reg)
        prefill_gemm.igemm_tile = lambda fam, grouped: tile


TABLE = prefill_gemm.igemm_tile
DEFAULT_WAY = prefill_gemm.IGEMM_WAY


def routed(tokens: int, experts: int, top_k: int, down: bool, block_t: int):
    """(src int32 [R], tiles, x rows): tokens routed to top_k random experts each, rows sorted by expert."""
    ids = torch.stack([torch.randperm(experts, device=DEVICE)[:top_k] for _ in range(tokens)]).reshape(-1)
    keys, order = torch.sort(ids, stable=True)
    src = torch.arange(order.numel(), device=DEVICE) if down else order // top_k
    return src.to(torch.int32), moe_prefill.expert_tiles(keys, experts, block_t), order.numel() if down else tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,Q4T,Q6_K")
    ap.add_argument("--shapes", default="2048x2048", help="dense rows x cols, comma-separated ('' none)")
    ap.add_argument("--grouped", default="768x2048,2048x768", help="grouped rows x cols per expert ('' none)")
    ap.add_argument("--grouped-types", default="Q8_0,Q4_K,Q4T", help="the --types timed grouped too")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--block-t", type=int, default=None, help="the expert tile height (default: the layout's, "
                                                              "IgemmTile.expert_rows)")
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--ways", default="s11,s12",
                    help="s11, s12, s13, bn/bt/warps/unroll/stages/kblock[/maxnreg[/fold]] or a float precision "
                         f"({', '.join(FLOAT_WAYS)}); the first is the base")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    ways = a.ways.split(",")
    rows_out = []
    if any(w.startswith(SLAB_PREFIX) for w in ways) and a.grouped:
        ap.error("slab ways time the dense GEMM only: pass --grouped ''")
    for name in a.types.split(","):
        qtype, ltype, pack = LAYOUTS[name]
        fam = dispatch.FAMILIES[qtype]
        cases = [("dense", s) for s in a.shapes.split(",") if s]
        cases += [("grouped", s) for s in a.grouped.split(",") if s and name in a.grouped_types.split(",")]
        for kind, shape in cases:
            rows, cols = (int(v) for v in shape.split("x"))
            n_w = a.experts if kind == "grouped" else 1
            raw = random_blocks(qtype, n_w * rows * cols // fam.block_values * fam.block_bytes, DEVICE)
            size = raw.numel() // n_w
            w = raw if pack is None else torch.cat([pack(raw[e * size:(e + 1) * size], (rows, cols)) for e in range(n_w)])
            offsets = torch.arange(n_w, dtype=torch.int64, device=DEVICE) * size
            for tokens in (int(t) for t in a.tokens.split(",")):
                if kind == "grouped":
                    block_t = a.block_t or TABLE(dispatch.family(ltype), True).expert_rows
                    src, tiles, n_x = routed(tokens, a.experts, a.top_k, rows > cols, block_t)
                    x = torch.randn(n_x, cols, device=DEVICE)
                    qx = act_quant.quantize(x, fam.act_fmt)
                    call = lambda p: prefill_gemm.grouped_gemm(  # noqa: E731
                        w, offsets, ltype, (rows, cols), x, src, tiles, p, qx if p == INT8 else None, block_t)
                    work = src.numel()
                else:
                    x = torch.randn(tokens, cols, device=DEVICE)
                    qx = act_quant.quantize(x, fam.act_fmt)
                    call = lambda p: prefill_gemm.gemm(w, ltype, (rows, cols), x, p,  # noqa: E731
                                                 qx=qx if p == INT8 else None)
                    work = tokens
                    # float64 over the blocks' values (the errors below): the first 512 rows keep it small
                    ref = x[:512].double() @ dequantize(w, ltype, (rows, cols)).double().T
                first = base = None
                for way in ways:
                    precision = way if way in FLOAT_WAYS else INT8
                    run = lambda: call(precision)  # noqa: E731
                    if way.startswith(SLAB_PREFIX):
                        dtype, *mib = way[len(SLAB_PREFIX):].split("-")
                        cap = int(mib[0]) << 20 if mib else slab_gemm.SLAB_BYTES
                        run = lambda: slab_gemm.slab_gemm(w, ltype, (rows, cols), x,  # noqa: E731
                                                          SLAB_TYPES[dtype], cap)
                    else:
                        use_way(way)
                    try:
                        y = run()
                        s = events_seconds(run, a.repeats)
                    finally:
                        use_way(DEFAULT_WAY)
                    first = y if first is None else first
                    base = s if base is None else base
                    r = {"type": name, "kind": kind, "shape": shape, "tokens": tokens, "way": way, "us": s * 1e6,
                         "tops": 2 * rows * cols * work / s / 1e12, "speedup": base / s,
                         "same_bits_as_first": bool(torch.equal(y, first)),
                         "diff_to_first": float((y - first).norm() / first.norm())}
                    if kind == "dense":
                        r["err64"] = float((y[:512].double() - ref).norm() / ref.norm())
                    rows_out.append(r)
                    print(f"{name:6s} {kind:7s} {shape:10s} x{tokens:<5d} {way:16s} {r['us']:9.1f} us "
                          f"({r['tops']:6.1f} TOPS) {r['speedup']:5.2f}x  bits "
                          f"{'=' if r['same_bits_as_first'] else '!='} diff {r['diff_to_first']:.1e} err64 {r.get('err64', 0):.1e}",
                          flush=True)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
