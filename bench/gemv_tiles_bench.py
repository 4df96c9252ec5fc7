"""The integer GEMV's tiles at the engine's decode shapes (Qwen3-30B-A3B: output head, q/o, fused
qkv, MoE experts), old default next to the candidates, Q8_0 on the GGUF blocks and repacked
(kernels/q8_0_packed.py, type name Q8_0P), Q4_K, Q4_K repacked in tiles of 4 rows (kernels/q4_k_tiled.py,
type name Q4T; its "old default" row is the GGUF blocks with q4_k's GEMV_TILES tile), Q6_K, Q6_K repacked
in tiles of 8 rows (kernels/q6_k_tiled.py, type name Q6T; "old default": the GGUF blocks with q6_k's
GEMV_TILES tile; a line after each shape says which tiled rows gave the old default's bits); the copy
bandwidth measured in the same run. old default: matmul.OLD_GEMV_TILES (session 3's tiles),
default: GEMV_TILES. Q6_K's old default is its float path (q6_k.FLOAT_FAMILY, what
SPARKD_Q6_K_INT=0 runs) at its session-4 tile GemvConfig(); "float default" is that path at
GEMV_TILES' Q6_K tile. --moe-q6k: the MoE 2048x768 top-8 with Q4_K gate/up and a Q6_K down (a
Q4_K_M file's experts), float down (left out with --no-float-down) vs the integer down's tiles, timed
before the dense shapes.

frac: the kernel's bytes per second over the 2 GiB copy's (read + written); frac_same: over a
copy of the same bytes (half the weight's bytes read, half written, rotated past the L2 as the
weights are, timed the same way): the small shapes cannot reach the large copy's bandwidth, a
launch and its drain take microseconds whatever the size.

Usage: PYTHONPATH=.:bench python bench/gemv_tiles_bench.py [--json F] [--types Q8_0,Q8_0P,Q4_K,Q4T,Q6_K] [--moe]
       [--moe-types Q8_0,Q4_K] [--defaults-only] [--moe-q6k [--no-float-down]] [--vs-s5] [--qx] [--q4t-sweep] [--q4t-s7] [--q4t-rows L,...]
       [--compile-workers N] [--pdl [--prefetch off,lines,bulk] [--producer]]

--vs-s5 (session 6): "s5 default" (GEMV_TILES' tile at session 5's split rule, matmul.split_for
rule "old", as an explicit split) next to "default" and S6_CANDIDATES; --qx: x quantized once before the timed calls, as the
engine's norm hands it to the GEMV (one launch per call; without it each call also quantizes x,
two launches), with "+quant" rows for the old way; --compile-workers N: N processes compile every
row's kernel first (Triton's disk cache), so the timed process only loads them; --pdl (session 9):
only the default tile, launched without and with programmatic dependent launch (kernels/pdl.py: the
graph's launches overlap the one before's tail), and whether the two give the same bits; --prefetch
MODES (session 11, pdl11): --pdl's rows with the GEMV's weight prefetch before the PDL wait
(kernels/pdl.py's SPARKD_PDL_PREFETCH modes: PDL on in each mode; a launch without PDL prefetches
nothing since the lead's review, so session 11's "pdl off prefetch" rows are gone), each checked for PDL
off's bits; --producer: those rows again as the engine runs the GEMV, after the
launch that hands it x (residual add + RMSNorm + x's int8 blocks, rms_norm.add_rms_norm_quant: "norm+"
rows, checked against the first of them; err there is against another x, nan), and "norm alone".

A line after each shape says which rows gave the default row's bits (session 12).
Every row is first checked against the float64 reference (x rounded as llama.cpp rounds it), then
timed as kernels_bench times it: one CUDA graph over weights rotated past the L2, median of 15.
Tiles: rows/warps/groups per step/(e: elementwise tile reduced after the loop | g: every group)[w: the split's
ranges on one program's warps, GemvConfig.warps_k][n: no split-K fold, times only (NO_FOLD)][/split[/stages]],
for Q4T after loads: (q4_k_tiled.FAMILIES' key, e.g. vector:4/1/4/e);
--shapes 151936x2048,14336x4096 replaces SHAPES.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import multiprocessing as mp

import torch
from gguf import GGMLQuantizationType as T

import kernels_bench as kb
import q4t_twins
from sparkd.engine import quants
from sparkd.engine.kernels import act_quant, dispatch, matmul, pdl, q4_k_tiled, q6_k_tiled, q8_0_packed, rms_norm
from sparkd.engine.kernels import moe as moe_module
from sparkd.engine.kernels.matmul import GEMV_TILES, OLD_GEMV_TILES, GemvConfig, gemv, split_for
from sparkd.engine.kernels.moe import ExpertTable, moe_decode, prepare
from sparkd.engine.layers.act_round import round_activations

SHAPES = [(151936, 2048), (4096, 2048), (2048, 4096), (5120, 2048)]
CANDIDATES_ON = True  # --defaults-only: only the old and the new default tiles
VS_S5 = False  # --vs-s5: session 5's tile and split rule ("s5 default") first, S6_CANDIDATES after
DEV = "cuda"  # (the interpreter's "cpu" to try the code paths off the box)
QX = False  # --qx: x quantized before the timed calls, as the engine's norm writes it
PDL_ROWS = False  # --pdl: the default tile with PDL off and on (how's "pdl": the mode of the row's launches)
PREFETCH_ROWS: list[str] = []  # --prefetch: --pdl's rows in these weight prefetch modes (how's "prefetch")
PRODUCER = False  # --producer: --pdl's rows after the add + norm + quant launch that makes x (how's "producer")


def tile(text: str) -> GemvConfig:
    """rows/warps/unroll/e|g[w][n][/split[/stages]] as a GemvConfig (split 0 or left out: chosen from the
    shape; stages: GemvConfig.stages, the pipeliner's cp.async stages; n: no fold, NO_FOLD; w: the split's
    ranges on the warps of one program, GemvConfig.warps_k, session 12)."""
    rows, warps, unroll, mode, *rest = text.split("/")
    split, stages = (list(map(int, rest)) + [0, 0])[:2]
    return GemvConfig(int(rows), int(warps), int(unroll), split, mode.startswith("e"), stages=stages,
                      fold=NO_FOLD if mode.endswith("n") else GemvConfig().fold, warps_k="w" in mode)


# session 8 (fold19): a tile's "n" (e.g. 4/1/4/en/4): the launch stores its split-K partials and nothing
# sums them (times only, its y is wrong): GemvConfig.fold "torch" with the torch fold skipped in this
# process, so the row is the kernel without matmul.fold_part's store, barrier, fence, ticket and read-back
NO_FOLD = "torch"


def _skip_fold(part: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y


if GemvConfig().fold == "kernel":  # (with $SPARKD_GEMV_FOLD=torch every row would lose its fold: keep it)
    matmul.fold_partials = moe_module.fold_partials = _skip_fold


CANDIDATES = {  # loops without barriers or shuffles in bench/kernels_sass.py, plus the session-3 shapes
    "Q8_0": ["4/1/2/e", "2/1/4/e", "4/1/4/e"],
    "Q8_0P": ["4/1/2/e", "2/1/4/e", "2/1/8/e", "4/2/4/e", "8/4/2/e", "8/4/4/e", "1/1/8/e", "2/1/4/e/1",
              "4/2/4/e/1"],
    # Q4_K (kern6): 1-warp tiles of 4-8 rows, the whole row's groups in one or two loop steps, with
    # and without split-K, next to session 4's best elementwise shapes
    "Q4_K": ["4/1/4/e", "4/1/4/e/1", "4/1/8/e/1", "8/2/4/e", "8/1/4/e/1", "2/1/8/e/1", "16/4/2/e"],
    "Q6_K": ["4/1/4/e", "4/1/2/e", "8/2/2/e", "4/1/2/g"],  # q6k8: the integer step's first tiles
    # tiled (session 5): the default 4/1/4/e (kern6's tile); q4k9: the integer steps with fewer loads
    # (loads:tile, q4_k_tiled.FAMILIES) at the tiles the offline SASS keeps at 64 registers
    "Q4T": ["vector:4/1/4/e", "vector:4/1/2/e"],
    # tiled Q6_K (session 6, q6k9): one 8-row packing tile per warp, 2 or 4 groups per step (the default
    # 8/1/1/e: 1; offline SASS: 64, 68, 96 registers), two tiles on two warps
    "Q6T": ["8/1/2/e", "8/1/4/e", "16/2/2/e",
            "8/2/1/e", "4/1/1/e", "4/1/2/e"],  # session 8 (diag16): programs of part of a tile, 2 warps
}
S6_CANDIDATES = {  # --vs-s5 (session 6, q4k10): the split by hand around the wave rule's, rows per program
    "Q8_0P": ["2/1/4/e/1", "2/1/4/e/2", "2/1/4/e/4", "1/1/8/e/1", "1/1/4/e/2", "4/1/2/e/1", "2/1/8/e/1"],
    "Q4T": ["vector:4/1/4/e/1", "vector:4/1/4/e/2", "vector:4/1/4/e/4", "vector:4/1/4/e/8", "vector:4/1/8/e/1",
            "vector:4/1/2/e/2"],  # (2-row tiles: wrong sums on the H200 until session 8's row sums)
}
# --q4t-sweep (session 6, q4k11): tiled Q4_K at 8 rows per program (two 4-row tiles), 1 or 2 warps, 2/4/8
# groups per step, split by the wave rule (0) or by hand; 4-row neighbours of the default (its 64-bit x sums rows,
# "vector64", went with that step in session 8)
Q4T_SWEEP = [f"vector:8/{w}/{u}/e/{s}" for w, us in ((1, (2, 4, 8)), (2, (2, 4))) for u in us for s in (0, 1, 2, 4)] + [
    "vector:4/1/2/e", "vector:4/1/8/e", "vector:4/2/4/e"]
Q4T_SWEEP_ON = False
# --q4t-s7 (session 7, q4k12): the load-only twin (q4t_twins: which bound), session 6's step ("vector"),
# the bytes step (the default since) at 8 rows (its rows there: bench/results/q4k12_h200_s7.log, with an
# integer sum per thread first, "bytes_sum", no faster and since removed)
Q4T_S7 = ["loadonly:4/1/4/e", "loadonly:8/1/4/e", "vector:4/1/4/e", "bytes:8/1/4/e"]
Q4T_S7_ON = False
# --q4t-rows (session 7, q4k15): Q4T rows given on the command line, e.g. the pipeliner's stages
# (loadonly:4/1/4/e/0/3: split by the wave rule, 3 stages)
Q4T_ROWS: list[str] = []
# --rows (session 9, fold20): rows for any type, TYPE@tile (Q4T: TYPE@loads:tile), replacing its candidates
TYPE_ROWS: dict[str, list[str]] = {}
# --consumer (session 9, fold20): TYPE@tile (or TYPE@default) rows timed with the launch that reads y next,
# the residual add + RMSNorm (+ x's int8 blocks in the type's format) of a [1, rows] stream, as the engine's
# attention output projection is read: "<tile> +norm" (the GEMV folds its split in the launch, then the norm)
# and "<tile> parts +norm" (the GEMV leaves its partials, the norm adds them in order: fused "norm_fold"),
# plus "norm alone" once a shape (the default's y)
CONSUMER: dict[str, list[str]] = {}


def consumer_rows(name: str) -> list[tuple[str, GemvConfig | None, dict]]:
    """(label, tile, how) of a type's --consumer rows (how: consumer, parts)."""
    if name not in CONSUMER:
        return []
    out = [("norm alone", None, dict(consumer="alone"))]
    for t in CONSUMER[name]:
        cfg = None if t == "default" else tile(t.rpartition(":")[2])
        out += [(f"{t} +norm", cfg, dict(consumer="fold")), (f"{t} parts +norm", cfg, dict(consumer="parts"))]
    return out


