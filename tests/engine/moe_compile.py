"""Compile the MoE decode and router kernels' last-program paths for sm_90 offline (the triton
wheel carries ptxas; no GPU needed) and print each kernel's SASS atomics: the interpreter runs
none of the PTX. Run without TRITON_INTERPRET; test_moe_decode_fusion.py runs it."""

from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

from sparkd.engine.kernels import act_quant, dispatch, moe, moe_tiles, pdl, router_topk

I32, I64, F32, U8 = "*i32", "*i64", "*fp32", "*u8"
SCALARS = {"F": "i32", "D": "i32", "n": "i32", "E": "i32", "row_bytes": "i32", "scale": "fp32", "min_sum": "fp32",
           "b_ptr": F32, "BSTRIDE": "i32", "BOFF": "i32"}  # (the expert biases, unread where BIAS is off)


def atomics(kern, ptrs: dict, consts: dict, num_warps: int, fp_fusion: bool = True) -> int:
    """The SASS atomics of kern compiled with consts; a constexpr left out takes its default (a switch added since,
    off by default, compiles its old path here: sessions 20 and 21 broke this script by adding one)."""
    defaults = {p.name: p.default for p in kern.params if p.is_constexpr and p.has_default}
    consts = pdl.compile_args(kern, defaults | consts)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, SCALARS.get(n)) for n in kern.arg_names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()})
    cubin = compile(src, target=GPUTarget("cuda", 90, 32),
                    options={"num_warps": num_warps, "enable_fp_fusion": fp_fusion}).asm["cubin"]
    return sum("ATOMG" in line for line in get_sass(cubin).splitlines())


def main() -> None:
    down = dict(down_ptr=U8, aux_ptr=I32, down_off=I64, ids_ptr=I64, hw_ptr=I32, hd_ptr=F32, hs_ptr=I32, rw_ptr=F32,
                y_ptr=F32, part_ptr=F32, res_ptr=F32, tickets_ptr=I32)
    gate_up = dict(gate_ptr=U8, up_ptr=U8, aux_ptr=I32, gate_off=I64, up_off=I64, ids_ptr=I64, xw_ptr=I32, xd_ptr=F32,
                   xs_ptr=I32, rw_ptr=F32, h_ptr=I32, hd_ptr=F32, hs_ptr=I32, hf_ptr=F32, tickets_ptr=I32)
    for qtype, (gu_cfg, d_cfg) in moe_tiles.DECODE_TILES.items():
        if qtype not in T.__members__:  # a layout packed at load (Q4_K_TILED): Q4_K's paths with TILED, the same atomics
            continue
        fam = dispatch.FAMILIES[T[qtype]]
        # session 6's kernels: Q8_0 weights as words, Q4_K headers as vectors, gate and up in one loop
        tile = dict(UNROLL=1, EW=False, EMU=False, STAGES=None, IDS=True,
                    **moe._int_args(fam, qtype == "Q8_0", qtype == "Q4_K"))
        large = ([d_cfg] + [t[2] for t in moe_tiles.WIDTH_TIERS.get(qtype, []) if t[2]])[-1]  # the widest models'
        for res, cfg in ((False, d_cfg), (True, d_cfg), (True, large)):
            n = atomics(moe._idown_kernel, down, dict(RES=res, FOLD=True, BLOCK_N=cfg.block_n, SPLIT=cfg.split,
                                                      ATOMIC=False, XBLOCK=act_quant.BLOCKS[fam.act_fmt], NG=0, TILED=False,
                                                      AHEAD=False, PAIR_FOLD=False, **tile),
                        cfg.num_warps)
            print(f"idown {qtype} split={cfg.split} residual={res} atomics={n}")
        if qtype == "Q8_0":  # session 20's down with the loads ahead (moe_down_ahead: 2048-wide models, 768 a row)
            cfg = moe_tiles.Q8_0_DOWN_AHEAD
            ahead = dict(tile, UNROLL=cfg.unroll, EW=True, **moe._int_args(fam, True, False, full=True))
            n = atomics(moe._idown_kernel, down, dict(RES=True, FOLD=True, BLOCK_N=cfg.block_n, SPLIT=cfg.split,
                                                      ATOMIC=False, XBLOCK=act_quant.BLOCKS[fam.act_fmt], NG=768 // 256,
                                                      TILED=False, AHEAD=True, PAIR_FOLD=False, **ahead),
                        cfg.num_warps)
            print(f"idown {qtype} ahead split={cfg.split} residual=True atomics={n}")
            # session 21's pair fold (matmul.fold_pair: the exchange is its one atomic) at the 4096 tile, loads ahead
            cfg = moe_tiles.Q8_0_FEW_RANGES
            n = atomics(moe._idown_kernel, down | dict(tickets_ptr=I64),
                        dict(RES=True, FOLD=True, BLOCK_N=cfg.block_n, SPLIT=cfg.split, ATOMIC=False,
                             XBLOCK=act_quant.BLOCKS[fam.act_fmt], NG=1536 // 256, TILED=False, AHEAD=True,
                             PAIR_FOLD=True, **dict(ahead, UNROLL=cfg.unroll)), cfg.num_warps)
            print(f"idown {qtype} ahead pair fold split={cfg.split} residual=True atomics={n}")
        n = atomics(moe._igate_up_kernel, gate_up, dict(BLOCK_N=gu_cfg.block_n, ACT=0, ACT_A=0.0, ACT_B=0.0, RW=False,
                                                        H8K=qtype != "Q8_0",
                                                        HBLOCK=act_quant.BLOCKS[fam.act_fmt], PAIR=True, TILED=False,
                                                        DOWN_AT_START=True, **tile),
                    gu_cfg.num_warps, fp_fusion=False)
        print(f"igate_up {qtype} late-quant atomics={n}")
    gate = dict(gate_ptr=F32, x_ptr=F32, part_ptr=F32, ticket_ptr=I32, bias_ptr=F32, w_ptr=F32, ids_ptr=I64)
    n = atomics(router_topk._gate_topk, gate, dict(GATING=0, HAS_BIAS=False, NORM=True, SCALE=False, TOP_K=8,
                                                   BLOCK_E=128, BLOCK_K=8, ROWS=4, COLS=256, SPLIT=8), 1)
    print(f"gate_topk atomics={n}")


if __name__ == "__main__":
    main()
