"""Compile the split-K GEMVs with the in-launch fold (fold_part) for sm_90 offline (the triton
wheel carries ptxas; no GPU needed) and print the SASS atomics per kernel: the interpreter runs
none of the PTX, so this is where a fold that the GPU compiler refuses shows up. Run without
TRITON_INTERPRET (the kernels must be JIT functions); test_split_fold.py runs it."""

from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import dispatch, matmul, pdl

PTRS = {"w_ptr": "*u8", "xw_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*i32", "aux_ptr": "*fp32", "x_ptr": "*fp32",
        "y_ptr": "*fp32", "part_ptr": "*fp32", "tickets_ptr": "*i32", "N": "i32", "K": "i32", "row_bytes": "i32"}


def atomics(kern, consts: dict, num_warps: int) -> int:
    consts = pdl.compile_args(kern, consts)
    sig = {n: "constexpr" if n in consts else PTRS[n] for n in kern.arg_names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()})
    cubin = compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["cubin"]
    return sum("ATOMG" in line for line in get_sass(cubin).splitlines())


def main() -> None:
    common = dict(UNROLL=1, SPLIT=4, ATOMIC=False, KFOLD=True, STAGES=None)
    q8 = dispatch.FAMILIES[T.Q8_0]
    for cfg in (matmul.GEMV_TILES["Q8_0"], matmul.GEMV_TILES["Q4_K"]):
        n = atomics(matmul._igemv_kernel, dict(**matmul.int_args(q8), BLOCK_N=cfg.block_n, EW=cfg.elementwise,
                                                 EMU=False, **common), cfg.num_warps)
        print(f"igemv block_n={cfg.block_n} atomics={n}")
    n = atomics(matmul._gemv_kernel, dict(**matmul.family_args(dispatch.FAMILIES[T.Q6_K]), BLOCK_N=4, EW=True,
                                          **common), 1)
    print(f"gemv Q6_K atomics={n}")


if __name__ == "__main__":
    main()