def split_types(text: str) -> dict[str, list[str]]:
    """"Q8_0P@2/1/4/e/2,Q4T@pairx:4/1/2/e" -> {type: [tile, ...]}."""
    out: dict[str, list[str]] = {}
    for item in (r for r in text.split(",") if r):
        name, _, label = item.partition("@")
        out.setdefault(name, []).append(label)
    return out


# --moe-q6k: the Q6_K down's tiles (None: DOWN_CONFIG, what runs without a DECODE_TILES entry)
Q6K_DOWN = [None, "4/1/3/e/8", "2/1/4/e/8", "4/1/2/e/8", "8/2/2/e/8"]
FLOAT_DOWN = True  # --no-float-down: leave out the float down's row
MOE_PAIRS = {  # (gate/up, down) tiles of moe_decode
    T.Q8_0: [("4/1/2/e", "4/1/2/e"), ("2/1/4/e", "2/1/4/e")],
    T.Q4_K: [("4/1/4/e", "4/1/3/e/8"), ("4/1/8/e", "4/1/3/e/8"), ("8/2/4/e", "8/2/3/e/8"),
             ("8/1/4/e", "8/1/3/e/8"), ("4/1/4/e", "16/4/1/g/8"), ("16/4/1/g", "4/1/3/e/8")],
}


