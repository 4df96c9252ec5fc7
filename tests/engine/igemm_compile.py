"""Compile the integer prefill GEMMs (prefill_gemm._igemm_kernel and _grouped_igemm_kernel) for sm_90 offline (the
triton wheel carries ptxas; no GPU needed) at each layout's launch (prefill_gemm.igemm_tile) and print the registers
and stack bytes a thread (cuobjdump -res-usage of Triton's cubin: a stack here holds spilled registers) and how often
the PTX reads the xs_ptr argument (x's per-32 sums: only the K-quants' min term needs them; the i-quants' zero mins
fold away, IQ1_S's delta is in its quants). The interpreter runs none of this. Run without TRITON_INTERPRET;
test_kernels.py runs it for Q4_0, the i-quants (IQ4_XS, IQ2_XXS, IQ3_XXS, IQ2_XS, IQ1_S) and Q4_K. Arguments:
layouts (default all), e.g. `python igemm_compile.py Q4_0 IQ4_XS`. A line per layout and kernel:
    <layout> <dense|grouped> regs=<n> stack=<bytes> xs_reads=<n>"""

import os
import re
import subprocess
import sys
import tempfile

import triton
from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from sparkd.engine.kernels import dispatch, mxfp4_tiled, prefill_gemm, q4_k_tiled, q6_k_tiled, q8_0_packed

LAYOUTS = {"Q8_0": T.Q8_0, "Q8_0_PACKED": q8_0_packed.PACKED, "Q4_K": T.Q4_K, "Q4_K_TILED": q4_k_tiled.TILED,
           "Q6_K": T.Q6_K, "Q6_K_TILED": q6_k_tiled.TILED, "Q4_0": T.Q4_0, "IQ4_XS": T.IQ4_XS,
           "IQ2_XXS": T.IQ2_XXS, "IQ3_XXS": T.IQ3_XXS, "IQ2_XS": T.IQ2_XS, "IQ1_S": T.IQ1_S, "IQ1_M": T.IQ1_M, "IQ2_S": T.IQ2_S, "IQ3_S": T.IQ3_S,
           "MXFP4": T.MXFP4, "MXFP4_TILED": mxfp4_tiled.TILED}
TYPES = {"w_ptr": "*u8", "w_off_ptr": "*i64", "aux_ptr": "*i32", "tiles_ptr": "*i32", "src_ptr": "*i32",
         "xq_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "y_ptr": "*fp32"}
# the wheel's own cuobjdump (as bench/kernels_sass.py finds it: triton.tools.disasm's helper changed across releases)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
N_BLOCKS = 2048 // 32  # rows of 2048 values (bench/igemm_bench.py's shapes): UNROLL as there


def compiled(kern, fam: dispatch.Family, grouped: bool):
    """kern compiled for sm_90 at the family layout's launch (the grouped one on its expert tiles, expert_rows)."""
    tile = prefill_gemm.igemm_tile(fam, grouped)
    args = prefill_gemm._igemm_args(fam, tile, N_BLOCKS)
    opts = {k: args.pop(k) for k in ("num_warps", "maxnreg") if k in args}
    consts = dict(args, BLOCK_T=tile.expert_rows if grouped else tile.block_t)
    sig = {n: "constexpr" if n in consts else TYPES.get(n, "i32") for n in kern.arg_names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()})
    return compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) a thread of the one kernel in cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return int(m[1]), int(m[2])


def main(names: list[str]) -> None:
    for name in names or LAYOUTS:
        fam = dispatch.family(LAYOUTS[name])
        for kind, kern in (("dense", prefill_gemm._igemm_kernel), ("grouped", prefill_gemm._grouped_igemm_kernel)):
            k = compiled(kern, fam, kind == "grouped")
            reads = k.asm["ptx"].count(f"[{kern.fn.__name__}_param_{kern.arg_names.index('xs_ptr')}]")
            regs, stack = usage(k.asm["cubin"])
            print(f"{name} {kind} regs={regs} stack={stack} xs_reads={reads}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
