"""Achieved bandwidth of the Triton GGUF kernels at decode shapes on the GPU, as a fraction of the
device-to-device copy bandwidth measured in the same run, with torch's dequantize-then-matmul as
the baseline; plus a zero-copy correctness check (--unified on) reading pinned host memory.

Usage: PYTHONPATH=. python bench/kernels_bench.py [--types Q8_0,Q4_K] [--unified on|off] [--json F]
       [--torch-baseline] [--sweep] [--compare] [--shapes dense1,moe0,moe1]

Q8_0 and Q4_K run their integer path (x quantized on the device, dp4a); the float path they had
before (the family without its integer step) is timed in the same run as "float" rows, the
"before" of docs/performance.md. --sweep tries every tile in SWEEP / MOE_SWEEP, else the defaults.
--compare also times the integer defaults changed by each of VARIANTS (old vs new switches side by
side: atomic = the atomic reduction used before session 3 ordered the sums, stages = Triton's pipeliner, ew = elementwise tile).
F16 and BF16 (session 36) are timed beside torch.mv on the 16-bit matrix ("torch mv 16-bit": cuBLAS, x rounded to
16 bits), what an engine holding them as torch tensors would run.

Every timed kernel is first checked against the float64 reference on fresh random blocks.
Working sets rotate over >= ROTATE_BYTES so repeated runs cannot be served from the 50 MB L2;
each measurement is one CUDA graph replaying a pass over all rotated inputs, median of REPEATS.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import statistics

import torch
from gguf import GGMLQuantizationType as T

from sparkd.engine import quants
from sparkd.engine.kernels import dispatch, q8_0_packed
from sparkd.engine.kernels.matmul import GemvConfig, default_config, gemv
from sparkd.engine.kernels.moe import (
    ExpertTable,
    PreparedTable,
    decode_tiles,
    down_input,
    moe_decode,
    prepare,
)
from sparkd.engine.layers.act_round import round_activations
from sparkd.engine.modelgen.blocks import set_iq1_m_d

ROTATE_BYTES = 768 << 20
REPEATS = 15
BASELINE = False  # --torch-baseline: also time torch's dequantize-then-matmul (slow)
F16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q2_K: [80, 82], T.Q3_K: [108],
              T.Q4_0: [0], T.IQ4_XS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ3_XXS: [0], T.IQ1_S: [0],
              T.IQ2_S: [0], T.IQ3_S: [0], T.Q5_0: [0], T.Q5_1: [0, 2], T.IQ4_NL: [0], T.IQ1_M: [],
              T.MXFP4: []}  # (random_blocks: the last two's scales)
HALF_TYPES = {T.F16: torch.float16, T.BF16: torch.bfloat16}  # (random_blocks: normal values)
DENSE = [(14336, 4096), (4096, 14336)]  # llama-3-8B-like up and down projections
# model width, expert width, experts per token: qwen3-30b-a3b, and qwen3-235b-a22b
MOES = [(2048, 768, 8), (4096, 1536, 8)]
MOE = MOES[0]
# the families with an integer step (their float path is timed beside it: float_path); Q4_K's tiled layouts are
# LAYOUTS, not FAMILIES
INT_TYPES = tuple(qtype for qtype, fam in dispatch.FAMILIES.items() if fam.idot is not None)
# GEMV dot timed next to dequant-then-multiply
IQ_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ1_M, T.IQ2_S, T.IQ3_S)
NO_DOT = dict(dot=None, acc0=None, total=None, idot=None, act_fmt=None)  # (no integer step either: its switch on)
SWEEP_ON = False  # --sweep
COMPARE = False  # --compare
# the switches timed against the defaults with --compare (GemvConfig fields)
VARIANTS = {"atomic": dict(atomic=True), "stages3": dict(stages=3), "ew": dict(elementwise=True)}
# MoE only, with --compare: one projection's tile changed, the other at its default. gate/up:
# h quantized in the gate/up launch (fuse_quant, tiles of whole activation blocks); down: a down
# program now sums all A experts (A times fewer programs than before), so smaller row tiles or
# split (ranges of experts in parallel, then one ordered sum: a launch more)
GATE_UP_VARIANTS = {T.Q8_0: {"gu 32r": dict(block_n=32), "gu 32r fuseq": dict(block_n=32, fuse_quant=True)},
                    T.Q4_K: {"gu 256r fuseq": dict(block_n=256, fuse_quant=True)}}
DOWN_VARIANTS = {T.Q8_0: {"dn 2r": dict(block_n=2), "dn 1r": dict(block_n=1), "dn split2": dict(split=2),
                          "dn split8": dict(split=8)},
                 T.Q4_K: {"dn 4r1w": dict(block_n=4, num_warps=1), "dn 8r2w": dict(block_n=8, num_warps=2),
                          "dn split2": dict(split=2), "dn split8": dict(split=8)}}
# Q8_0 repacked for resident tensors (q8_0_packed): the GEMV default tile, then wider row tiles,
# which the aligned 128-bit loads make cheaper per value (bench/kernels_sass.py --types Q8_0P)
PACKED_TILES = [None, GemvConfig(16, 4, 1, 0, False), GemvConfig(64, 4, 1, 0, False), GemvConfig(4, 1, 2, 0, True)]
# GEMV tiles tried for the integer path: (rows per program, warps, groups per step, split (0 = auto),
# elementwise tile); the session-3 run had the per-group reduction only (elementwise False)
SWEEP = [GemvConfig(*c) for c in (
    (4, 1, 1, 0, False), (4, 1, 2, 0, False), (8, 1, 1, 0, False), (8, 2, 1, 0, False), (16, 2, 1, 0, False),
    (16, 4, 1, 0, False), (32, 4, 1, 0, False), (64, 4, 1, 0, False), (4, 1, 2, 0, True), (8, 1, 1, 0, True),
    (16, 2, 1, 0, True), (64, 4, 1, 0, True), (16, 4, 2, 0, True), (64, 4, 2, 0, True))]
FLOAT_BEST = GemvConfig(4, 2, 2, 0, True)  # the float path's best tiles in the session-2 sweep
FLOAT_MOE = (GemvConfig(8, 1, 1, 0, True), GemvConfig(4, 1, 1, 0, True))
# MoE (gate/up tile, down tile) pairs tried for the integer path; the first is the default
MOE_SWEEP = [(None, None)] + [(GemvConfig(*a), GemvConfig(*b)) for a, b in (
    ((4, 1, 1, 0, False), (4, 1, 1, 0, False)), ((8, 1, 1, 0, False), (8, 1, 1, 0, False)),
    ((16, 2, 1, 0, False), (8, 2, 1, 0, False)), ((16, 4, 1, 0, False), (16, 4, 1, 0, False)),
    ((4, 1, 2, 0, True), (4, 1, 1, 0, True)), ((16, 4, 1, 0, True), (16, 4, 1, 0, True)))]


@contextlib.contextmanager
def float_path(qtype: T, **without):
    """The family without its integer step: the float kernels these types ran before (or without
    the given fields: NO_DOT, an i-quant's dequant-then-multiply)."""
    fam = dispatch.FAMILIES[qtype]
    dispatch.FAMILIES[qtype] = dataclasses.replace(fam, **(without or dict(idot=None, act_fmt=None)))
    try:
        yield
    finally:
        dispatch.FAMILIES[qtype] = fam


def tag(cfg: GemvConfig | None) -> str:
    if cfg is None:
        return "default"
    return (f"{cfg.block_n}r{cfg.num_warps}w{cfg.unroll}u{cfg.split or 'a'}s{'e' if cfg.elementwise else 'g'}"
            f"{'A' if cfg.atomic else ''}{f'p{cfg.stages}' if cfg.stages else ''}{'Q' if cfg.fuse_quant else ''}")


def x_in(qtype: T, x: torch.Tensor) -> torch.Tensor:
    """What the kernels multiply: llama.cpp's rounding of x for the integer families."""
    fmt = dispatch.FAMILIES[qtype].act_fmt
    return x if fmt is None else round_activations(x[None], fmt)[0]


def random_blocks(qtype: T, n_bytes: int, device: str = "cuda") -> torch.Tensor:
    fam = dispatch.FAMILIES[qtype]
    if qtype in HALF_TYPES:  # values: random bits would be NaNs and infinities
        return torch.randn(n_bytes // 2, device=device).to(HALF_TYPES[qtype]).view(torch.uint8)
    b = torch.randint(0, 256, (n_bytes // fam.block_bytes, fam.block_bytes), dtype=torch.uint8, device=device)

    def scales():
        sign = torch.randint(0, 2, (b.shape[0],), device=device) * 2 - 1
        return ((torch.rand(b.shape[0], device=device) * 0.099 + 1e-3) * sign).half()
    for at in F16_FIELDS[qtype]:
        b[:, at:at + 2] = scales().view(torch.uint8).reshape(-1, 2)
    if qtype == T.IQ1_M:  # d in the scale words' top nibbles (make-model's writer, on the host)
        host = b.cpu().numpy()
        set_iq1_m_d(host, scales().cpu().numpy())
        b = torch.from_numpy(host).to(device)
    if qtype == T.MXFP4:  # the e8m0 exponent byte: scales 2^-10 .. 2^-3
        b[:, 0] = torch.randint(117, 125, (b.shape[0],), dtype=torch.uint8, device=device)
    return b.reshape(-1)


def graph_seconds(fn, n_calls: int) -> float:
    """Median seconds per call of a CUDA graph holding n_calls calls of fn(i)."""
    for i in range(n_calls):  # warm-up: compile, allocate
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_calls):
            fn(i)
    return events_seconds(g.replay) / n_calls


def events_seconds(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.randint(0, 256, (1 << 31,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / events_seconds(lambda: dst.copy_(src))  # bytes read + written


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got.double() - ref).norm() / ref.norm())


def dense_rows(qtype: T, rows: int, cols: int, copy_bw: float) -> list[dict]:
    fam = dispatch.FAMILIES[qtype]
    nbytes = rows * fam.row_bytes(cols)
    n = max(2, -(-ROTATE_BYTES // nbytes))
    buf = random_blocks(qtype, n * nbytes)
    ws = [buf[i * nbytes:(i + 1) * nbytes] for i in range(n)]
    x = torch.randn(cols, device="cuda")
    W = quants.dequantize(ws[0], qtype, (rows, cols)).double()
    out, y = [], torch.empty(rows, device="cuda")

    def time(cfg: GemvConfig | None, label: str) -> dict:
        y.fill_(float("nan"))
        err = rel_err(gemv(ws[0], qtype, (rows, cols), x, out=y, config=cfg), W @ x_in(qtype, x).double())
        sec = graph_seconds(lambda i: gemv(ws[i % n], qtype, (rows, cols), x, out=y, config=cfg), n)
        return dict(kernel=f"gemv {rows}x{cols}", type=qtype.name, config=label,
                    us=sec * 1e6, bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=err)
    if qtype in INT_TYPES:
        with float_path(qtype):
            out.append(time(FLOAT_BEST, f"float {tag(FLOAT_BEST)}"))
    if qtype in IQ_TYPES:
        with float_path(qtype, **NO_DOT):
            out.append(time(None, "dequant default"))
    for cfg in (SWEEP if SWEEP_ON and qtype in INT_TYPES else [None]):
        out.append(time(cfg, tag(cfg)))
    for name, change in (VARIANTS.items() if COMPARE and qtype in INT_TYPES else ()):
        cfg = dataclasses.replace(default_config(fam), **change)
        out.append(time(cfg, f"{name} {tag(cfg)}"))
    if COMPARE and qtype == T.Q8_0:
        out += packed_rows(ws, (rows, cols), x, W @ x_in(qtype, x).double(), copy_bw)
    if qtype in HALF_TYPES:  # what a torch engine would run instead: cuBLAS on the 16-bit matrix, x rounded to it
        hw, hx = [w.view(HALF_TYPES[qtype]).view(rows, cols) for w in ws], x.to(HALF_TYPES[qtype])
        sec = graph_seconds(lambda i: torch.mv(hw[i % n], hx), n)
        out.append(dict(kernel=f"gemv {rows}x{cols}", type=qtype.name, config="torch mv 16-bit", us=sec * 1e6,
                        bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=rel_err(torch.mv(hw[0], hx).float(),
                                                                                   W @ x.double())))
    if not BASELINE:
        return out
    sec = events_seconds(lambda: [quants.dequantize(ws[i], qtype, (rows, cols)) @ x for i in range(n)]) / n
    out.append(dict(kernel=f"gemv {rows}x{cols}", type=qtype.name, config="torch deq+mm", us=sec * 1e6,
                    bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=0.0))
    return out


def packed_rows(ws: list[torch.Tensor], shape: tuple[int, int], x: torch.Tensor, ref: torch.Tensor,
                copy_bw: float) -> list[dict]:
    """--compare: the Q8_0 GEMV on the repacked resident layout (q8_0_packed), same weights."""
    ps = [q8_0_packed.pack(w, shape) for w in ws]
    y, out, nbytes = torch.empty(shape[0], device="cuda"), [], ws[0].numel()
    for cfg in PACKED_TILES:
        y.fill_(float("nan"))
        err = rel_err(q8_0_packed.gemv(ps[0], x, out=y, config=cfg), ref)
        sec = graph_seconds(lambda i: q8_0_packed.gemv(ps[i % len(ps)], x, out=y, config=cfg), len(ps))
        out.append(dict(kernel=f"gemv {shape[0]}x{shape[1]}", type="Q8_0", config=f"packed {tag(cfg)}",
                        us=sec * 1e6, bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=err))
    return out


def moe_table(qtype: T, n_experts: int, device: str = "cuda", shape=MOE) -> tuple[ExpertTable, int]:
    """n experts of one type in consecutive 4 KiB-aligned slots of one arena (gate | up | down). Slots are whole
    blocks too, so random_blocks' scale fields land on every expert's scales (MXFP4 at 2880x2880, 17-byte blocks:
    before session 25 the experts' e8m0 bytes were random, their y inf, though the times stood)."""
    D, F, _ = shape
    part = F * dispatch.FAMILIES[qtype].row_bytes(D)  # gate, up and down are the same size
    grain = math.lcm(4096, dispatch.FAMILIES[qtype].block_bytes)
    slot = -(-3 * part // grain) * grain
    arena = random_blocks(qtype, n_experts * slot)
    arena = arena if device == "cuda" else arena.cpu().pin_memory()
    offs = [[e * slot + k * part for e in range(n_experts)] for k in range(3)]
    return ExpertTable(arena, arena, arena, *offs, qtype, qtype, D, F), 3 * part


def gate_up_torch(table: ExpertTable, x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """act(gate x, up x) [n, F] the torch way (x rounded as the kernels round it), unrounded."""
    D, F = table.dim, table.width
    x = x_in(table.gate_up_type, x).to(dtype)
    return torch.stack([torch.nn.functional.silu(_deq(table.gate, table.gate_offsets[i], table.gate_up_type, (F, D), dtype) @ x)
                        * (_deq(table.up, table.up_offsets[i], table.gate_up_type, (F, D), dtype) @ x)
                        for i in range(len(table))])


def moe_torch(table: ExpertTable, x: torch.Tensor, w: torch.Tensor, dtype=torch.float32,
              h: torch.Tensor | None = None) -> torch.Tensor:
    """torch's way: dequantize each selected expert, then matmuls (float64 for the reference). h: the
    down's input as the engine has it (moe.down_input), instead of act(gate x, up x) rounded here:
    h computed apart may sit on the other side of a rounding boundary (session 8, moe16)."""
    D, F = table.dim, table.width
    if h is None:
        h = x_in(table.down_type, gate_up_torch(table, x, dtype).float())
    h = h.to(dtype)
    y = torch.zeros(D, dtype=dtype, device="cuda")
    for i in range(len(table)):
        y += w[i].to(dtype) * _deq(table.down, table.down_offsets[i], table.down_type, (D, F), dtype) @ h[i]
    return y


def _deq(buf: torch.Tensor, o: int, qtype: T, shape: tuple[int, int], dtype) -> torch.Tensor:
    raw = buf[o:o + shape[0] * dispatch.FAMILIES[qtype].row_bytes(shape[1])]
    return quants.dequantize(raw.cuda(), qtype, shape).to(dtype)


def moe_err(p: PreparedTable, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, gate_up: GemvConfig | None = None,
            kernels=None, ref: ExpertTable | None = None) -> float:
    """moe_decode's y for (p, x, w) at gate_up against float64, the larger of two errors with no rounding
    boundary between kernel and reference: the down over the engine's own down input (moe.down_input), and
    that input before rounding against float64 gate/up. ref: the same experts in GGUF blocks, for a table
    whose gate/up the engine repacked (moe.tiled_gate_up)."""
    t = ref or p.table
    ref = moe_torch(t, x, w, torch.float64, h=down_input(p, x, gate_up=gate_up, kernels=kernels))
    h32 = down_input(p, x, gate_up=gate_up, kernels=kernels, rounded=False)
    return max(rel_err(y, ref), rel_err(h32, gate_up_torch(t, x, torch.float64)))


def subset(table: ExpertTable, ids: list[int]) -> ExpertTable:
    def pick(offs):
        return [offs[i] for i in ids]
    return ExpertTable(table.gate, table.up, table.down, pick(table.gate_offsets), pick(table.up_offsets),
                       pick(table.down_offsets), table.gate_up_type, table.down_type, table.dim, table.width)


def moe_rows(qtype: T, copy_bw: float, shape=MOE) -> list[dict]:
    D, F, A = shape
    torch.manual_seed(0)  # the same experts, x and weights every run: an error seen once is seen again
    expert_bytes = 3 * F * dispatch.FAMILIES[qtype].row_bytes(D)
    n_sets = max(2, -(-ROTATE_BYTES // (A * expert_bytes)))
    full, _ = moe_table(qtype, n_sets * A, shape=shape)
    # each set's experts in descending slot order: the table, not the layout, decides
    sets = [prepare(subset(full, list(range(s * A, (s + 1) * A))[::-1]), "cuda") for s in range(n_sets)]
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    out, y, nbytes = [], torch.empty(D, device="cuda"), A * expert_bytes

    def time(gu: GemvConfig | None, dn: GemvConfig | None, label: str) -> dict:
        ps = [prepare(p.table, "cuda") for p in sets]  # the family as it is now (float_path)
        y.fill_(float("nan"))
        err = moe_err(ps[0], x, w, moe_decode(ps[0], x, w, out=y, gate_up=gu, down=dn), gu)
        sec = graph_seconds(lambda i: moe_decode(ps[i % n_sets], x, w, out=y, gate_up=gu, down=dn), n_sets)
        return dict(kernel=f"moe {D}x{F} top{A}", type=qtype.name, config=label,
                    us=sec * 1e6, bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=err)
    if qtype in INT_TYPES:
        with float_path(qtype):
            out.append(time(*FLOAT_MOE, f"float {tag(FLOAT_MOE[0])}/{tag(FLOAT_MOE[1])}"))
    if qtype in IQ_TYPES:
        with float_path(qtype, **NO_DOT):
            out.append(time(None, None, "dequant default"))
    for gu, dn in (MOE_SWEEP if SWEEP_ON and qtype in INT_TYPES else MOE_SWEEP[:1]):
        out.append(time(gu, dn, f"{tag(gu)}/{tag(dn)}"))
    if COMPARE and qtype in INT_TYPES:
        base = decode_tiles(sets[0])
        for name, change in VARIANTS.items():
            gu, dn = (dataclasses.replace(c, **change) for c in base)
            out.append(time(gu, dn, f"{name} {tag(gu)}/{tag(dn)}"))
        for k, table in ((0, GATE_UP_VARIANTS), (1, DOWN_VARIANTS)):
            for name, change in table[qtype].items():
                tiles = list(base)
                tiles[k] = dataclasses.replace(tiles[k], **change)
                out.append(time(*tiles, f"{name} {tag(tiles[0])}/{tag(tiles[1])}"))
    if not BASELINE:
        return out
    sec = events_seconds(lambda: [moe_torch(sets[i].table, x, w) for i in range(n_sets)]) / n_sets
    out.append(dict(kernel=f"moe {D}x{F} top{A}", type=qtype.name, config="torch deq+mm", us=sec * 1e6,
                    bw=nbytes / sec, frac=nbytes / sec / copy_bw, err=0.0))
    return out


def unified_rows(qtype: T) -> list[dict]:
    """Zero-copy: the same kernels reading expert blocks straight from pinned host memory."""
    D, F, A = MOE
    table, expert_bytes = moe_table(qtype, A, device="cpu")
    x, w = torch.randn(D, device="cuda"), torch.rand(A, device="cuda")
    y = torch.full((D,), float("nan"), device="cuda")
    p = prepare(table, "cuda")
    err = moe_err(p, x, w, moe_decode(table, x, w, out=y))
    sec = events_seconds(lambda: moe_decode(p, x, w, out=y))
    return [dict(kernel=f"moe {D}x{F} top{A} pinned host", type=qtype.name, config="default", us=sec * 1e6,
                 bw=A * expert_bytes / sec, frac=float("nan"), err=err)]


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['kernel']:34} {r['type']:5} {r['config']:32} {r['us']:9.1f} {r['bw'] / 1e9:7.0f} "
              f"{r['frac']:5.2f} {r['err']:8.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(t.name for t in dispatch.FAMILIES))
    ap.add_argument("--unified", choices=["on", "off"], default="on")
    ap.add_argument("--json", default=None)
    ap.add_argument("--torch-baseline", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--shapes", default=None,
                    help="which shapes, e.g. dense1,moe0 (index into DENSE / MOES); default: all")
    args = ap.parse_args()
    global BASELINE, SWEEP_ON, COMPARE
    BASELINE, SWEEP_ON, COMPARE = args.torch_baseline, args.sweep, args.compare
    types = [T[name] for name in args.types.split(",")]
    names = args.shapes.split(",") if args.shapes else [f"dense{i}" for i in range(len(DENSE))] + \
        [f"moe{i}" for i in range(len(MOES))]
    copy_bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  d2d copy {copy_bw / 1e9:.0f} GB/s (read+write)")
    print(f"{'kernel':34} {'type':5} {'config':32} {'us':>9} {'GB/s':>7} {'frac':>5} {'rel err':>8}", flush=True)
    rows = []
    for qt in types:
        for name in names:  # each shape's rows printed as soon as they are measured
            kind, i = re.fullmatch(r"(dense|moe)(\d+)", name).groups()
            got = dense_rows(qt, *DENSE[int(i)], copy_bw) if kind == "dense" else moe_rows(qt, copy_bw, MOES[int(i)])
            print_rows(got)
            rows += got
        if args.unified == "on":
            rows += unified_rows(qt)
            print_rows(rows[-1:])
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bytes_per_second=copy_bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
