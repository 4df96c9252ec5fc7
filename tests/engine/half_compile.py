"""Compile the F16 and BF16 GEMV (matmul._gemv_kernel at the family's default tile, on the 16-byte-aligned arguments
a launch specializes) and their prefill GEMM (prefill_gemm's float kernel through the family's dequant) for sm_90
offline (the triton wheel carries ptxas; no GPU needed) and print each kernel's global loads by width. Session 41:
the weights indexed in bytes (w_ptr + 2 k) compiled to one 16-bit load a value, 0.63-0.81 of copy bandwidth; typed
before they are indexed (half._load), a thread's 8 values are one 128-bit load. The interpreter runs none of this.
Run without TRITON_INTERPRET; test_kernels.py runs it. A line per type and kernel:
    <type> <gemv|gemm> <opcode>=<count> ..."""

import collections
import re

from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul, pdl, prefill_gemm

TYPES = {"w_ptr": "*u8", "aux_ptr": "*i32", "x_ptr": "*fp32", "y_ptr": "*fp32", "part_ptr": "*fp32",
         "tickets_ptr": "*i32"}
ALIGNED = ("w_ptr", "aux_ptr", "x_ptr", "y_ptr", "K", "row_bytes", "stride_xt", "stride_yt")  # as a launch sees them


def loads(kern, consts: dict, num_warps: int) -> collections.Counter:
    """The global load opcodes (LDG.E.128, LDG.E.U16, ...) of kern compiled for sm_90."""
    consts = pdl.compile_args(kern, consts)
    names = kern.arg_names
    sig = {n: "constexpr" if n in consts else TYPES.get(n, "i32") for n in names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED if n in names})
    cubin = compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["cubin"]
    return collections.Counter(re.findall(r"\b(LDG(?:STS)?\.E[.\w]*)", get_sass(cubin)))


def main() -> None:
    for qtype in (T.F16, T.BF16):
        fam = dispatch.FAMILIES[qtype]
        cfg = matmul.default_config(fam)
        gemv = loads(matmul._gemv_kernel, dict(**matmul.family_args(fam), BLOCK_N=cfg.block_n, UNROLL=cfg.unroll,
                                               EW=cfg.elementwise, SPLIT=1, ATOMIC=False, KFOLD=True, STAGES=None),
                     cfg.num_warps)
        print(qtype.name, "gemv", *(f"{op}={n}" for op, n in sorted(gemv.items())))
        gemm = loads(prefill_gemm._gemm_kernel, dict(DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
                                                     BLOCK_N=prefill_gemm.GEMM_BLOCK_N,
                                                     BLOCK_T=prefill_gemm.GEMM_BLOCK_T, PRECISION="tf32"),
                     prefill_gemm.GEMM_WARPS)
        print(qtype.name, "gemm", *(f"{op}={n}" for op, n in sorted(gemm.items())))


if __name__ == "__main__":
    main()
