"""Session 8 (q4k16): the tiled Q4_K GEMV's load-only twins with the weight tiles by TMA (bench/q4t_tma.py)
next to the bytes step, its pointer load-only twin (bench/q4t_twins.py) and a same-bytes copy, x quantized
before the timed calls; and every kernel's registers, spills, shared memory and resident programs per SM
(the driver's occupancy for a one-warp program), the pipelined (cp.async) rows of q4k15 included.

Usage: PYTHONPATH=.:bench python bench/q4t_tma_bench.py [--shapes RxC,...] [--rows A,B] [--q4k17] [--q4k18] [--q4k19]
[--compile-workers N]
[--json F]
Rows: "bytes" (the engine's step, default tile: since q4k17 2 groups a step at split 1, GemvConfig.whole_unroll;
"/uU" U groups a step at every split), "loadonly" (its twin), "loadonly/s3" and "bytes/s3" (the group
loop pipelined by Triton, 3 stages: q4k15's rows), "ptr/sS", "tma/sS", "tmax/sS" (q4t_tma's kernel, S: its
loop's num_stages, 0 Triton's default); "relaid-loadonly", "relaid" (q4k18: bench/q4t_relaid.py's twin and
step); "pair-loadonly", "pair", "pairx" (q4k19: bench/q4t_pair.py's twin and steps). Timed as gemv_tiles_bench times (one CUDA graph over weights rotated past the L2, median of 15); frac: over the 2 GiB copy's bandwidth; frac_same: over the same-bytes copy's.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import dataclasses
import json
import multiprocessing as mp

import gemv_tiles_bench as gtb
import kernels_bench as kb
import q4t_compact
import q4t_pair
import q4t_relaid
import q4t_tma
import q4t_twins
import torch
from gguf import GGMLQuantizationType as T

from sparkd.engine.kernels import act_quant, grids, matmul, q4_k_tiled

SHAPES = [(14336, 4096), (4096, 14336), (6144, 4096), (151936, 2048)]
ROWS = ["bytes", "loadonly", "loadonly/s3", "bytes/s3", "ptr/s0", "tma/s0", "tma/s2", "tma/s3", "tma/s4",
        "tmax/s3", "ptr/s3"]
# session 8 (q4k17): the bytes step 2 groups a step, the compact-load steps (bench/q4t_compact.py: idot_compact
# per group, "step" per step; /r64: at most 64 registers)
Q4K17_SHAPES = "14336x4096,4096x14336,6144x4096,151936x2048,4096x2048"
Q4K17_ROWS = ["bytes", "bytes/u2", "compact", "step", "step/u2", "step/r64", "loadonly", "ptr/s0"]
# session 8 (q4k18): the re-laid tile (bench/q4t_relaid.py), its twin and its step, /uU groups a step
Q4K18_ROWS = ["bytes", "loadonly", "ptr/s0", "relaid-loadonly", "relaid-loadonly/u4", "relaid", "relaid/u4",
              "relaid/u2"]
# session 8 (q4k19): 2 rows a thread (bench/q4t_pair.py), its twin, its step and pairx (one row's float work a
# thread after a shuffle)
Q4K19_ROWS = ["bytes", "loadonly", "ptr/s0", "pair-loadonly", "pair", "pair/u4", "pair/u2", "pairx", "pairx/u4",
              "pairx/u2"]
RELAID: dict[int, torch.Tensor] = {}  # the relaid bytes of each tiled tensor, by its data_ptr
PAIR: dict[int, torch.Tensor] = {}  # the pair bytes, the same way


def _launch(label: str, t, qx, y, cfg):
    """Run a row once on tiled tensor t; returns Triton's compiled kernel (for its resources). A label is a step
    name and options: /sS the loop's num_stages, /uU groups a step (GemvConfig.unroll), /rR maxnreg."""
    name, *opts = label.split("/")
    opt = {o[0]: int(o[1:]) for o in opts}
    stages = opt.get("s", 0)
    if name in q4t_tma.LOADS:
        return q4t_tma.gemv(name, t.data, t.rows, t.cols, qx, y, stages)
    if name in q4t_pair.MODES:
        return q4t_pair.gemv(name, PAIR[t.data.data_ptr()], t.rows, t.cols, qx, y, opt.get("u"))
    if name in q4t_relaid.MODES:
        return q4t_relaid.gemv(name, RELAID[t.data.data_ptr()], t.rows, t.cols, qx, y, opt.get("u"))
    c = dataclasses.replace(cfg, stages=stages)
    if "u" in opt:  # U groups a step at every split
        c = dataclasses.replace(c, unroll=opt["u"], whole_unroll=0)
    split = matmul.split_for(c, t.rows, t.cols // 256, y.device)
    in_kernel = matmul.kernel_folds(c, split)
    part = matmul.partials_for(y, split, c)
    tiles = t.rows // c.block_n
    args = dict(matmul._launch_args(c, split), **({"maxnreg": opt["r"]} if "r" in opt else {}))
    if name == "step":  # q4k17: whole-step compact loads, its own kernel
        del args["EW"]
        k = q4t_compact._kernel[(tiles, split)](
            t.data, qx.words, qx.scales, qx.sums, y, part, matmul._tickets_arg(in_kernel, tiles, part), t.rows,
            t.cols, t.cols // 256 * 144, EMU=False, **args)
    else:
        step = {"loadonly": q4t_twins.TWINS["loadonly"].idot, "compact": q4t_compact.idot_compact}.get(
            name, q4_k_tiled.FAMILIES.get(name, q4_k_tiled.FAMILY).idot)
        k = matmul._igemv_kernel[(tiles, split)](
            t.data, grids.grid_words(None, y.device), qx.words, qx.scales, qx.sums, y, part,
            matmul._tickets_arg(in_kernel, tiles, part), t.rows, t.cols, t.cols // 256 * 144, IDOT=step, A1=4, A2=8,
            A3=4, EMU=False, **args)  # A3: the family's isplit
    if not in_kernel:
        matmul.fold_partials(part, y)
    return k


def occupancy(k) -> dict:
    """Registers, spills, shared memory of a compiled one-warp kernel and the driver's resident programs per SM."""
    cuda = ctypes.CDLL("libcuda.so.1")
    k._init_handles()
    blocks = ctypes.c_int(0)
    rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(k.function),
                                                          ctypes.c_int(32), ctypes.c_size_t(k.metadata.shared))
    attr = {}
    for name, code in (("static_shared", 1), ("max_dyn_shared", 8), ("carveout", 9)):
        v = ctypes.c_int(0)
        cuda.cuFuncGetAttribute(ctypes.byref(v), ctypes.c_int(code), ctypes.c_void_p(k.function))
        attr[name] = v.value
    return dict(n_regs=k.n_regs, n_spills=k.n_spills, shared=k.metadata.shared, programs_per_sm=blocks.value,
                occ_rc=rc, **attr)


def tensors(rows: int, cols: int, rotate: bool = True):
    nbytes = rows * cols // 256 * 144
    n = max(2, -(-kb.ROTATE_BYTES // nbytes)) if rotate else 1
    buf = kb.random_blocks(T.Q4_K, n * nbytes)
    ts = [q4_k_tiled.pack(buf[i * nbytes:(i + 1) * nbytes], (rows, cols), loads="bytes") for i in range(n)]
    if any(r.split("/")[0] in q4t_relaid.MODES for r in ROWS):
        RELAID.clear()
        for i, t in enumerate(ts):
            RELAID[t.data.data_ptr()] = q4t_relaid.pack_raw(buf[i * nbytes:(i + 1) * nbytes], (rows, cols))
    if any(r.split("/")[0] in q4t_pair.MODES for r in ROWS):
        PAIR.clear()
        for i, t in enumerate(ts):
            PAIR[t.data.data_ptr()] = q4t_pair.pack_raw(buf[i * nbytes:(i + 1) * nbytes], (rows, cols))
    x = torch.randn(cols, device="cuda")
    return nbytes, ts, act_quant.quantize(x[None], act_quant.Q8_K)


def warm(job) -> str:
    global ROWS
    rows, cols, label = job
    ROWS = [label]  # (a spawned process: tensors() packs the relaid bytes where the label needs them)
    try:
        _, ts, qx = tensors(rows, cols, rotate=False)
        _launch(label, ts[0], qx, torch.empty(rows, device="cuda"), matmul.GEMV_TILES["Q4_K_TILED"])
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the timed run reports it again
        return f"{rows}x{cols} {label}: {type(e).__name__}: {e}"
    return ""


def shape_rows(rows: int, cols: int, copy_bw: float) -> list[dict]:
    nbytes, ts, qx = tensors(rows, cols)
    cfg = matmul.GEMV_TILES["Q4_K_TILED"]
    y = torch.empty(rows, device="cuda")
    same_sec = gtb.same_copy_seconds(nbytes)
    print(f"gemv {rows}x{cols} same-bytes copy {same_sec * 1e6:.1f} us ({nbytes / same_sec / copy_bw:.2f} of the "
          f"2 GiB copy); split {matmul.split_for(cfg, rows, cols // 256, 'cuda')}, tma unroll "
          f"{q4t_tma.unroll_for(cols // 256, matmul.split_for(cfg, rows, cols // 256, 'cuda'))}", flush=True)
    out, ys = [], {}
    for label in ROWS:
        try:
            k = _launch(label, ts[0], qx, y, cfg)
            torch.cuda.synchronize()
            ys[label] = y.clone()
            sec = kb.graph_seconds(lambda i, lab=label: _launch(lab, ts[i % len(ts)], qx, y, cfg), len(ts))
            res = occupancy(k)
        except Exception as e:  # noqa: BLE001 - a row that fails leaves the others
            print(f"FAILED {rows}x{cols} {label}: {type(e).__name__}: {e}", flush=True)
            continue
        r = dict(shape=f"{rows}x{cols}", row=label, us=sec * 1e6, frac=nbytes / sec / copy_bw,
                 frac_same=same_sec / sec, **res)
        out.append(r)
        print(f"{r['shape']:12} {label:12} {r['us']:8.1f} us  frac {r['frac']:.2f}  same {r['frac_same']:.2f}  "
              f"regs {r['n_regs']} spills {r['n_spills']} shared {r['shared']} programs/SM {r['programs_per_sm']} "
              f"(static {r['static_shared']} dyn max {r['max_dyn_shared']} carveout {r['carveout']})", flush=True)
    ref = ys.get("ptr/s0")
    same = {k: bool(torch.equal(v, ref)) for k, v in ys.items() if k.split("/")[0] in q4t_tma.LOADS}
    print(f"{rows}x{cols} twins' y == ptr/s0's (the same bytes summed): {same}", flush=True)
    if "bytes" in ys:
        same = {k: bool(torch.equal(v, ys["bytes"])) for k, v in ys.items()
                if k.split("/")[0] in ("bytes", "compact", "step") and k != "bytes"}
        print(f"{rows}x{cols} bits == bytes: {same}", flush=True)
        b = ys["bytes"].double()
        err = {k: float((v.double() - b).norm() / b.norm()) for k, v in ys.items() if k.split("/")[0] in ("relaid", "pair", "pairx")}
        if err:
            print(f"{rows}x{cols} relaid/pair's ||y - bytes' y|| / ||bytes' y||: {err}", flush=True)
    torch.cuda.empty_cache()
    return out


def main() -> None:
    global ROWS
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--q4k17", action="store_true", help="session 8 q4k17's shapes and rows")
    ap.add_argument("--q4k18", action="store_true", help="session 8 q4k18's rows at q4k17's shapes")
    ap.add_argument("--q4k19", action="store_true", help="session 8 q4k19's rows at q4k17's shapes")
    ap.add_argument("--compile-workers", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    q4k1x = args.q4k17 or args.q4k18 or args.q4k19
    shapes = [tuple(map(int, s.split("x"))) for s in (Q4K17_SHAPES if q4k1x else args.shapes).split(",")]
    ROWS = Q4K19_ROWS if args.q4k19 else Q4K18_ROWS if args.q4k18 else Q4K17_ROWS if args.q4k17 else args.rows.split(",")
    if args.compile_workers:
        jobs = [(r, c, label) for r, c in shapes for label in ROWS]
        with cf.ProcessPoolExecutor(args.compile_workers, mp_context=mp.get_context("spawn")) as ex:
            failed = [f for f in ex.map(warm, jobs) if f]
        print(f"compiled {len(jobs)} kernels in {args.compile_workers} processes; failed: {failed}", flush=True)
    copy_bw = kb.copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()} d2d copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for r, c in shapes:
        rows += shape_rows(r, c, copy_bw)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "copy_bytes_per_second": copy_bw, "rows": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
