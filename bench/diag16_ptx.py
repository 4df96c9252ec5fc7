"""Session 8 (diag16), offline: matmul._igemv_kernel of a tree's sparkd compiled for sm_90 by the local
triton (no GPU), its PTX written out and summed up (lines, butterfly shuffles, the group loop's lines),
to set one tree's kernel beside another's: is the loop the same, is the epilogue's add order the same?

  python bench/diag16_ptx.py TREE OUT FAMILY BLOCK_N WARPS
  FAMILY: q4t (q4_k_tiled "bytes"), q4k (q4_k), q6t (q6_k_tiled), q6k (q6_k), q80 (q8_0)

Every pointer and integer argument is taken as divisible by 16, as Triton specializes them at launch;
split 1, one group per step. Session 8 ran it with triton 3.6.0 (the H200's) in a venv of its own,
torch from another (sys.path appended), for main and branch diag16 (docs/performance.md, Session 8).
"""

from __future__ import annotations

import importlib
import re
import sys


def main() -> None:
    tree, out, fam_key, block_n, warps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    sys.path.insert(0, tree)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from sparkd.engine.kernels import matmul

    mod, attr = {"q4t": ("q4_k_tiled", "FAMILY"), "q4k": ("q4_k", "FAMILY"), "q6t": ("q6_k_tiled", "INT_FAMILY"),
                 "q6k": ("q6_k", "INT_FAMILY"), "q80": ("q8_0", "FAMILY")}[fam_key]
    fam = getattr(importlib.import_module(f"sparkd.engine.kernels.{mod}"), attr)
    kern = matmul._igemv_kernel
    consts = dict(**matmul.int_args(fam), BLOCK_N=block_n, UNROLL=1, SPLIT=1, EW=True, EMU=False, ATOMIC=False,
                  KFOLD=False, STAGES=None, PDL=False)
    ptrs = {"w_ptr": "*u8", "aux_ptr": "*i32", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "y_ptr": "*fp32",
            "part_ptr": "*fp32", "tickets_ptr": "*i32"}
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in kern.arg_names}
    names = list(enumerate(kern.arg_names))
    src = ASTSource(fn=kern, signature=sig, constexprs={(i,): consts[n] for i, n in names if n in consts},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in names if n not in consts})
    ptx = compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    with open(out, "w") as f:
        f.write(ptx)
    lines = ptx.splitlines()
    loop = [i for i, line in enumerate(lines) if "Loop Header" in line or "crit_edge" in line]
    shuffles = re.findall(r"bfly.b32\s+[^,]*, [^,]*, (\d+)", ptx)
    print(f"{fam_key} {block_n}/{warps}: {len(lines)} lines, shuffles {shuffles}, loop lines {loop}")


if __name__ == "__main__":
    main()
