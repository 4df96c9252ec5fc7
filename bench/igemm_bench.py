"""The prefill GEMM (matmul.gemm) per weight layout at prompt shapes on CUDA: the integer GEMM ("int8")
at its default tile and at other tiles, against the float one ("ieee"), side by side in one process.

A row: one layout (Q8_0, Q8_0P packed, Q4_K, Q4T the pairx tiled Q4_K, Q6_K), a [rows, cols] weight of
random valid blocks, x float32 [tokens, cols] (x's quantization included, as the engine's GEMM call
quantizes a stack's x once: --qx leaves it out), a tile (IGEMM_BLOCK_N / IGEMM_BLOCK_T / IGEMM_WARPS set in
this process): median µs of CUDA-event-timed calls, int8 TOPS (2 rows cols tokens / s), the speedup over
ieee; every tile's output is checked against the default tile's (the same bits: a tile changes no
element's sum order) and the int8 output against ieee's (relative, the activations' rounding).
    python3 bench/igemm_bench.py --types Q8_0,Q4T,Q6_K --shapes 4096x2048,2048x4096 --tokens 512
"""

from __future__ import annotations

import argparse
import json

import torch
from gguf import GGMLQuantizationType as T
from kernels_bench import events_seconds, random_blocks

from sparkd.engine.kernels import act_quant, dispatch, matmul, q4_k_tiled, q8_0_packed

# --types name: (GGUF type of the random blocks, the layout's qtype, its packing or None)
LAYOUTS = {"Q8_0": (T.Q8_0, T.Q8_0, None), "Q8_0P": (T.Q8_0, q8_0_packed.PACKED, q8_0_packed.pack_raw),
           "Q4_K": (T.Q4_K, T.Q4_K, None),
           "Q4T": (T.Q4_K, q4_k_tiled.TILED, lambda raw, shape: q4_k_tiled.pack_raw(raw, shape, "pairx")),
           "Q6_K": (T.Q6_K, T.Q6_K, None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,Q4T,Q6_K")
    ap.add_argument("--shapes", default="4096x2048,2048x4096", help="rows x cols, comma-separated")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--tiles", default="64/64/4", help="int8 tiles block_n/block_t/warps (the first: checked against)")
    ap.add_argument("--tile-types", default="Q4T", help="the types timed at every --tiles (others: the default)")
    ap.add_argument("--qx", action="store_true", help="x quantized before the timed calls")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    default = (matmul.IGEMM_BLOCK_N, matmul.IGEMM_BLOCK_T, matmul.IGEMM_WARPS)
    tiles = [tuple(int(v) for v in t.split("/")) for t in a.tiles.split(",")]
    rows_out = []
    for name in a.types.split(","):
        qtype, ltype, pack = LAYOUTS[name]
        fam = dispatch.FAMILIES[qtype]
        for shape in a.shapes.split(","):
            rows, cols = (int(v) for v in shape.split("x"))
            raw = random_blocks(qtype, rows * cols // fam.block_values * fam.block_bytes)
            w = raw if pack is None else pack(raw, (rows, cols))
            x = torch.randn(a.tokens, cols, device="cuda")
            qx = act_quant.quantize(x, fam.act_fmt) if a.qx else None
            ieee = events_seconds(lambda: matmul.gemm(w, ltype, (rows, cols), x, "ieee"), max(3, a.repeats // 4))
            y_ieee = matmul.gemm(w, ltype, (rows, cols), x, "ieee")
            first = None
            for tile in (tiles if name in a.tile_types.split(",") else tiles[:1]):
                matmul.IGEMM_BLOCK_N, matmul.IGEMM_BLOCK_T, matmul.IGEMM_WARPS = tile
                try:
                    y = matmul.gemm(w, ltype, (rows, cols), x, "int8", qx=qx)
                    s = events_seconds(lambda: matmul.gemm(w, ltype, (rows, cols), x, "int8", qx=qx), a.repeats)
                finally:
                    matmul.IGEMM_BLOCK_N, matmul.IGEMM_BLOCK_T, matmul.IGEMM_WARPS = default
                first = y if first is None else first
                r = {"type": name, "shape": shape, "tokens": a.tokens, "tile": "/".join(map(str, tile)),
                     "int8_us": s * 1e6, "ieee_us": ieee * 1e6, "tops": 2 * rows * cols * a.tokens / s / 1e12,
                     "speedup": ieee / s, "same_bits_as_first_tile": bool(torch.equal(y, first)),
                     "vs_ieee": float((y - y_ieee).norm() / y_ieee.norm())}
                rows_out.append(r)
                print(f"{name:5s} {shape:10s} x{a.tokens} tile {r['tile']:9s} int8 {r['int8_us']:8.1f} us "
                      f"({r['tops']:6.1f} TOPS)  ieee {r['ieee_us']:9.1f} us  {r['speedup']:5.1f}x  "
                      f"bits {'=' if r['same_bits_as_first_tile'] else '!='}  vs ieee {r['vs_ieee']:.1e}", flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
