"""The instruction mix of the integer GEMV's main loop, compiled offline for sm_90 (no GPU needed:
the triton wheel carries ptxas), to see what bounds a kernel before spending device time.

Usage: PYTHONPATH=. python bench/kernels_sass.py [--types Q8_0,Q4_K,Q8_0P,Q4T] [--stages 0,3] [--tiles 16/4/2/e,...]
       PYTHONPATH=. python bench/kernels_sass.py --kstep 2,4,8  (q4k21: the warps_k launch's fold, kstep vs kmasked)
(Q8_0P: Q8_0 in the repacked resident layout, q8_0_packed; Q4T: Q4_K in the tiled one, q4_k_tiled;
Q6T: Q6_K in its tiled one, q6_k_tiled; Q4TL: Q4T's load-only twin, bench/q4t_twins.py; Q4TB: the bytes step;
Q4TC, Q4TS: bench/q4t_compact.py's per-group and per-step compact-load steps; q4k19: Q4TR, Q4TRL: bench/q4t_relaid.py's
step and twin, Q4TP, Q4TPL, Q4TPX: bench/q4t_pair.py's (pair, its twin, pairx),
Q4TX: q4_k_tiled's pairx step in matmul's kernel, their own kernels, compiled at the tile's unroll;
MXFP4T: MXFP4 in its tiled resident layout, mxfp4_tiled)

For each tile: warp instructions in the loop body, weight values per warp instruction (the issue
ceiling is that times 4 warp instructions/clock/SM), and the counts that matter (loads, dp4a,
shuffles and shared-memory traffic from layout conversions, barriers, and with --stages > 0 the
pipeliner's asynchronous copies LDGSTS and their waits DEPBAR), and the registers per thread
(cuobjdump -res-usage; what bounds the resident one-warp programs per SM: 65536 / (32 * regs)), and the
shared memory per program (the pipeliner's buffers: 233472 / (shared + 1024) programs per SM).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import tempfile

from gguf.constants import GGMLQuantizationType
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul, mxfp4_tiled, pdl, q4_k_pair, q4_k_tiled, q6_k_tiled, q8_0_packed
import q4t_compact  # (bench/, the script's own folder)
import q4t_pair
import q4t_relaid
import q4t_twins

LAYOUTS = {"Q8_0P": q8_0_packed.FAMILY, "Q4T": q4_k_tiled.FAMILY,  # --types names of the repacked layouts
           "Q6T": q6_k_tiled.FAMILY, "Q4TL": q4t_twins.TWINS["loadonly"],
           "Q4TB": q4_k_tiled.FAMILIES["bytes"],  # q4k17: q4t_compact's per-group step, Q4TS its per-step kernel
           "Q4TC": dataclasses.replace(q4_k_tiled.FAMILIES["bytes"], idot=q4t_compact.idot_compact),
           "Q4TS": q4_k_tiled.FAMILIES["bytes"], "Q4TX": q4_k_tiled.FAMILIES["pairx"],
           "MXFP4T": mxfp4_tiled.FAMILY}  # session 25: resident MXFP4 experts' 16-row tiles
# q4k19: kernels of their own (4 rows, one warp), by --types name: (kernel, MODE)
OWN = {"Q4TR": (q4t_relaid._kernel, 1), "Q4TRL": (q4t_relaid._kernel, 0), "Q4TP": (q4t_pair._kernel, 1),
       "Q4TPL": (q4t_pair._kernel, 0), "Q4TPX": (q4t_pair._kernel, 2)}
OWN_SIGNATURE = {"w_ptr": "*u8", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "y_ptr": "*fp32",
                 "part_ptr": "*fp32", "tickets_ptr": "*i32", "N": "i32", "G": "i32"}
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

SIGNATURE = {"w_ptr": "*u8", "aux_ptr": "*i32", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32",
             "y_ptr": "*fp32", "part_ptr": "*fp32", "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}
# as the launches specialize them
ALIGNED = ("w_ptr", "aux_ptr", "xw_ptr", "xd_ptr", "xs_ptr", "y_ptr", "K", "row_bytes")
TILES = [matmul.GemvConfig(*c) for c in ((4, 1, 1, 0, False), (4, 1, 1, 0, True), (16, 4, 1, 0, False),
                                          (16, 4, 1, 0, True), (64, 4, 1, 0, False), (64, 4, 1, 0, True))]
WATCH = ("LDG", "IDP", "SHFL", "BAR", "STS", "STSM", "LDS", "I2FP", "FFMA", "LDGSTS", "DEPBAR")


def compiled(fam: dispatch.Family, cfg: matmul.GemvConfig, steps: bool = False):
    kern = q4t_compact._kernel if steps else matmul._igemv_kernel
    args = {} if steps else dict(**matmul.int_args(fam), EW=cfg.elementwise)
    consts = dict(**args, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, SPLIT=1,
                  EMU=False, ATOMIC=False, KFOLD=True, STAGES=matmul.stages_arg(cfg))
    consts = pdl.compile_args(kern, consts)
    names = kern.arg_names  # (q4t_compact's kernel has no aux_ptr)
    sig = {n: "constexpr" if n in consts else SIGNATURE[n] for n in names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED if n in names})
    return compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


def compiled_own(name: str, cfg: matmul.GemvConfig):
    """OWN's kernel name at cfg's unroll, split 1 (one warp, the 4-row tile)."""
    kern, mode = OWN[name]
    consts = dict(MODE=mode, UNROLL=cfg.unroll, SPLIT=1, KFOLD=True, EMU=False)
    sig = dict(OWN_SIGNATURE, **{k: "constexpr" for k in consts})
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                    attrs={(list(OWN_SIGNATURE).index(n),): [["tt.divisibility", 16]] for n in ALIGNED
                           if n in OWN_SIGNATURE})
    return compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})


def cubin(fam: dispatch.Family, cfg: matmul.GemvConfig) -> bytes:
    return compiled(fam, cfg).asm["cubin"]


def sass(fam: dispatch.Family, cfg: matmul.GemvConfig) -> str:
    return get_sass(cubin(fam, cfg))


def registers(binary: bytes) -> int:
    """Registers per thread of a compiled kernel (cuobjdump -res-usage)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        out = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1))


