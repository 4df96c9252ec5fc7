"""The MoE decode kernels compiled offline for sm_90 (no GPU: the triton wheel carries ptxas and
cuobjdump): registers per thread, so one-warp programs per SM (at most 32 on Hopper), and the
largest loop's instruction mix, as bench/kernels_sass.py gives them for the GEMV.

Usage: PYTHONPATH=.:bench python bench/moe_kernels_sass.py --type Q8_0 --gate-up 4/1/2/g,2/1/2/e:-
       [--down 4/1/1/g/8,2/1/4/e/8:-] [--groups 8] [--twins]   (tiles as moe_tiles_bench.tile; :FLAGS the kernels,
       kernels_of) [--order]
Session 19 (moe43): --type Q4_K_TILED, the launches on pairx rows (moe.tiled_gate_up / tiled_down: TILED, the pairx
step); --order, the largest loop's loads and dp4a in issue order (LDGx14 IDP ...: loads after the first IDP wait
a second round trip).
Session 14 (moe25): "outside", the static instruction count outside that loop (the prologue and epilogue: the
gate/up's h quantization and its ticket); --twins, each tile's load-only twin (bench/moe_twin.py, GGUF rows; the
down's with its fold) compiled the same way. Session 19 (moe42): --pipe, the Q8_0 gate/up tiles as moe_pipe's
software-pipelined persistent kernel too (kind "pipe", a loop step the tile's unroll), at `--groups` groups a row
(session 20, moe47: with --order, its loop's order too; session 21, pipe48: --pipe-regs 0,112,128, under ptxas's
register caps; with --order, the loop's loads waited for inside the iteration against those in flight over the back
edge and the dp4a each of those is in flight over, from the write and wait scoreboards of the SASS control words).
Session 20 (moe46): a Q8_0 down tile's flag a (2/1/2/e/2:wpvVfa), its loop with the next step's words loaded ahead
(moe_down_ahead; Kernels.down_ahead), at `--groups` groups a row. Session 21 (moe48): flag o (2/1/2/e/2:wpvVfao), two
ranges folded by matmul.fold_pair (Kernels.down_pair_fold): "outside" 169 -> 137 at 2/1/2/e/2:wpvVfa.
Session 21 (q4k48): Q4_K_TILED launches on 16-byte offsets, as the engine's pairx tables are (before: 4 bytes, 4 scalar
qs loads a thread); a gate/up tile's flag n (4/1/2/e:wpvVfdn), q4_k_pair.gate_up's constant-trip loop (the default at
widths 2048-6143: moe_tiles.pairx_way) at `--dim` model width.
"""

from __future__ import annotations

import argparse
import re

import triton
from gguf.constants import GGMLQuantizationType as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.tools.disasm import get_sass

import moe_twin
from kernels_sass import WATCH, registers
from moe_tiles_bench import kernels_of, tile
from sparkd.engine.kernels import act_quant, dispatch, matmul, moe, moe_pipe, moe_tiles, pdl, q4_k_tiled

I32, I64, F32, U8 = "*i32", "*i64", "*fp32", "*u8"
SCALARS = {"F": "i32", "D": "i32", "n": "i32", "row_bytes": "i32", "b_ptr": F32, "BSTRIDE": "i32",  # (biases: BIAS off)
           "BOFF": "i32"}
# 16-byte aligned as the launches specialize them (torch allocations, widths multiples of 16)
ALIGNED = ("gate_ptr", "up_ptr", "down_ptr", "aux_ptr", "xw_ptr", "xd_ptr", "xs_ptr", "hw_ptr", "hd_ptr", "hs_ptr",
           "h_ptr", "hf_ptr", "y_ptr", "part_ptr", "F", "D", "row_bytes")
DOWN = dict(down_ptr=U8, aux_ptr=I32, down_off=I64, ids_ptr=I64, hw_ptr=I32, hd_ptr=F32, hs_ptr=I32, rw_ptr=F32,
            y_ptr=F32, part_ptr=F32, res_ptr=F32, tickets_ptr=I32)
