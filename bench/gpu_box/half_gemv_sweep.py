"""The F16 / BF16 GEMV (kernels/half.py) over tiles, beside torch.mv on the 16-bit matrix (cuBLAS, x and the output
rounded to 16 bits), at decode shapes: which tile the half families take (matmul.GEMV_TILES). Every tile is checked
against float64 by relative norm first; weights rotate past the L2, each time a CUDA graph of a pass, median of 15.

Usage (GPU box): PYTHONPATH=. python3 bench/gpu_box/half_gemv_sweep.py [--json F] [--tiles default,4r1w2u,...]
(--tiles: the tiles timed, "default" the family's own, BrWwUu B rows on W warps U groups a step; the default list:
the default and TILES; with PYTHONPATH at another tree, that tree's kernels: session 41 timed 136ed8a's default so.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels_bench import HALF_TYPES, ROTATE_BYTES, copy_bandwidth, graph_seconds, random_blocks  # noqa: E402

from sparkd.engine import quants  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, default_config, gemv  # noqa: E402
from sparkd.engine.kernels import dispatch  # noqa: E402

SHAPES = [(14336, 4096), (4096, 14336), (2880, 2880), (201088, 2880)]  # llama-3-8B-like; gpt-oss's q/o and its head
TILES = [GemvConfig(block_n=b, num_warps=w, unroll=u) for b, w, u in
         ((4, 1, 2), (2, 1, 4), (1, 1, 4), (1, 1, 8), (2, 2, 4), (4, 4, 2), (8, 4, 2), (2, 1, 8), (4, 2, 4), (8, 8, 2),
          (4, 1, 4), (8, 2, 2))]


def tile_name(cfg: GemvConfig | None) -> str:
    return "default" if cfg is None else f"{cfg.block_n}r{cfg.num_warps}w{cfg.unroll}u"


def parse_tiles(text: str) -> list[GemvConfig | None]:
    """--tiles' names (tile_name) as configs; None is the family's default."""
    tiles = []
    for name in text.split(","):
        if name == "default":
            tiles.append(None)
            continue
        m = re.fullmatch(r"(\d+)r(\d+)w(\d+)u", name)
        if not m:
            raise SystemExit(f"--tiles: {name!r} is neither 'default' nor rows-r-warps-w-unroll-u (4r1w2u)")
        tiles.append(GemvConfig(block_n=int(m[1]), num_warps=int(m[2]), unroll=int(m[3])))
    return tiles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiles", default=",".join(map(tile_name, [None, *TILES])), help="tiles timed (tile_name's)")
    args = ap.parse_args()
    tiles = parse_tiles(args.tiles)
    bw, rows_out = copy_bandwidth(), []
    print(f"d2d copy {bw / 1e9:.0f} GB/s")
    for qtype in (T.F16, T.BF16):
        for rows, cols in SHAPES:
            nbytes = rows * dispatch.FAMILIES[qtype].row_bytes(cols)
            n = max(2, -(-ROTATE_BYTES // nbytes))
            buf = random_blocks(qtype, n * nbytes)
            ws = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
            x = torch.randn(cols, device="cuda")
            W = quants.dequantize(ws[0], qtype, (rows, cols)).double()
            ref = W @ x.double()
            y = torch.empty(rows, device="cuda")
            for cfg in tiles:
                got = gemv(ws[0], qtype, (rows, cols), x, out=y, config=cfg)
                err = float((got.double() - ref).norm() / ref.norm())
                sec = graph_seconds(lambda i: gemv(ws[i % n], qtype, (rows, cols), x, out=y, config=cfg), n)
                tag = tile_name(cfg)
                rows_out.append(dict(type=qtype.name, shape=f"{rows}x{cols}", tile=tag, us=sec * 1e6,
                                     frac=nbytes / sec / bw, err=err))
                print(f"{qtype.name:5} {rows}x{cols:<6} {tag:10} {sec * 1e6:8.1f} us {nbytes / sec / bw:5.2f} "
                      f"err {err:.1e}", flush=True)
            hw, hx = [w.view(HALF_TYPES[qtype]).view(rows, cols) for w in ws], x.to(HALF_TYPES[qtype])
            sec = graph_seconds(lambda i: torch.mv(hw[i % n], hx), n)
            rows_out.append(dict(type=qtype.name, shape=f"{rows}x{cols}", tile="torch.mv", us=sec * 1e6,
                                 frac=nbytes / sec / bw))
            print(f"{qtype.name:5} {rows}x{cols:<6} {'torch.mv':10} {sec * 1e6:8.1f} us {nbytes / sec / bw:5.2f}",
                  flush=True)
            del buf, ws, hw
            torch.cuda.empty_cache()
    print("default tile:", default_config(dispatch.FAMILIES[T.F16]))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(copy_bytes_per_second=bw, rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
