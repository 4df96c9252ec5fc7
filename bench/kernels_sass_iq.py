"""The GEMV loop of the i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) compiled offline for sm_90: the integer
step (`int`, the family module's INT_FAMILY where it has one: dp4a on x as Q8_K) next to their own float `dot`
and dequant-then-multiply (kernels_sass.py does the other integer families).

Usage: PYTHONPATH=. python bench/kernels_sass_iq.py [--types IQ2_XXS,IQ1_S]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib

from gguf.constants import GGMLQuantizationType
from kernels_sass import loop_ops
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul, pdl

SIGNATURE = {"w_ptr": "*u8", "aux_ptr": "*fp32", "x_ptr": "*fp32", "y_ptr": "*fp32", "part_ptr": "*fp32",
             "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}
# the integer kernel's: the codebook as int8 words, x as Q8_K
ISIGNATURE = {"w_ptr": "*u8", "aux_ptr": "*i32", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32",
              "y_ptr": "*fp32", "part_ptr": "*fp32", "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}
# as the launches specialize them (w_ptr: 2-byte rows)
ALIGNED = ("aux_ptr", "x_ptr", "xw_ptr", "xd_ptr", "xs_ptr", "y_ptr", "K")
TILES = [matmul.GemvConfig(4, 1, 1, 0, True), matmul.GemvConfig(4, 1, 1, 0, False), matmul.GemvConfig(8, 2, 1, 0, True)]
WATCH = ("LDG", "SHFL", "BAR", "LDS", "I2FP", "I2F", "FFMA", "FMUL", "FADD", "LOP3", "SHF", "IMAD", "IDP", "PRMT")


def sass(fam: dispatch.Family, cfg: matmul.GemvConfig) -> str:
    """The family's GEMV at cfg: its integer step where it has one (idot), else its dot or dequant."""
    if fam.idot is not None:
        kern, signature = matmul._igemv_kernel, ISIGNATURE
        consts = dict(**matmul.int_args(fam), EMU=False)
    else:
        kern, signature = matmul._gemv_kernel, SIGNATURE
        consts = dict(**matmul.family_args(fam))
    consts = pdl.compile_args(kern, consts | dict(BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, EW=cfg.elementwise,
                                                  SPLIT=1, ATOMIC=False, KFOLD=True, STAGES=matmul.stages_arg(cfg)))
    names = kern.arg_names
    sig = {n: "constexpr" if n in consts else signature[n] for n in names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED if n in names})
    return get_sass(compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps}).asm["cubin"])


def variants(qtype: GGMLQuantizationType) -> list[tuple[str, dispatch.Family]]:
    """(label, family): the integer step where the type's module has one (whatever its switch says), its float
    dot, dequant-then-multiply."""
    fam = dispatch.FAMILIES[qtype]
    module = importlib.import_module(f"sparkd.engine.kernels.{qtype.name.lower()}")
    flt = getattr(module, "FLOAT_FAMILY", fam)
    ints = [("int", module.INT_FAMILY)] if hasattr(module, "INT_FAMILY") else []
    return ints + [("dot", flt), ("dequant", dataclasses.replace(flt, dot=None, acc0=None, total=None))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="IQ2_XXS,IQ2_XS,IQ3_XXS,IQ1_S")
    for name in ap.parse_args().types.split(","):
        for label, f in variants(GGMLQuantizationType[name]):
            for cfg in TILES:
                ops = loop_ops(sass(f, cfg))
                values = cfg.block_n * 256 * cfg.unroll
                counts = " ".join(f"{op}={ops.count(op)}" for op in WATCH)
                print(f"{name} {label:7s} {cfg.block_n:2d} rows {cfg.num_warps} warps "
                      f"{'tile' if cfg.elementwise else 'rows'}: {len(ops)} warp-instr/iteration, "
                      f"{values / (len(ops) * cfg.num_warps):.2f} values/warp-instr | {counts}", flush=True)


if __name__ == "__main__":
    main()