GATE_UP = dict(gate_ptr=U8, up_ptr=U8, aux_ptr=I32, gate_off=I64, up_off=I64, ids_ptr=I64, xw_ptr=I32, xd_ptr=F32,
               xs_ptr=I32, rw_ptr=F32, h_ptr=I32, hd_ptr=F32, hs_ptr=I32, hf_ptr=F32, tickets_ptr=I32)
TWIN = dict(gate_ptr=U8, up_ptr=U8, gate_off=I64, up_off=I64, xw_ptr=I32, out_ptr=I32, down_ptr=U8, down_off=I64,
            hw_ptr=I32, y_ptr=F32, tickets_ptr=I32)
SCALARS.update(row_words="i32", n_groups="i32", n_tiles="i32")


def cubin(kern, ptrs: dict, consts: dict, num_warps: int, fp_fusion: bool, aligned: tuple = ALIGNED,
          maxnreg: int = 0) -> bytes:
    names = kern.arg_names
    # a constexpr left out takes its default, as at a launch (moe._gate_up_out's BIAS, session 24)
    defaults = {p.name: p.default for p in kern.params if p.is_constexpr and p.has_default}
    consts = pdl.compile_args(kern, defaults | consts)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, SCALARS.get(n)) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names and n not in consts}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return compile(src, target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": num_warps, "enable_fp_fusion": fp_fusion,
                            **({"maxnreg": maxnreg} if maxnreg else {})}).asm["cubin"]


def instructions(text: str) -> int:
    """The SASS text's instruction count."""
    return sum(1 for line in text.splitlines() if re.search(r"\t[A-Z@]", line))


def largest_loop(text: str, lines_too: bool = False) -> list[str]:
    """Opcodes of the longest backward-branching loop body (the group loop of one projection); lines_too: its
    lines (get_sass's "wait:read:write:yield:stall" control, a tab, the instruction)."""
    lines, best, best_lines = text.splitlines(), [], []
    for back, line in enumerate(lines):
        jump = re.search(r"\bBRA (?:`\()?\.?(L\w+)", line)
        starts = [i for i, lab in enumerate(lines[:back]) if jump and lab.lstrip(".").startswith(jump.group(1) + ":")]
        if starts:
            body = [op for op in lines[starts[0] + 1:back + 1] if op.strip() and "\t" in op]
            ops = [re.sub(r"^@!?U?P\w+\s+", "", op.split("\t", 1)[-1]).split()[0].split(".")[0] for op in body]
            best, best_lines = (ops, body) if len(ops) > len(best) else (best, best_lines)
    return best_lines if lines_too else best


def scoreboards(body: list[str]) -> str:
    """Session 21 (pipe48): of the loop's plain loads (LDG.E, .64, .128: not the ticket's), how many the same
    iteration waits for before its last IDP (a wait on their write scoreboard: this step's dots need them) and how
    many stay in flight over the back edge, and over how many IDP of the loop each of those is in flight, from its
    issue to the first wait on its scoreboard (the next iteration's included): the prefetch's cover of the dots."""
    ctrl = [line.split("\t", 1)[0].split(":") for line in body]  # wait mask, read, write scoreboard, yield, stall
    ops = [line.split("\t", 1)[-1] for line in body]
    n, idps = len(ops), sum("IDP" in op for op in ops)
    last_idp = max((i for i, op in enumerate(ops) if "IDP" in op), default=-1)
    waited, wide_waited, covered, wide_flight = 0, 0, [], 0
    for i, op in enumerate(ops):
        if not re.search(r"\bLDG\.E(\.128|\.64)?\s", op) or ctrl[i][2] == "-":
            continue
        sb, wide = int(ctrl[i][2]), ".128" in op
        first = next((j for j in range(i + 1, 2 * n) if ctrl[j % n][0] != "--" and int(ctrl[j % n][0]) >> sb & 1),
                     2 * n)
        if first <= last_idp:
            waited, wide_waited = waited + 1, wide_waited + wide
        else:
            covered.append(sum("IDP" in ops[j % n] for j in range(i + 1, first)))
            wide_flight += wide
    mean = sum(covered) / max(1, len(covered))
    return (f"loads waited in the iteration {waited} ({wide_waited} 128-bit), in flight over the back edge "
            f"{len(covered)} ({wide_flight} 128-bit) over {mean:.1f} of the loop's {idps} IDP each "
            f"(min {min(covered, default=0)})")


