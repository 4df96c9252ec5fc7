"""Compile decode-step kernels for sm_90 offline (no GPU needed) with PDL on and off and print, per
kernel and mode, where the PTX's griddepcontrol instructions sit against its first global memory
access and its first return (kernels/pdl.py's rule: the wait before any read, write or end), and its
first L2 prefetch (pdl.prefetch_l2, the igemv rows with a weight prefetch: no access): the
interpreter runs none of the PTX, so a compiler that moved a load above the wait shows up here. Run
without TRITON_INTERPRET (the kernels must be JIT functions); test_pdl.py runs it. A line per kernel
and mode (PTX line numbers, - for none):
    <kernel> pdl=<0|1> launch=<n|-> wait=<n|-> first_access=<n> first_ret=<n> prefetch=<n|-> first_write=<n>"""

import re

from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from sparkd.engine.kernels import (act_quant, decode_attention, dispatch, grouped_attention, matmul, moe, q4_k_tiled,
                                   rms_norm, rope_attention, rope_kv, router_topk)
from sparkd.engine.kernels.pdl import PREFETCHES

ACCESS = re.compile(r"\b(ld|st|atom|red)\.global\b|\bcp\.async(?!\.bulk\.prefetch)")
WRITE = re.compile(r"\b(st|atom|red)\.global\b")
PREFETCH = re.compile(r"\bprefetch\.global\.L2\b|\bcp\.async\.bulk\.prefetch\.L2\b")
TYPES = {"w_ptr": "*u8", "gate_ptr": "*u8", "up_ptr": "*u8", "gate_off": "*i64", "up_off": "*i64", "h_ptr": "*i32",
         "hs_ptr": "*i32", "xw_ptr": "*i32", "xs_ptr": "*i32", "q_ptr": "*i32", "s_ptr": "*i32", "tickets_ptr": "*i32",
         "ticket_ptr": "*i32", "ids_ptr": "*i64", "pos_ptr": "*i64", "down_ptr": "*u8", "down_off": "*i64",
         "hw_ptr": "*i32"}


def ptx(kern, consts: dict, num_warps: int, pdl: bool) -> str:
    # a constexpr left out takes its default (else it would compile as a runtime argument: q4k48's NG did)
    defaults = {p.name: p.default for p in kern.params if p.is_constexpr and p.has_default}
    consts = defaults | dict(consts, PDL=pdl)
    sig = {n: "constexpr" if n in consts else TYPES.get(n, "*fp32" if n.endswith("_ptr") else "i32")
           for n in kern.arg_names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()})
    opts = {"num_warps": num_warps, "launch_pdl": pdl}
    return compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def where(text: str) -> str:
    lines = text.splitlines()

    def first(pred) -> str:
        return next((str(i) for i, line in enumerate(lines) if pred(line)), "-")
    return (f"launch={first(lambda s: 'griddepcontrol.launch_dependents' in s)} "
            f"wait={first(lambda s: 'griddepcontrol.wait' in s)} first_access={first(ACCESS.search)} "
            f"first_ret={first(lambda s: s.strip().startswith(('ret', '@')) and 'ret;' in s)} "
            f"prefetch={first(PREFETCH.search)} first_write={first(WRITE.search)}")


