"""IQ4_XS's integer step (kernels/iq4_xs.py idot, session 21) next to the float path it replaces
(iq4_xs.FLOAT_FAMILY, what SPARKD_IQ4_XS_INT=0 runs), in one process at decode shapes: the GEMV
at 4096x4096, 14336x4096, 4096x14336 and the MoE decode layer (gate/up and down IQ4_XS) at 2048x768
and 4096x1536 top-8, as a fraction of the 2 GiB copy measured in the same run.

Rows: "float default" the float path at its tile (x as given: the caller's Q8_K rounding, a few torch
launches in the engine, not timed), "int default" the integer step with x quantized in the call (two
launches), "int qx" the same with x quantized before the timed calls (as the engine's norm hands it
over), then other integer tiles (rows/warps/groups per step/e|g, kernels_bench.tag). Every row is first
checked against the float64 reference (x rounded as the path rounds it), then timed as kernels_bench
times it: one CUDA graph over weights rotated past the L2, median of 15.

Usage: PYTHONPATH=.:bench python bench/iq4_xs_bench.py [--json F] [--tiles 2/1/4/e,...] [--no-moe]
"""

from __future__ import annotations

import argparse
import json

import torch
from gguf import GGMLQuantizationType as T

import kernels_bench as kb
from gemv_tiles_bench import tile
from sparkd.engine import quants
from sparkd.engine.kernels import act_quant, dispatch, iq4_xs
from sparkd.engine.kernels.matmul import gemv
from sparkd.engine.kernels.moe import moe_decode, prepare

DENSE = [(4096, 4096), (14336, 4096), (4096, 14336)]
MOES = [(2048, 768, 8), (4096, 1536, 8)]
TILES = "2/1/4/e,4/1/4/e,8/1/2/e"
FAMILIES = {"float": iq4_xs.FLOAT_FAMILY, "int": iq4_xs.INT_FAMILY}


def use(way: str) -> None:
    dispatch.FAMILIES[T.IQ4_XS] = FAMILIES[way]


def row(kernel: str, label: str, nbytes: int, sec: float, copy_bw: float, err: float) -> dict:
    r = dict(kernel=kernel, type="IQ4_XS", config=label, us=sec * 1e6, bw=nbytes / sec, frac=nbytes / sec / copy_bw,
             err=err)
    kb.print_rows([r])
    return r


def dense(rows: int, cols: int, tiles: list, copy_bw: float) -> list[dict]:
    nbytes = rows * iq4_xs.FAMILY.row_bytes(cols)
    n = max(2, -(-kb.ROTATE_BYTES // nbytes))
    buf = kb.random_blocks(T.IQ4_XS, n * nbytes)
    ws = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
    x = torch.randn(cols, device="cuda")
    W = quants.dequantize(ws[0], T.IQ4_XS, (rows, cols)).double()
    qx = act_quant.quantize(x[None], act_quant.Q8_K)
    y, out = torch.empty(rows, device="cuda"), []
    for way, label, cfg, pre in [("float", "float default", None, False), ("int", "int default", None, False),
                                 ("int", "int qx", None, True)] + [("int", f"int {t}", tile(t), True) for t in tiles]:
        use(way)
        q = qx if pre else None
        y.fill_(float("nan"))
        err = kb.rel_err(gemv(ws[0], T.IQ4_XS, (rows, cols), x, out=y, config=cfg, qx=q),
                         W @ kb.x_in(T.IQ4_XS, x).double())
        sec = kb.graph_seconds(lambda i: gemv(ws[i % n], T.IQ4_XS, (rows, cols), x, out=y, config=cfg, qx=q), n)
        out.append(row(f"gemv {rows}x{cols}", label, nbytes, sec, copy_bw, err))
    return out


def moe(shape: tuple[int, int, int], copy_bw: float) -> list[dict]:
    D, F, A = shape
    torch.manual_seed(0)
    expert_bytes = 3 * F * iq4_xs.FAMILY.row_bytes(D)
    n_sets = max(2, -(-kb.ROTATE_BYTES // (A * expert_bytes)))
    full, _ = kb.moe_table(T.IQ4_XS, n_sets * A, shape=shape)
    tables = [kb.subset(full, list(range(s * A, (s + 1) * A))[::-1]) for s in range(n_sets)]
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    y, out = torch.empty(D, device="cuda"), []
    for way in ("float", "int"):
        use(way)
        ps = [prepare(t, "cuda") for t in tables]
        y.fill_(float("nan"))
        err = kb.moe_err(ps[0], x, w, moe_decode(ps[0], x, w, out=y))
        sec = kb.graph_seconds(lambda i: moe_decode(ps[i % n_sets], x, w, out=y), n_sets)
        out.append(row(f"moe {D}x{F} top{A}", f"{way} default", A * expert_bytes, sec, copy_bw, err))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiles", default=TILES, help="integer tiles beside the default, comma-separated ('' none)")
    ap.add_argument("--no-moe", action="store_true")
    args = ap.parse_args()
    tiles = [t for t in args.tiles.split(",") if t]
    copy_bw = kb.copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  d2d copy {copy_bw / 1e9:.0f} GB/s (read+write)")
    print(f"{'kernel':34} {'type':5} {'config':32} {'us':>9} {'GB/s':>7} {'frac':>5} {'rel err':>8}", flush=True)
    rows = []
    for shape in [] if args.no_moe else MOES:  # the MoE first: the rows the engine's IQ4_XS MoE files run
        rows += moe(shape, copy_bw)
    for r, c in DENSE:
        rows += dense(r, c, tiles, copy_bw)
    use("int" if iq4_xs.FAMILY is iq4_xs.INT_FAMILY else "float")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bytes_per_second=copy_bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