def order(ops: list[str]) -> str:
    """The loop's LDG, IDP and SHFL in issue order, runs counted (LDGx14 IDP LDG IDPx6 ...)."""
    runs: list[list] = []
    for op in (o for o in ops if o in ("LDG", "IDP", "SHFL")):
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    return " ".join(op if n == 1 else f"{op}x{n}" for op, n in runs)


def report(qtype: T, kind: str, text: str, groups: int = 8, show_order: bool = False, dim: int = 4096,
           bias: bool = False) -> str:
    cfg, fam, k = tile(text), dispatch.family(qtype), kernels_of(text)
    split = cfg.split or 1
    tiled = fam.row_tile > 1  # pairx rows (moe.tiled_gate_up / tiled_down), MXFP4's tiles: the expert's matrix
    # the engine's row-tile tables are on 16 bytes too (moe.prepare's *_vec; session 21: before, ALIGN 1 here)
    vec = moe._use_vec(k.q4k_vec if kind == "gate/up" else k.q4k_vec_down, qtype == T.Q4_K or tiled)
    common = dict(UNROLL=cfg.unroll, EW=cfg.elementwise, EMU=False, STAGES=matmul.stages_arg(cfg), IDS=True,
                  BIAS=bias,  # gpt-oss's expert biases read through the ids (session 25)
                  **moe._int_args(fam, k.words and qtype == T.Q8_0, vec, k.full))  # shapes in range (moe._full)
    if kind == "gate/up":  # h quantized by the last program of each block, as the engine runs it
        consts = dict(BLOCK_N=cfg.block_n, ACT=0, ACT_A=0.0, ACT_B=0.0, RW=False, H8K=qtype != T.Q8_0,
                      HBLOCK=act_quant.BLOCKS[fam.act_fmt], PAIR=k.pair, TILED=tiled,
                      DOWN_AT_START=True, **common)
        way = moe_tiles.pairx_way(k, dim) if qtype == q4_k_tiled.TILED else "loop"  # moe._pairx_gate_up at width dim
        consts.update(NG=dim // 256 if way == "steps" else 0)
        binary = cubin(moe._igate_up_kernel, GATE_UP, consts, cfg.num_warps, False)
    else:  # the residual added and the ranges folded in the launch
        pairx = qtype == q4_k_tiled.TILED
        ahead = moe._pairx_ahead_ok(bool(k.pairx_down_ahead), k, cfg, 4096, groups * 256) if pairx else \
            moe._ahead_ok(bool(k.down_ahead), k, cfg, k.words and qtype == T.Q8_0, 4096, groups * 256)
        consts = dict(RES=True, FOLD=split > 1, BLOCK_N=cfg.block_n, SPLIT=split, ATOMIC=False,
                      XBLOCK=act_quant.BLOCKS[fam.act_fmt], NG=groups if ahead or qtype.name in k.down_full else 0,
                      TILED=tiled, AHEAD=ahead,
                      PAIR_FOLD=split == 2 and k.down_pair_fold, **common)
        ptrs = DOWN | (dict(tickets_ptr=I64) if consts["PAIR_FOLD"] else {})  # fold_pair's int64 slots
        binary = cubin(moe._idown_kernel, ptrs, consts, cfg.num_warps, True)
    return line(qtype.name, kind, text, binary, cfg.num_warps, show_order)


def twin(qtype: T, kind: str, text: str, groups: int = 8) -> str:
    """The tile's load-only twin (moe_twin, GGUF rows), as moe_twin.gate_up / down launch it: a row's words
    on 16 bytes where its groups a row are a multiple of 4 (the gate/up's model widths from 1024; the down's
    `groups`)."""
    cfg, (gw, gwp) = tile(text), moe_twin._group_words(dispatch.FAMILIES[qtype])
    common = dict(GW=gw, GWP=gwp, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, UP=triton.next_power_of_2(cfg.unroll))
    aligned = ALIGNED + ("out_ptr",) + (("row_words",) if kind == "gate/up" or groups % 4 == 0 else ())
    if kind == "gate/up":
        binary = cubin(moe_twin._twin_gate_up_kernel, TWIN, dict(VEC=False, PERSIST=0, **common), cfg.num_warps, True,
                       aligned)
    else:
        binary = cubin(moe_twin._twin_down_kernel, TWIN, dict(SPLIT=cfg.split or 1, FOLD=(cfg.split or 1) > 1,
                                                             **common), cfg.num_warps, True, aligned)
    return line(qtype.name, kind + "~", text, binary, cfg.num_warps)


def pipe(text: str, groups: int, show_order: bool = False, regs: int = 0) -> str:
    """The Q8_0 gate/up tile as moe_pipe.gate_up_kernel launches it (h quantized by a block's last tile); regs:
    ptxas's register cap (0: none)."""
    cfg, fam = tile(text), dispatch.FAMILIES[T.Q8_0]
    consts = dict(IDS=True, OFF=moe._aligned_offset, OUT=moe._gate_up_out, SUMS=moe.row_sums, G=groups, UNROLL=cfg.unroll,
                  BLOCK_N=cfg.block_n, EMU=False, ACT=0, ACT_A=0.0, ACT_B=0.0, RW=False,
                  HBLOCK=act_quant.BLOCKS[fam.act_fmt], H8K=False,
                  DOWN_AT_START=True, **{k: v for k, v in matmul.int_args(fam).items() if k != "IDOT"})
    binary = cubin(moe_pipe.gate_up_kernel, GATE_UP, consts, cfg.num_warps, False, maxnreg=regs)
    return line("Q8_0", "pipe" + (f"r{regs}" if regs else ""), text, binary, cfg.num_warps, show_order)


def line(name: str, kind: str, text: str, binary: bytes, num_warps: int, show_order: bool = False) -> str:
    sass = get_sass(binary)
    regs, ops = registers(binary), largest_loop(sass)
    programs = min(32, 65536 // (regs * 32 * num_warps))  # Hopper: 64K registers, 32 blocks per SM
    counts = " ".join(f"{op}={ops.count(op)}" for op in WATCH if ops.count(op))
    return (f"{name} {kind:7} {text:12} {regs:3d} registers, {programs:2d} programs/SM, loop {len(ops)} warp-instr, "
            f"outside {instructions(sass) - len(ops)}  {counts}" +
            (f"\n  order: {order(ops)}\n  {scoreboards(largest_loop(sass, True))}" if show_order else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("--gate-up", default="", help="gate/up tiles rows/warps/unroll/e|g, comma-separated")
    ap.add_argument("--down", default="", help="down tiles rows/warps/unroll/e|g/split, comma-separated")
    ap.add_argument("--groups", type=int, default=8, help="the down's groups a row (F / 256; Kernels.down_full)")
    ap.add_argument("--dim", type=int, default=4096, help="the model width (the pairx gate/up's groups: flag n)")
    ap.add_argument("--twins", action="store_true", help="each tile's load-only twin too (kind~; GGUF types)")
    ap.add_argument("--pipe", action="store_true", help="the Q8_0 gate/up tiles as moe_pipe's kernel too")
    ap.add_argument("--order", action="store_true", help="the loop's loads and dp4a in issue order")
    ap.add_argument("--pipe-regs", default="0", help="with --pipe: ptxas's register caps, comma-separated (0: none)")
    ap.add_argument("--bias", action="store_true", help="with gpt-oss's expert biases (BIAS) on")
    args = ap.parse_args()
    for text in filter(None, args.gate_up.split(",") if args.pipe else ()):
        for regs in args.pipe_regs.split(","):
            print(pipe(text, args.groups, args.order, int(regs)), flush=True)
    layouts = {layout.name: layout for layout in dispatch.LAYOUTS}  # Q4_K_TILED, MXFP4_TILED, ...
    qtype = layouts[args.type] if args.type in layouts else T[args.type]
    for kind, tiles in (("gate/up", args.gate_up), ("down", args.down)):
        for text in filter(None, tiles.split(",")):
            print(report(qtype, kind, text, args.groups, args.order, args.dim, args.bias), flush=True)
            if args.twins and args.type not in layouts:
                print(twin(T[args.type], kind, text, args.groups), flush=True)


if __name__ == "__main__":
    main()