KERNELS = {  # name: (kernel, its constexprs, warps) at decode-step settings
    "igemv": (matmul._igemv_kernel, dict(**matmul.int_args(dispatch.FAMILIES[T.Q8_0]), BLOCK_N=2, EW=True, EMU=False,
                                         UNROLL=2, SPLIT=4, ATOMIC=False, KFOLD=True, STAGES=None, PREFETCH=0), 1),
    **{f"igemv_{mode}": (matmul._igemv_kernel, dict(**matmul.int_args(q4_k_tiled.FAMILY), BLOCK_N=4,
                                                   EW=True, EMU=False, UNROLL=2, SPLIT=4, ATOMIC=False, KFOLD=True,
                                                   STAGES=None, PREFETCH=PREFETCHES.index(mode)), 1)
       for mode in ("lines", "bulk")},
    # one row: the JIT makes an int argument that is 1 a constant (a GEMV of one row), no tensor methods on it
    "igemv_bulk_one_row": (matmul._igemv_kernel, dict(**matmul.int_args(q4_k_tiled.FAMILY), N=1, BLOCK_N=4, EW=True,
                                                      EMU=False, UNROLL=2, SPLIT=4, ATOMIC=False, KFOLD=True,
                                                      STAGES=None, PREFETCH=PREFETCHES.index("bulk")), 1),
    # session 12 (q4k20): the split-K ranges on a program's warps (GemvConfig.warps_k), with the bulk prefetch
    "igemv_kstep_bulk": (matmul._kgemv_kernel, dict(KSTEP=q4_k_tiled.FAMILIES["pairx"].kstep, KW=4, UNROLL=2, EMU=False,
                                                    PREFETCH=PREFETCHES.index("bulk")), 4),
    "rms_norm_quant": (rms_norm._rms_norm_rows, dict(HAS_RES=True, BLOCK=2048, QBLOCK=32, K8=False, PARTS=0), 8),
    "quant": (act_quant._quant_kernel, dict(BLOCK=32, PER=8, K8=False), 1),
    "rope_kv": (rope_kv._rope_kv, dict(NEOX=True, NORM=True, HAS_V=True, BLOCK_D=128, BLOCK_DV=128), 1),
    # session 28: rope_kv and the decode attention in one launch
    "rope_attention": (rope_attention._rope_attention, dict(GROUP=8, NEOX=True, NORM=True, HAS_SINKS=False, KEYS=32,
                                                            BLOCK_DK=128, BLOCK_DV=128, FOLD=32), 4),
    "decode_attention": (decode_attention._decode_attention, dict(GROUP=8, HAS_SINKS=False, BLOCK_S=64, BLOCK_DK=128,
                                                                  BLOCK_DV=128, RANGE=0, FOLD=0), 4),
    # session 15 (step26): the keys in ranges, the head's last program adding them (a ticket); session 16 (attn28):
    # the ranges past the position return at once, the fold a block of ranges at a time
    "decode_attention_split": (decode_attention._decode_attention, dict(GROUP=8, HAS_SINKS=True, BLOCK_S=32,
                                                                        BLOCK_DK=128, BLOCK_DV=128, RANGE=64, FOLD=32), 4),
    # session 29: a program per KV head's query heads and range of keys ("grouped", the default past rope_attention)
    "grouped_attention": (grouped_attention._grouped_attention, dict(
        GROUP=8, HEAD_BLOCKS=1, HAS_SINKS=True, BLOCK_H=16, BLOCK_S=64, BLOCK_DK=128, BLOCK_DV=128, N_R=32,
        HALF=False, SHARED=False, BLOCK_DT=16), 4),
    "grouped_attention_fold": (grouped_attention._grouped_attention_fold, dict(
        GROUP=8, HEAD_BLOCKS=1, BLOCK_H=16, BLOCK_S=64, BLOCK_DV=128, N_R=32, FOLD_DV=128), 4),
    # session 13 (moe23): the MoE gate/up that lets the down launch only after its loop (Kernels.down_at_start False)
    "igate_up_late": (moe._igate_up_kernel, dict(**moe._int_args(dispatch.FAMILIES[T.Q8_0], True, False, True),
                                                BLOCK_N=2, UNROLL=2, EW=True, EMU=False, ACT=0, ACT_A=0.0, ACT_B=0.0,
                                                RW=True, STAGES=None,
                                                HBLOCK=32, H8K=False, PAIR=True, TILED=False, IDS=True,
                                                DOWN_AT_START=False), 1),
    # session 48: the MoE down's first weight words before its wait (pdl.py's exception), after a gate/up that lets it
    # launch only after its own wait
    "igate_up_early": (moe._igate_up_kernel, dict(**moe._int_args(q4_k_tiled.FAMILY, False, True, True), BLOCK_N=4,
                                                 UNROLL=2, EW=True, EMU=False, ACT=0, ACT_A=0.0, ACT_B=0.0, RW=False,
                                                 STAGES=None, HBLOCK=256, H8K=True, PAIR=True, TILED=True, IDS=True,
                                                 NG=16, DOWN_EARLY=True), 1),
    "idown_early": (moe._idown_kernel, dict(**moe._int_args(q4_k_tiled.FAMILY, False, True, True), RES=True, FOLD=True,
                                           BLOCK_N=4, SPLIT=4, ATOMIC=False, XBLOCK=256, NG=6, TILED=True, AHEAD=True,
                                           PAIR_FOLD=False, UNROLL=2, EW=True, EMU=False, STAGES=None, IDS=True,
                                           EARLY=True), 1),
    "gate_topk": (router_topk._gate_topk, dict(GATING=0, HAS_BIAS=False, NORM=True, SCALE=False, TOP_K=8, BLOCK_E=128,
                                               BLOCK_K=8, ROWS=4, COLS=256, SPLIT=8), 1),
}


def main() -> None:
    for name, (kern, consts, warps) in KERNELS.items():
        for pdl in (False, True):
            print(f"{name} pdl={int(pdl)} {where(ptx(kern, consts, warps, pdl))}", flush=True)


if __name__ == "__main__":
    main()
