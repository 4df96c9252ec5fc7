"""The 4-bit integer steps of session 21 (kernels/iq4_xs.py and q4_0.py idot) and the grid i-quants' of session 22
(iq2_xxs.py, iq3_xxs.py, iq2_xs.py, iq1_s.py: --types IQ2_XXS,IQ3_XXS,IQ2_XS,IQ1_S; each module's INT_FAMILY whatever
its switch says) next to the float paths they replace (their FLOAT_FAMILY, what SPARKD_IQ4_XS_INT=0 / SPARKD_Q4_0_INT=0
and the grid types' default run), in one process at
decode shapes: the GEMV at 4096x4096, 14336x4096, 4096x14336 and the MoE decode layer (gate/up and
down of the type) at 2048x768 and 4096x1536 top-8, as a fraction of the 2 GiB copy measured in the
same run.

Rows: "float default" the float path at its tile (x as given: the caller's Q8_K rounding, a few torch
launches in the engine, not timed), "int default" the integer step with x quantized in the call (two
launches), "int qx" the same with x quantized before the timed calls (as the engine's norm hands it
over), then other integer tiles (rows/warps/groups per step/e|g, kernels_bench.tag). Every row is first
checked against the float64 reference (x rounded as the path rounds it), then timed as kernels_bench
times it: one CUDA graph over weights rotated past the L2, median of 15.

--warm: every row's first call only (its check), nothing timed: run a process per type first, in
parallel, so the timed process finds every kernel in Triton's disk cache.

Usage: PYTHONPATH=.:bench python bench/int4_bench.py [--types IQ4_XS,Q4_0] [--json F] [--tiles 2/1/4/e,...]
       [--no-moe] [--warm]
"""

from __future__ import annotations

import argparse
import json

import torch
from gguf import GGMLQuantizationType as T

import kernels_bench as kb
from gemv_tiles_bench import tile
from sparkd.engine import quants
from sparkd.engine.kernels import act_quant, dispatch, iq1_s, iq2_xs, iq2_xxs, iq3_xxs, iq4_xs, q4_0
from sparkd.engine.kernels.matmul import gemv
from sparkd.engine.kernels.moe import moe_decode, prepare

DENSE = [(4096, 4096), (14336, 4096), (4096, 14336)]
MOES = [(2048, 768, 8), (4096, 1536, 8)]
TILES = "2/1/4/e,4/1/4/e,8/1/2/e"
MODULES = {T.IQ4_XS: iq4_xs, T.Q4_0: q4_0, T.IQ2_XXS: iq2_xxs, T.IQ3_XXS: iq3_xxs, T.IQ2_XS: iq2_xs, T.IQ1_S: iq1_s}
WARM = False  # --warm: check (and so compile) each row, time nothing


def use(qtype: T, way: str) -> None:
    m = MODULES[qtype]
    dispatch.FAMILIES[qtype] = m.INT_FAMILY if way == "int" else m.FLOAT_FAMILY


def seconds(fn, n: int) -> float:
    return float("nan") if WARM else kb.graph_seconds(fn, n)


def row(qtype: T, kernel: str, label: str, nbytes: int, sec: float, copy_bw: float, err: float) -> dict:
    r = dict(kernel=kernel, type=qtype.name, config=label, us=sec * 1e6, bw=nbytes / sec, frac=nbytes / sec / copy_bw,
             err=err)
    kb.print_rows([r])
    return r


def dense(qtype: T, rows: int, cols: int, tiles: list, copy_bw: float) -> list[dict]:
    fam = MODULES[qtype].INT_FAMILY
    nbytes = rows * fam.row_bytes(cols)
    n = max(2, -(-kb.ROTATE_BYTES // nbytes))
    buf = kb.random_blocks(qtype, n * nbytes)
    ws = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
    x = torch.randn(cols, device="cuda")
    W = quants.dequantize(ws[0], qtype, (rows, cols)).double()
    qx = act_quant.quantize(x[None], fam.act_fmt)
    y, out = torch.empty(rows, device="cuda"), []
    for way, label, cfg, pre in [("float", "float default", None, False), ("int", "int default", None, False),
                                 ("int", "int qx", None, True)] + [("int", f"int {t}", tile(t), True) for t in tiles]:
        use(qtype, way)
        q = qx if pre else None
        y.fill_(float("nan"))
        err = kb.rel_err(gemv(ws[0], qtype, (rows, cols), x, out=y, config=cfg, qx=q), W @ kb.x_in(qtype, x).double())
        sec = seconds(lambda i: gemv(ws[i % n], qtype, (rows, cols), x, out=y, config=cfg, qx=q), n)
        out.append(row(qtype, f"gemv {rows}x{cols}", label, nbytes, sec, copy_bw, err))
    return out


def moe(qtype: T, shape: tuple[int, int, int], copy_bw: float) -> list[dict]:
    D, F, A = shape
    torch.manual_seed(0)
    expert_bytes = 3 * F * MODULES[qtype].INT_FAMILY.row_bytes(D)
    n_sets = max(2, -(-kb.ROTATE_BYTES // (A * expert_bytes)))
    full, _ = kb.moe_table(qtype, n_sets * A, shape=shape)
    tables = [kb.subset(full, list(range(s * A, (s + 1) * A))[::-1]) for s in range(n_sets)]
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    y, out = torch.empty(D, device="cuda"), []
    for way in ("float", "int"):
        use(qtype, way)
        ps = [prepare(t, "cuda") for t in tables]
        y.fill_(float("nan"))
        err = kb.moe_err(ps[0], x, w, moe_decode(ps[0], x, w, out=y))
        sec = seconds(lambda i: moe_decode(ps[i % n_sets], x, w, out=y), n_sets)
        out.append(row(qtype, f"moe {D}x{F} top{A}", f"{way} default", A * expert_bytes, sec, copy_bw, err))
    return out


def main() -> None:
    global WARM
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="IQ4_XS,Q4_0")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiles", default=TILES, help="integer tiles beside the default, comma-separated ('' none)")
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--warm", action="store_true", help="check every row (compiling its kernels), time nothing")
    args = ap.parse_args()
    WARM = args.warm
    tiles = [t for t in args.tiles.split(",") if t]
    copy_bw = 1.0 if WARM else kb.copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  d2d copy {copy_bw / 1e9:.0f} GB/s (read+write)")
    print(f"{'kernel':34} {'type':5} {'config':32} {'us':>9} {'GB/s':>7} {'frac':>5} {'rel err':>8}", flush=True)
    rows = []
    for qtype in (T[name] for name in args.types.split(",")):
        for shape in [] if args.no_moe else MOES:  # the MoE first: the rows the big MoE files run
            rows += moe(qtype, shape, copy_bw)
        for r, c in DENSE:
            rows += dense(qtype, r, c, tiles, copy_bw)
        dispatch.FAMILIES[qtype] = MODULES[qtype].FAMILY
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bytes_per_second=copy_bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
