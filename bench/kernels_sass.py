"""The instruction mix of the integer GEMV's main loop, compiled offline for sm_90 (no GPU needed:
the triton wheel carries ptxas), to see what bounds a kernel before spending device time.

Usage: PYTHONPATH=. python bench/kernels_sass.py [--types Q8_0,Q4_K,Q8_0P] [--stages 0,3]
(Q8_0P: Q8_0 in the repacked resident layout, q8_0_packed)

For each tile: warp instructions in the loop body, weight values per warp instruction (the issue
ceiling is that times 4 warp instructions/clock/SM), and the counts that matter (loads, dp4a,
shuffles and shared-memory traffic from layout conversions, barriers, and with --stages > 0 the
pipeliner's asynchronous copies LDGSTS and their waits DEPBAR).
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from gguf.constants import GGMLQuantizationType
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul, q8_0_packed

SIGNATURE = {"w_ptr": "*u8", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "y_ptr": "*fp32",
             "part_ptr": "*fp32", "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}
ALIGNED = ("w_ptr", "xw_ptr", "xd_ptr", "xs_ptr", "y_ptr", "K", "row_bytes")  # as the launches specialize them
TILES = [matmul.GemvConfig(*c) for c in ((4, 1, 1, 0, False), (4, 1, 1, 0, True), (16, 4, 1, 0, False),
                                          (16, 4, 1, 0, True), (64, 4, 1, 0, False), (64, 4, 1, 0, True))]
WATCH = ("LDG", "IDP", "SHFL", "BAR", "STS", "STSM", "LDS", "I2FP", "FFMA", "LDGSTS", "DEPBAR")


def sass(fam: dispatch.Family, cfg: matmul.GemvConfig, idot=None) -> str:
    """idot: another integer step than the family's (q8_0_packed.idot)."""
    kern = matmul._igemv_kernel
    args = matmul.int_args(fam) if idot is None else dict(IDOT=idot, A1=fam.iacc[0], A2=fam.iacc[1])
    consts = dict(**args, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, SPLIT=1,
                  EW=cfg.elementwise, EMU=False, ATOMIC=False, KFOLD=True, STAGES=matmul.stages_arg(cfg))
    sig = dict(SIGNATURE, **{k: "constexpr" for k in consts})
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                    attrs={(list(SIGNATURE).index(n),): [["tt.divisibility", 16]] for n in ALIGNED})
    return get_sass(compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps}).asm["cubin"])


def loop_ops(text: str) -> list[str]:
    """Opcodes of the body of the last backward-branching loop."""
    lines = text.splitlines()
    back = max(i for i, line in enumerate(lines) if "@P" in line and re.search(r"BRA LBB\w+", line))
    label = re.search(r"BRA (LBB\w+)", lines[back]).group(1)
    start = next(i for i, line in enumerate(lines) if line.startswith(label + ":"))
    body = [line.split("\t", 1)[-1] for line in lines[start + 1:back + 1]]
    return [re.sub(r"^@!?U?P\w+\s+", "", op).split()[0].split(".")[0] for op in body]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--stages", default="0", help="GemvConfig.stages values to compile each tile with")
    args = ap.parse_args()
    for name in args.types.split(","):
        packed = name == "Q8_0P"  # the repacked resident layout (q8_0_packed)
        fam = dispatch.FAMILIES[GGMLQuantizationType["Q8_0" if packed else name]]
        for cfg in (dataclasses.replace(t, stages=int(n)) for t in TILES for n in args.stages.split(",")):
            ops = loop_ops(sass(fam, cfg, q8_0_packed.idot if packed else None))
            values = cfg.block_n * 256 * cfg.unroll
            counts = " ".join(f"{op}={ops.count(op)}" for op in WATCH)
            print(f"{name} {cfg.block_n:2d} rows {cfg.num_warps} warps {'tile' if cfg.elementwise else 'rows'} "
                  f"{cfg.stages} stages: "
                  f"{len(ops)} warp-instr/iteration, {values / (len(ops) * cfg.num_warps):.1f} values/warp-instr  {counts}")


if __name__ == "__main__":
    main()
