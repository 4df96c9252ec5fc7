"""The float GEMV loop of the i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) compiled offline for sm_90,
their own `dot` next to dequant-then-multiply (kernels_sass.py does the integer families).

Usage: PYTHONPATH=. python bench/kernels_sass_iq.py [--types IQ2_XXS,IQ1_S]
"""

from __future__ import annotations

import argparse
import dataclasses

from gguf.constants import GGMLQuantizationType
from kernels_sass import loop_ops
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul

SIGNATURE = {"w_ptr": "*u8", "aux_ptr": "*fp32", "x_ptr": "*fp32", "y_ptr": "*fp32", "part_ptr": "*fp32",
             "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}
ALIGNED = ("aux_ptr", "x_ptr", "y_ptr", "K")  # as the launches specialize them (w_ptr: 2-byte rows)
TILES = [matmul.GemvConfig(4, 1, 1, 0, True), matmul.GemvConfig(4, 1, 1, 0, False), matmul.GemvConfig(8, 2, 1, 0, True)]
WATCH = ("LDG", "SHFL", "BAR", "LDS", "I2FP", "I2F", "FFMA", "FMUL", "FADD", "LOP3", "SHF", "IMAD")


def sass(fam: dispatch.Family, cfg: matmul.GemvConfig) -> str:
    kern = matmul._gemv_kernel
    consts = dict(**matmul.family_args(fam), BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, EW=cfg.elementwise, SPLIT=1,
                  ATOMIC=False, KFOLD=True, STAGES=matmul.stages_arg(cfg), PDL=False)
    sig = dict(SIGNATURE, **{k: "constexpr" for k in consts})
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                    attrs={(list(SIGNATURE).index(n),): [["tt.divisibility", 16]] for n in ALIGNED})
    return get_sass(compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps}).asm["cubin"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="IQ2_XXS,IQ2_XS,IQ3_XXS,IQ1_S")
    for name in ap.parse_args().types.split(","):
        fam = dispatch.FAMILIES[GGMLQuantizationType[name]]
        for label, f in (("dot", fam), ("dequant", dataclasses.replace(fam, dot=None, acc0=None, total=None))):
            for cfg in TILES:
                ops = loop_ops(sass(f, cfg))
                values = cfg.block_n * 256 * cfg.unroll
                counts = " ".join(f"{op}={ops.count(op)}" for op in WATCH)
                print(f"{name} {label:7s} {cfg.block_n:2d} rows {cfg.num_warps} warps "
                      f"{'tile' if cfg.elementwise else 'rows'}: {len(ops)} warp-instr/iteration, "
                      f"{values / (len(ops) * cfg.num_warps):.2f} values/warp-instr | {counts}", flush=True)


if __name__ == "__main__":
    main()
