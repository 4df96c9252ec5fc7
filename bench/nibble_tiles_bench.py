"""The 4-bit types' decode kernels (MXFP4, Q4_0) on the GGUF blocks against their nibble_tiles resident layout
(kernels/mxfp4_tiled.py, kernels/q4_0_tiled.py), the same weights side by side in one run: the GEMV and the MoE
decode (SHAPES: gpt-oss-20b's 2880x2880 top-4 for MXFP4, qwen3-30b-a3b's 2048x768 top-8 for Q4_0, a wider MoE shape
for both), as a fraction of the device-to-device copy bandwidth measured in the same run, each checked against the
float64 reference first; x quantized before, as the engine's norm does. Tiles: the defaults, then TILED_TILES (the
tiled rows' candidates) and the MoE's GATE_UPS and DOWNS, the layer as the engine runs it.

Usage (GPU): PYTHONPATH=. python bench/nibble_tiles_bench.py [--types MXFP4,Q4_0] [--json F] [--sweep all|gemv|moe|none]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from gguf import GGMLQuantizationType as T

from kernels_bench import (copy_bandwidth, graph_seconds, moe_err, moe_table, print_rows, random_blocks, rel_err,
                           subset, tag, x_in)
from sparkd.engine import quants
from sparkd.engine.kernels import act_quant, dispatch, moe, moe_tiles
from sparkd.engine.kernels.matmul import GemvConfig, gemv
from sparkd.engine.kernels.moe import ExpertTable, moe_decode, prepare

ROTATE_BYTES = 768 << 20  # as kernels_bench: working sets past the 50 MB L2
# type -> (GEMV shapes, MoE shapes (model width, expert width, experts a token)); Q4_0's GEMVs session 21's, then
# (session 27) qwen3-30b-a3b's fused qkv, o and head
SHAPES = {T.MXFP4: ([(2880, 2880), (14336, 4096)], [(2880, 2880, 4), (4096, 1536, 8)]),
          T.Q4_0: ([(4096, 4096), (14336, 4096), (4096, 14336), (5120, 2048), (2048, 4096), (151936, 2048)],
                   [(2048, 768, 8), (4096, 1536, 8)])}
# GEMV tiles on the tiled rows, rows/warps/unroll/split (0: matmul.split_for's wave rule). Session 26's sweep (offline
# sm_90: 4/1/1/e 123 warp instructions a group and 5 loads, the GGUF step's 178 and 20): 8- and 16-row tiles lost at
# every shape; session 27's first call: on short rows the split-K's fold is the GEMV's loss (4096x4096: 2-row programs
# over whole rows 5.4 us, the default 8.3; not in the decode under PDL: docs/performance.md), so these are the family's
# own tile (4/1/2/0), whole rows on 1, 2 and 4 rows a program, and 2 ranges
TILED_TILES = [GemvConfig(4, 1, 2, 0, True), GemvConfig(4, 1, 4, 0, True), GemvConfig(4, 1, 2, 2, True),
               GemvConfig(4, 1, 4, 1, True), GemvConfig(2, 1, 2, 1, True), GemvConfig(2, 1, 4, 1, True),
               GemvConfig(2, 1, 4, 0, True), GemvConfig(1, 1, 2, 1, True), GemvConfig(1, 1, 4, 1, True),
               GemvConfig(1, 1, 8, 1, True)]
PARTS_TILE = GemvConfig(4, 1, 2, 0, True)  # also timed with its partials left unsummed (an o projection's, fold20)
# MoE tiles on the tiled experts beside the defaults, the layer as the engine runs it (x quantized by the norm
# before, h in the gate/up launch): gate/up tiles (down at its default), then down tiles (rows/warps/unroll/e|g/split;
# split: ranges of experts; gate/up at its default). Session 25's first call: the down in 2 ranges 45.1 against
# 50.5 us at 2880x2880 top-4 (one range: a program's loop runs 4 experts x 11.25 groups one after another)
GATE_UPS = ["4/1/1/e", "2/1/2/e", "2/1/1/e", "8/1/1/e"]
DOWNS = ["4/1/1/e/2", "4/1/2/e/2", "4/1/1/e/4", "4/1/2/e/4", "2/1/2/e/4", "2/1/1/e/4", "4/1/1/g/4", "8/1/1/e/4",
         "4/1/2/e/8", "2/1/2/e/8"]


def dense_rows(qtype: T, rows: int, cols: int, copy_bw: float, sweep: bool) -> list[dict]:
    layout = moe.NIBBLE_TILED[qtype]
    nbytes = rows * cols // 32 * layout.LAYOUT.block_bytes
    n = max(2, -(-ROTATE_BYTES // nbytes))
    buf = random_blocks(qtype, n * nbytes)
    gguf = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
    tiled = [layout.pack_raw(w, (rows, cols)) for w in gguf]
    x = torch.randn(cols, device="cuda")
    ref = quants.dequantize(gguf[0], qtype, (rows, cols)).double() @ x_in(qtype, x).double()
    fmt = dispatch.FAMILIES[qtype].act_fmt  # x quantized before, as the norm does (None: the float path's x)
    qx = act_quant.quantize(x[None], fmt) if fmt else None
    y, out = torch.empty(rows, device="cuda"), []

    def time(ws, wtype, cfg, label, parts=False):
        y.fill_(float("nan"))
        got = gemv(ws[0], wtype, (rows, cols), x, out=y, config=cfg, qx=qx, parts=parts)
        err = rel_err(got.sum(0) if parts else got, ref)
        sec = graph_seconds(lambda i: gemv(ws[i % n], wtype, (rows, cols), x, out=y, config=cfg, qx=qx, parts=parts),
                            n)
        return dict(kernel=f"gemv {rows}x{cols}", type=qtype.name, config=label, us=sec * 1e6, bw=nbytes / sec,
                    frac=nbytes / sec / copy_bw, err=err)
    out.append(time(gguf, qtype, None, "gguf default"))
    out.append(time(tiled, layout.TILED, None, "tiled default"))
    for cfg in TILED_TILES if sweep else []:
        out.append(time(tiled, layout.TILED, cfg, f"tiled {tag(cfg)}"))
    if sweep:
        out.append(time(tiled, layout.TILED, PARTS_TILE, f"tiled {tag(PARTS_TILE)} partials", parts=True))
    return out


def config(text: str) -> GemvConfig:
    """rows/warps/unroll/e|g[/split] as a GemvConfig."""
    rows, warps, unroll, mode, *split = text.split("/")
    return GemvConfig(int(rows), int(warps), int(unroll), int(split[0]) if split else 0, mode == "e")


def moe_rows(qtype: T, shape: tuple[int, int, int], copy_bw: float, sweep: bool) -> list[dict]:
    D, F, A = shape
    torch.manual_seed(0)
    expert_bytes = 3 * F * dispatch.FAMILIES[qtype].row_bytes(D)
    n_sets = max(2, -(-ROTATE_BYTES // (A * expert_bytes)))
    full, _ = moe_table(qtype, n_sets * A, shape=shape)  # 4 KiB slots: 16-byte offsets
    copy = ExpertTable(*(full.gate.clone(),) * 3, full.gate_offsets, full.up_offsets, full.down_offsets,
                       full.gate_up_type, full.down_type, D, F)
    tiled = moe.tiled_nibbles(copy)
    sets = {name: [prepare(subset(t, list(range(s * A, (s + 1) * A))[::-1]), "cuda") for s in range(n_sets)]
            for name, t in (("gguf", full), ("tiled", tiled))}
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    qx = act_quant.quantize(x[None], sets["gguf"][0].gate_up.act_fmt)  # the norm's (the same format both ways)
    y, out, nbytes = torch.empty(D, device="cuda"), [], A * expert_bytes

    def time(name, gu, dn, label):
        ps = sets[name]
        base = moe.decode_tiles(ps[0])
        gu, dn = dataclasses.replace(gu or base[0], fuse_quant=True), dn or base[1]
        y.fill_(float("nan"))
        err = moe_err(ps[0], x, w, moe_decode(ps[0], x, w, out=y, gate_up=gu, down=dn, qx=qx), gu,
                      ref=sets["gguf"][0].table)
        sec = graph_seconds(lambda i: moe_decode(ps[i % n_sets], x, w, out=y, gate_up=gu, down=dn, qx=qx), n_sets)
        return dict(kernel=f"moe {D}x{F} top{A}", type=qtype.name, config=f"{label} {tag(gu)}/{tag(dn)}", us=sec * 1e6,
                    bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=err)
    out.append(time("gguf", None, None, "gguf default"))
    if qtype == T.MXFP4:
        out.append(time("gguf", None, moe_tiles.DOWN_CONFIG, "gguf s24 down"))  # before MXFP4_DOWN (one range)
    out.append(time("tiled", None, None, "tiled default"))
    for gu in GATE_UPS if sweep else []:
        out.append(time("tiled", config(gu), None, "tiled"))
    for dn in DOWNS if sweep else []:
        if config(dn).split <= A:
            out.append(time("tiled", None, config(dn), "tiled"))
    out.append(time("gguf", None, None, "gguf default again"))  # the drift over the run
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--sweep", default="all", choices=("all", "gemv", "moe", "none"),
                    help="the candidates beside the defaults: TILED_TILES (gemv), GATE_UPS and DOWNS (moe), both, none")
    ap.add_argument("--types", default="MXFP4,Q4_0", help="comma-separated, of " + ",".join(t.name for t in SHAPES))
    args = ap.parse_args()
    names = {t.name: t for t in SHAPES}
    types = [names.get(name.strip().upper()) for name in args.types.split(",")]
    if None in types:
        ap.error(f"--types {args.types!r}: each one of {', '.join(names)}")
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for qtype in types:
        dense, moes = SHAPES[qtype]
        for rows_, cols in dense:
            part = dense_rows(qtype, rows_, cols, copy_bw, args.sweep in ("all", "gemv"))
            print_rows(part)
            rows += part
        for shape in moes:
            part = moe_rows(qtype, shape, copy_bw, args.sweep in ("all", "moe"))
            print_rows(part)
            rows += part
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(copy_bw=copy_bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