def quant_row(fmt: str, cols: int) -> dict:
    """act_quant alone (the first of a GEMV call's two launches): the floor under the GEMV rows."""
    x = torch.randn(1, cols, device="cuda")
    sec = kb.graph_seconds(lambda i: act_quant.quantize(x, fmt), 2)
    return dict(kernel=f"act_quant 1x{cols}", type=fmt, config="", us=sec * 1e6, bw=0.0, frac=0.0, err=0.0)


def tiles_name(name: str) -> str:
    """GEMV_TILES' key for a bench type name."""
    return {"Q8_0P": "Q8_0_PACKED", "Q4T": "Q4_K_TILED", "Q6T": "Q6_K_TILED"}.get(name, name)


def same_copy_seconds(nbytes: int) -> float:
    """Seconds of a device-to-device copy whose bytes read + written are nbytes, rotated past the
    L2 over as many bytes as the weights rotate over, one graph of n copies (graph_seconds)."""
    half = nbytes // 2
    n = max(2, -(-kb.ROTATE_BYTES // nbytes))
    src = torch.randint(0, 256, (n * half,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return kb.graph_seconds(lambda i: dst[i * half:(i + 1) * half].copy_(src[i * half:(i + 1) * half]), n)


def print_rows(rows: list[dict]) -> None:
    """kernels_bench's columns and frac_same."""
    for r in rows:
        print(f"{r['kernel']:34} {r['type']:5} {r['config']:32} {r['us']:9.1f} {r['bw'] / 1e9:7.0f} "
              f"{r['frac']:5.2f} {r.get('frac_same', 0.0):5.2f} {r['err']:8.1e}", flush=True)


def weights(name: str, rows: int, cols: int, rotate: bool = True):
    """Random matrices of a bench type (Q8_0P / Q4T / Q6T packed from GGUF blocks), as many as rotate past
    the L2 (else one): (qtype, bytes per matrix, their count, the first one's GGUF blocks,
    run(cfg, i, x, loads=None, qx=None[, round_x=False]) -> y)."""
    qtype = {"Q8_0P": T.Q8_0, "Q4T": T.Q4_K, "Q6T": T.Q6_K}.get(name) or T[name]
    nbytes = rows * dispatch.FAMILIES[qtype].row_bytes(cols)
    n = max(2, -(-kb.ROTATE_BYTES // nbytes)) if rotate else 1
    buf = kb.random_blocks(qtype, n * nbytes, DEV)
    ws = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
    y = torch.empty(rows, device=DEV)
    if name == "Q8_0P":
        ps = [q8_0_packed.pack(w, (rows, cols)) for w in ws]

        def run(cfg, i, x, loads=None, qx=None, parts=False):
            if parts:  # the split-K partials unsummed (matmul.gemv parts: the next launch adds them)
                return matmul.gemv(ps[i % n].data, q8_0_packed.PACKED, (rows, cols), x, out=y, config=cfg, qx=qx,
                                   parts=True)
            return q8_0_packed.gemv(ps[i % n], x, out=y, config=cfg, qx=qx)
    elif name in ("Q4T", "Q6T"):  # the old default row on the GGUF blocks, the others on the tiled copies
        tiled = q4_k_tiled if name == "Q4T" else q6_k_tiled
        ts = [tiled.pack(w, (rows, cols)) for w in ws]
        packs = {}  # Q4T: the copies of another layout (q4_k_tiled.pack's loads), made on first use

        def copies(loads):
            key = tiled.layout_of(loads) if name == "Q4T" else ts[0].layout
            if key == ts[0].layout:
                return ts
            if key not in packs:
                packs[key] = [tiled.pack(w, (rows, cols), loads=loads) for w in ws]
            return packs[key]

        def run(cfg, i, x, loads=None, qx=None, parts=False):
            if parts:  # the default step's partials unsummed (Q4T)
                return matmul.gemv(ts[i % n].data, q4_k_tiled.TILED, (rows, cols), x, out=y, config=cfg, qx=qx,
                                   parts=True)
            if cfg is GGUF_BASES[name]:
                return gemv(ws[i % n], qtype, (rows, cols), x, out=y, config=cfg, qx=qx)
            if loads in q4t_twins.TWINS:  # a bench-only twin on the default tiled bytes (times only; kmasked: y)
                return q4t_twins.gemv(loads, ts[i % n], x, out=y, config=cfg, qx=qx)
            more = {"loads": loads} if loads else {}  # (the tiled Q4_K's integer steps by name)
            return tiled.gemv(copies(loads)[i % n], x, out=y, config=cfg, qx=qx, **more)
    else:
        def run(cfg, i, x, loads=None, qx=None, round_x=False):  # round_x: x rounded to Q8_K first (a K-quant's float path)
            rx = (lambda v: round_activations(v, act_quant.Q8_K)) if round_x else None
            return gemv(ws[i % n], qtype, (rows, cols), x, out=y, config=cfg, round_x=rx, qx=qx)
    return qtype, nbytes, n, ws[0], run


# the tiled types' "old default": the GGUF blocks at q4_k's / q6_k's tile
GGUF_BASES = {"Q4T": GEMV_TILES["Q4_K"], "Q6T": GEMV_TILES["Q6_K"]}


def row_tiles(name: str, rows: int, cols: int) -> list[tuple[str, GemvConfig | None, dict]]:
    """(label, tile, how) of a shape's rows; how: loads (Q4T's integer step), quant (x quantized in
    the timed call even under --qx)."""
    key = tiles_name(name)
    if PDL_ROWS:
        return pdl_rows(name)
    if VS_S5 and key in GEMV_TILES:  # the tile at session 5's split rule, as an explicit split
        s5 = GEMV_TILES[key]
        s5 = dataclasses.replace(s5, split=split_for(s5, rows, -(-cols // 256), "cuda", rule="old"))
        firsts = [("s5 default", s5, {}), ("default", None, {})]
        if QX:
            firsts = [("s5 default +quant", s5, dict(quant=True))] + firsts + [("default +quant", None, dict(quant=True))]
    else:
        # None: a new integer step (Q6_K), no old tile; a tiled type's old default is the GGUF blocks' tile
        base = GGUF_BASES.get(name) or OLD_GEMV_TILES.get(key)
        firsts = [("default", None, {})] if base is None else [("old default", base, {})]
        firsts += [("default", None, {})] if name in GGUF_BASES or (base is not None and GEMV_TILES[key] != base) else []
    cands = (S6_CANDIDATES if VS_S5 else CANDIDATES).get(name, []) if CANDIDATES_ON else []
    cands = Q4T_SWEEP if Q4T_SWEEP_ON and name == "Q4T" else cands
    cands = Q4T_S7 if Q4T_S7_ON and name == "Q4T" else cands
    cands = Q4T_ROWS if Q4T_ROWS and name == "Q4T" else cands
    cands = TYPE_ROWS.get(name, cands)
    tried = [(t, tile(t.rpartition(":")[2]), dict(loads=t.rpartition(":")[0]) if ":" in t else {}) for t in cands]
    return firsts + tried + consumer_rows(name)


def pdl_rows(name: str) -> list[tuple[str, GemvConfig | None, dict]]:
    """--pdl's rows: the default tile, PDL off then on; with --prefetch PDL on in each prefetch mode (PDL off
    first: a launch without PDL prefetches nothing), then --rows' tiles of the type with PDL on in each prefetch
    mode (e.g. the split by hand); with --producer the default's rows after the norm, and the norm alone."""
    if not PREFETCH_ROWS:
        return [(f"default pdl {mode}", None, dict(pdl=mode)) for mode in ("off", "on")]
    out = [("default pdl off", None, dict(pdl="off", prefetch="off"))]
    out += [(f"default pdl on prefetch {f}", None, dict(pdl="on", prefetch=f)) for f in PREFETCH_ROWS]
    tiles = [(f"{t} pdl on prefetch {f}", tile(t.rpartition(":")[2]),
              dict(pdl="on", prefetch=f, loads=t.rpartition(":")[0] or None))
             for t in TYPE_ROWS.get(name, []) for f in PREFETCH_ROWS]
    if PRODUCER:
        out += [("norm alone", None, dict(pdl="on", producer="alone"))]
        out += [(f"norm+ {label}", cfg, dict(how, producer="gemv")) for label, cfg, how in out[:-1]
                if how["pdl"] == "on" or how["prefetch"] == "off"]
    return out + tiles


@contextlib.contextmanager
def launch_modes(how: dict):
    """A row's launches in its PDL mode and weight prefetch (how's pdl, prefetch; else the current ones)."""
    with pdl.using(how.get("pdl", pdl.current())), pdl.prefetching(how.get("prefetch", pdl.current_prefetch())):
        yield


def call_args(how: dict, x: torch.Tensor, qx) -> dict:
    """run's keyword arguments for a row: its loads, and x pre-quantized (--qx) unless the row says quant."""
    out = dict(x=x, loads=how.get("loads") or None)
    if qx is not None and not how.get("quant"):
        out["qx"] = qx
    return out


def row_call(run, cfg, how: dict, kw: dict, fmt: str | None, rows: int):
    """call(i) -> the row's output: the GEMV, or (a --consumer row) (GEMV y or partials, then the add + norm)
    -> (y or partials, the norm's sum, normed, QuantX)."""
    if how.get("producer"):  # x from the add + norm + quant launch just before, as the engine hands it
        g = torch.Generator().manual_seed(rows)
        cols = kw["x"].numel()
        stream, h, weight = (torch.randn(cols, generator=g).to(DEV) for _ in range(3))
        make_x = lambda: norm_launch(stream[None], h[None], weight, fmt, False)[2]  # noqa: E731
        if how["producer"] == "alone":
            return lambda i: make_x()
        return lambda i: run(cfg, i, **dict(kw, qx=make_x()))
    if not how.get("consumer"):
        return lambda i: run(cfg, i, **kw)
    g = torch.Generator().manual_seed(rows)
    stream, weight = torch.randn(1, rows, generator=g).to(DEV), torch.randn(rows, generator=g).to(DEV)
    parts = how["consumer"] == "parts"
    if how["consumer"] == "alone":
        h = run(cfg, 0, **kw)[None].clone()
        return lambda i: (h, *norm_launch(stream, h, weight, fmt, False))
    return lambda i: (lambda h: (h, *norm_launch(stream, h if parts else h[None], weight, fmt, parts)))(
        run(cfg, i, parts=parts, **kw))


def norm_launch(stream, h, weight, fmt, parts):
    if fmt is None:
        return rms_norm.add_rms_norm(stream, h, weight, 1e-6, parts=parts)
    return rms_norm.add_rms_norm_quant(stream, h, weight, 1e-6, fmt, parts=parts)


def dense(name: str, rows: int, cols: int, copy_bw: float) -> list[dict]:
    qtype, nbytes, n, w0, run = weights(name, rows, cols)
    x = torch.randn(cols, device=DEV)
    ref = quants.dequantize(w0, qtype, (rows, cols)).double() @ kb.x_in(qtype, x).double()
    fam = dispatch.FAMILIES[qtype]
    qx = act_quant.quantize(x[None], fam.act_fmt) if QX and fam.act_fmt else None
    out = [] if name != "Q6_K" else q6_k_float_rows(qtype, run, ref, x, nbytes, n, rows, cols, copy_bw)
    same_sec = same_copy_seconds(nbytes)
    base, old_y, same, folded, pdl_firsts = GGUF_BASES.get(name), None, {}, {}, {}
    def_y, same_def = None, {}  # (session 12) every plain row against the default row's bits
    for label, cfg, how in row_tiles(name, rows, cols):
        kw = call_args(how, x, qx)
        try:
            with launch_modes(how):
                call = row_call(run, cfg, how, kw, fam.act_fmt, rows)
                got = call(0)
                if how.get("consumer"):  # the partials' ordered sum, and the norm's outputs: the in-launch fold's bits?
                    outs = [t.clone() for t in (got[1], got[2], *(() if got[3] is None else (got[3].words,)))]
                    got = matmul.sum_parts(got[0]) if how["consumer"] == "parts" else got[0].reshape(-1)
                    key = label.replace(" parts", "")
                    if how["consumer"] == "fold":
                        folded[key] = outs
                    elif key in folded:
                        same[label] = all(torch.equal(a, b) for a, b in zip(outs, folded[key]))
                err = float("nan") if how.get("producer") else kb.rel_err(got, ref)
                if PDL_ROWS and how.get("producer") != "alone":  # --pdl: the first row's bits (of its tile, +norm)?
                    key = (bool(how.get("producer")), cfg)
                    if key in pdl_firsts:
                        same[label] = bool(torch.equal(got, pdl_firsts[key]))
                    pdl_firsts.setdefault(key, got.clone())
                # a tiled row: the GGUF default's bits?
                elif base is not None and not how.get("consumer") and not PDL_ROWS:
                    first = cfg is base  # (Q8_0P: base and cfg both None)
                    old_y = got.clone() if first else old_y
                    same.update({} if first or old_y is None else {label: bool(torch.equal(got, old_y))})
                if def_y is not None and not (how.get("consumer") or how.get("producer") or how.get("quant")):
                    same_def[label] = bool(torch.equal(got, def_y))
                def_y = got.clone() if label == "default" else def_y
                sec = kb.graph_seconds(call, n)
        except Exception as e:  # noqa: BLE001 - a candidate that fails leaves the shape's other rows
            print(f"FAILED gemv {rows}x{cols} {name} {label}: {type(e).__name__}: {e}", flush=True)
            continue
        out.append(dict(kernel=f"gemv {rows}x{cols}", type=name, config=label, us=sec * 1e6, bw=nbytes / sec,
                        frac=nbytes / sec / copy_bw, frac_same=same_sec / sec, err=err))
    print(f"gemv {rows}x{cols} same-bytes copy {same_sec * 1e6:.1f} us ({nbytes / same_sec / 1e9:.0f} GB/s, "
          f"{nbytes / same_sec / copy_bw:.2f} of the 2 GiB copy)", flush=True)
    print_rows(out)
    if same:
        said = ", ".join(f"{k}: {('no', 'yes')[v]}" for k, v in same.items())
        what = "first row" if PDL_ROWS else "old default"
        print(f"gemv {rows}x{cols} {name} the {what}'s bits (+norm rows: the in-launch fold's): {said}", flush=True)
    if same_def:
        said = ", ".join(f"{k}: {('no', 'yes')[v]}" for k, v in same_def.items())
        print(f"gemv {rows}x{cols} {name} the default's bits: {said}", flush=True)
    torch.cuda.empty_cache()
    return out


def warm(job: tuple) -> str:
    """Compile one row's kernel (a worker process: Triton's disk cache for the timed run)."""
    name, rows, cols, label, flags = job
    global VS_S5, QX, CANDIDATES_ON, Q4T_SWEEP_ON, Q4T_S7_ON, Q4T_ROWS, TYPE_ROWS, CONSUMER, PDL_ROWS, PREFETCH_ROWS
    global PRODUCER
    (VS_S5, QX, CANDIDATES_ON, Q4T_SWEEP_ON, Q4T_S7_ON, Q4T_ROWS, TYPE_ROWS, CONSUMER, PDL_ROWS, PREFETCH_ROWS,
     PRODUCER) = flags
    try:
        qtype, _, _, _, run = weights(name, rows, cols, rotate=False)
        x = torch.randn(cols, device=DEV)
        fam = dispatch.FAMILIES[qtype]
        qx = act_quant.quantize(x[None], fam.act_fmt) if QX and fam.act_fmt else None
        for lab, cfg, how in row_tiles(name, rows, cols):
            if lab == label:
                with launch_modes(how):
                    row_call(run, cfg, how, call_args(how, x, qx), fam.act_fmt, rows)(0)
        if DEV == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the timed run reports it again
        return f"{name} {rows}x{cols} {label}: {type(e).__name__}"
    return ""


def precompile(names: list[str], shapes: list[tuple[int, int]], workers: int) -> None:
    """Every row's kernel compiled by `workers` processes first (each tile once per shape)."""
    flags = (VS_S5, QX, CANDIDATES_ON, Q4T_SWEEP_ON, Q4T_S7_ON, Q4T_ROWS, TYPE_ROWS, CONSUMER, PDL_ROWS, PREFETCH_ROWS,
             PRODUCER)
    jobs = [(name, r, c, label, flags) for name in names for r, c in shapes
            for label, _, _ in row_tiles(name, r, c)]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        failed = [f for f in ex.map(warm, jobs) if f]
    print(f"compiled {len(jobs)} rows' kernels in {workers} processes; failed: {failed}", flush=True)


def q6_k_float_rows(qtype, run, ref, x, nbytes, n, rows, cols, copy_bw) -> list[dict]:
    """Q6_K's float path (the family without its integer step, x rounded by the caller as the
    engine rounds it), at its session-4 tile and at the new default tile."""
    out = []
    with kb.float_path(qtype):
        for label, cfg in (("float old default", GemvConfig()), ("float default", None)):
            err = kb.rel_err(run(cfg, 0, x, round_x=True), ref)
            sec = kb.graph_seconds(lambda i: run(cfg, i, x, round_x=True), n)
            out.append(dict(kernel=f"gemv {rows}x{cols}", type="Q6_K", config=label, us=sec * 1e6, bw=nbytes / sec,
                            frac=nbytes / sec / copy_bw, err=err))
    return out


def moe(qtype: T, copy_bw: float) -> list[dict]:
    saved = kb.MOE_SWEEP
    kb.MOE_SWEEP = [(None, None)] + [(tile(a), tile(b)) for a, b in MOE_PAIRS[qtype]]
    kb.SWEEP_ON = True
    try:  # (the float path's row comes along: the session-2 kernels)
        rows = kb.moe_rows(qtype, copy_bw)
    finally:
        kb.MOE_SWEEP = saved
    kb.print_rows(rows)
    return rows


def mixed_bytes(shape=kb.MOE) -> tuple[int, int]:
    """(gate or up, down) bytes of one expert with Q4_K gate/up and a Q6_K down."""
    D, F, _ = shape
    return F * dispatch.FAMILIES[T.Q4_K].row_bytes(D), D * dispatch.FAMILIES[T.Q6_K].row_bytes(F)


def mixed_table(n_experts: int, shape=kb.MOE) -> ExpertTable:
    """n such experts in consecutive 4 KiB-aligned slots of two arenas (gate | up, down)."""
    D, F, _ = shape
    gu, dn = mixed_bytes(shape)
    gu_slot, dn_slot = -(-2 * gu // 4096) * 4096, -(-dn // 4096) * 4096
    a, b = kb.random_blocks(T.Q4_K, n_experts * gu_slot), kb.random_blocks(T.Q6_K, n_experts * dn_slot)
    offs = ([e * gu_slot for e in range(n_experts)], [e * gu_slot + gu for e in range(n_experts)],
            [e * dn_slot for e in range(n_experts)])
    return ExpertTable(a, a, b, *offs, T.Q4_K, T.Q6_K, D, F)


def moe_q6k(copy_bw: float) -> list[dict]:
    """MoE decode, Q4_K gate/up + Q6_K down: the down's float path, then its integer tiles."""
    D, F, A = kb.MOE
    gu, dn = mixed_bytes()
    expert_bytes = 2 * gu + dn
    n_sets = max(2, -(-kb.ROTATE_BYTES // (A * expert_bytes)))
    full = mixed_table(n_sets * A)
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    y, nbytes, out = torch.empty(D, device="cuda"), A * expert_bytes, []

    def time(dn: GemvConfig | None, label: str) -> dict:
        ps = [prepare(kb.subset(full, list(range(s * A, (s + 1) * A))), "cuda") for s in range(n_sets)]
        y.fill_(float("nan"))
        err = kb.rel_err(moe_decode(ps[0], x, w, out=y, down=dn), kb.moe_torch(ps[0].table, x, w, torch.float64))
        sec = kb.graph_seconds(lambda i: moe_decode(ps[i % n_sets], x, w, out=y, down=dn), n_sets)
        return dict(kernel=f"moe {D}x{F} top{A} Q4_K/Q6_K", type="Q6_K", config=label, us=sec * 1e6,
                    bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=err)
    if FLOAT_DOWN:
        with kb.float_path(T.Q6_K):  # h unrounded here and in the reference (moe_decode without round_h)
            out.append(time(None, "float down default"))
    for t in Q6K_DOWN:
        out.append(time(None if t is None else tile(t), f"int down {t or 'default'}"))
    kb.print_rows(out)
    return out


def guarded(fn, *args) -> list[dict]:
    """One shape's rows; a failure is printed and the run goes on to the next shape."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - one device call measures everything it can
        print(f"FAILED {fn.__name__}{args[:-1]}: {type(e).__name__}: {e}", flush=True)
        return []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q8_0P,Q8_0,Q4_K,Q4T")
    ap.add_argument("--json", default=None)
    ap.add_argument("--moe", action="store_true", help="also the MoE 2048x768 top-8 decode tiles")
    ap.add_argument("--defaults-only", action="store_true", help="only the old and the new default tiles")
    ap.add_argument("--moe-types", default="Q8_0,Q4_K", help="the types --moe times")
    ap.add_argument("--shapes", default=None, help="rowsxcols,... instead of SHAPES")
    ap.add_argument("--no-act-quant", action="store_true", help="leave out act_quant's rows")
    ap.add_argument("--moe-q6k", action="store_true", help="the MoE with Q4_K gate/up and a Q6_K down")
    ap.add_argument("--no-float-down", action="store_true", help="--moe-q6k without the float down's row")
    ap.add_argument("--vs-s5", action="store_true", help="session 5's tile and split rule first, S6_CANDIDATES")
    ap.add_argument("--qx", action="store_true", help="x quantized before the timed calls (the engine's path)")
    ap.add_argument("--q4t-sweep", action="store_true", help="Q4T's rows: Q4T_SWEEP instead of CANDIDATES")
    ap.add_argument("--q4t-s7", action="store_true", help="Q4T's rows: Q4T_S7 (load-only twin, bytes layout)")
    ap.add_argument("--q4t-rows", default="", help="Q4T's rows: these loads:tile labels, comma-separated")
    ap.add_argument("--compile-workers", type=int, default=0, help="processes compiling every row first (0: none)")
    ap.add_argument("--rows", default="", help="TYPE@tile,... rows replacing those types' candidates")
    ap.add_argument("--consumer", default="", help="TYPE@tile|default,...: GEMV + the add/norm launch after it")
    ap.add_argument("--compile-only", action="store_true",
                    help="stop after --compile-workers' compile (a later run times)")
    ap.add_argument("--pdl", action="store_true", help="only the default tile, PDL off and on (kernels/pdl.py)")
    ap.add_argument("--prefetch", default="", help="--pdl in these weight prefetch modes (pdl.PREFETCHES), e.g. off,bulk")
    ap.add_argument("--producer", action="store_true", help="--pdl's rows also after the norm + quant launch")
    args = ap.parse_args()
    global CANDIDATES_ON, VS_S5, QX, FLOAT_DOWN, Q4T_SWEEP_ON, Q4T_S7_ON, Q4T_ROWS, TYPE_ROWS, CONSUMER, PDL_ROWS
    global PREFETCH_ROWS, PRODUCER
    TYPE_ROWS, CONSUMER = split_types(args.rows), split_types(args.consumer)
    PREFETCH_ROWS = [m for m in args.prefetch.split(",") if m]
    PDL_ROWS, PRODUCER = args.pdl or bool(PREFETCH_ROWS), args.producer
    if [m for m in PREFETCH_ROWS if m not in pdl.PREFETCHES] or (PRODUCER and not PREFETCH_ROWS):
        ap.error(f"--prefetch takes modes of {pdl.PREFETCHES}; --producer needs --prefetch")
    CANDIDATES_ON, VS_S5, QX, FLOAT_DOWN = not args.defaults_only, args.vs_s5, args.qx, not args.no_float_down
    Q4T_SWEEP_ON, Q4T_S7_ON = args.q4t_sweep, args.q4t_s7
    Q4T_ROWS = [r for r in args.q4t_rows.split(",") if r]
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    if args.compile_workers:
        precompile(args.types.split(","), shapes, args.compile_workers)
    if args.compile_only:
        return
    copy_bw = kb.copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  d2d copy {copy_bw / 1e9:.0f} GB/s (read+write)  "
          f"defaults {GEMV_TILES}", flush=True)
    print("kernel / type / tile / us / GB/s / frac (2 GiB copy) / frac_same (same-bytes copy) / err", flush=True)
    rows = guarded(moe_q6k, copy_bw) if args.moe_q6k else []  # first: the smallest call that times it
    for shape in shapes:  # every type at a shape before the next shape: a timeout keeps the first shapes whole
        for name in args.types.split(","):
            rows += guarded(dense, name, *shape, copy_bw)
            save(args.json, copy_bw, rows)  # what is measured survives a timeout
    quants_rows = [] if args.no_act_quant else [quant_row(fmt, cols) for fmt in (act_quant.Q8_0, act_quant.Q8_K)
                                                  for cols in (2048, 4096)]
    kb.print_rows(quants_rows)
    rows += quants_rows
    if args.moe:
        for qtype in (T[name] for name in args.moe_types.split(",")):
            rows += guarded(moe, qtype, copy_bw)
    save(args.json, copy_bw, rows)


def save(path: str | None, copy_bw: float, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bytes_per_second=copy_bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