def loop_ops(text: str) -> list[str]:
    """Opcodes of the body of the last backward-branching loop."""
    lines = text.splitlines()
    back = max(i for i, line in enumerate(lines) if re.search(r"@!?P\w+\s+BRA LBB\w+", line))
    label = re.search(r"BRA (LBB\w+)", lines[back]).group(1)
    start = next(i for i, line in enumerate(lines) if line.startswith(label + ":"))
    body = [line.split("\t", 1)[-1] for line in lines[start + 1:back + 1]]
    return [re.sub(r"^@!?U?P\w+\s+", "", op).split()[0].split(".")[0] for op in body]


KSTEPS = {"kstep": q4_k_pair.kstep, "kmasked": q4t_twins.kstep_masked}  # q4k21: the engine's fold and q4k20's
KSIGNATURE = {"w_ptr": "*u8", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "y_ptr": "*fp32", "N": "i32",
              "K": "i32", "row_bytes": "i32"}


def compiled_kstep(name: str, kw: int):
    """matmul._kgemv_kernel (the warps_k launch) with KSTEPS' name at KW = kw warps, 2 groups a step, as launched."""
    kern = matmul._kgemv_kernel
    consts = pdl.compile_args(kern, dict(KSTEP=KSTEPS[name], KW=kw, UNROLL=2, EMU=False))
    sig = dict(KSIGNATURE, **{k: "constexpr" for k in consts})
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                    attrs={(list(KSIGNATURE).index(n),): [["tt.divisibility", 16]] for n in ALIGNED
                           if n in KSIGNATURE})
    return compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": kw, "maxnreg": matmul.KSTEP_MAXNREG})


def after_loop_ops(text: str) -> list[str]:
    """Opcodes from the last backward-branching loop's branch to the kernel's last EXIT (the fold and the store)."""
    lines = text.splitlines()
    back = max(i for i, line in enumerate(lines) if re.search(r"@!?P\w+\s+BRA LBB\w+", line))
    end = max(i for i, line in enumerate(lines) if re.search(r"\tEXIT;", line))
    return [re.sub(r"^@!?U?P\w+\s+", "", line.split("\t", 1)[-1]).split()[0].split(".")[0]
            for line in lines[back + 1:end + 1] if "\t" in line]


def parse_tile(text: str) -> matmul.GemvConfig:
    """rows/warps/unroll/e|g (e: elementwise tile, g: reduced every group) as a GemvConfig."""
    rows, warps, unroll, mode = text.split("/")
    return matmul.GemvConfig(int(rows), int(warps), int(unroll), 0, mode == "e")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--stages", default="0", help="GemvConfig.stages values to compile each tile with")
    ap.add_argument("--tiles", default=None, help="tiles instead of TILES: rows/warps/unroll/e|g, comma-separated, "
                    "e.g. 16/4/2/e,8/2/1/g")
    ap.add_argument("--kstep", default="", help="KW values: the warps_k launch's loop and fold (KSTEPS) instead")
    args = ap.parse_args()
    for kw in (int(v) for v in args.kstep.split(",") if v):
        for name in KSTEPS:
            binary = compiled_kstep(name, kw).asm["cubin"]
            text = get_sass(binary)
            after = after_loop_ops(text)
            counts = " ".join(f"{op}={after.count(op)}" for op in WATCH + ("LDSM", "FADD") if after.count(op))
            print(f"{name} KW={kw}: {len(loop_ops(text))} warp-instr/iteration, {len(after)} after the loop ({counts})"
                  f"  regs={registers(binary)}")
    if args.kstep:
        return
    tiles = TILES if args.tiles is None else [parse_tile(t) for t in args.tiles.split(",")]
    for name in args.types.split(","):
        fam = None if name in OWN else LAYOUTS[name] if name in LAYOUTS else dispatch.FAMILIES[GGMLQuantizationType[name]]
        for cfg in (dataclasses.replace(t, stages=int(n)) for t in tiles for n in args.stages.split(",")):
            kernel = compiled_own(name, cfg) if fam is None else compiled(fam, cfg, steps=name == "Q4TS")
            binary = kernel.asm["cubin"]
            ops = loop_ops(get_sass(binary))
            values = cfg.block_n * 256 * cfg.unroll
            counts = " ".join(f"{op}={ops.count(op)}" for op in WATCH)
            print(f"{name} {cfg.block_n:2d} rows {cfg.num_warps} warps {'tile' if cfg.elementwise else 'rows'} "
                  f"{cfg.stages} stages: "
                  f"{len(ops)} warp-instr/iteration, {values / (len(ops) * cfg.num_warps):.1f} values/warp-instr  {counts}"
                  f"  regs={registers(binary)} shared={kernel.metadata.shared}")


if __name__ == "__main__":
    main()
