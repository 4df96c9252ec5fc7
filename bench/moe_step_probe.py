"""Session 14 (moe25): where the MoE decode's gate/up spends its time beyond its load-only twin, bench-only
(the engine's kernels unchanged). Three probes:

--float-h: the default gate/up timed as the engine runs it (h quantized in the launch: with a tile of fewer
rows than h's block, each program stores float h, takes a ticket (acq_rel) and the block's last program reads
the block back and quantizes it) next to the same launch storing float h only (GemvConfig.fuse_quant False:
no quantization, no ticket) and its twin: the epilogue's share of the launch.

--narrow: moe's integer gate/up recompiled with x's words' pointer not specialized on 16 bytes
(do_not_specialize_on_alignment). In the Q8_0 words step (q8_0_words._step) x's 16-byte alignment makes
Triton's coalescing give the step's [rows, 8 blocks, 8 lanes] tile 4 lanes a thread (x one 128-bit load),
and the weight words (4-byte aligned: 34-byte blocks) follow as 4 separate 32-bit loads whose warp spans 2
rows x 8 blocks at 16-byte strides; narrow, every load is one word a thread (8 lanes x 4 blocks of one row
a warp load) for more load instructions (bench/moe_kernels_sass.py: the 2/1/2/e loop 169 -> 301 warp
instructions, LDG 26 -> 44). With no other flag the rest of the arguments go to moe_tiles_bench.py.

--ncu: each launch of the default layer (gate/up, down) and the twins run eagerly twice, for ncu's counters.

Usage: PYTHONPATH=.:bench python bench/moe_step_probe.py [--narrow] MOE_TILES_BENCH_ARGS...
       PYTHONPATH=.:bench python bench/moe_step_probe.py --float-h [--narrow] [--shapes 2048x768x8,...] [--type Q8_0]
       PYTHONPATH=.:bench python bench/moe_step_probe.py --ncu [--narrow] [--shapes 2048x768x8] [--type Q8_0]
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import triton

import gemv_tiles_bench
import kernels_bench as kb
import moe_tiles_bench as mtb
import moe_twin
from sparkd.engine.kernels import act_quant, moe


def narrow() -> None:
    """moe's integer gate/up kernel recompiled with xw_ptr's alignment unknown (moe._gate_up finds it by name)."""
    moe._igate_up_kernel = triton.jit(moe._igate_up_kernel.fn, do_not_specialize_on_alignment=["xw_ptr"])


def float_h(s: mtb.Shape, copy_bw: float, tag: str) -> list[dict]:
    """The default gate/up with h quantized (the engine's), with float h only, and its twin."""
    gu, dn = mtb.engine_tiles(s.sets[0], None, None)
    k = moe.decode_kernels()
    return [s.gate_up(f"{tag} {kb.tag(gu)} quantized h", gu, dn, k, copy_bw),
            s.gate_up(f"{tag} {kb.tag(gu)} float h", dataclasses.replace(gu, fuse_quant=False), dn, k, copy_bw),
            s.twin_gate_up(f"{kb.tag(gu)}", gu, dn, k, copy_bw)]


def ncu_run(s: mtb.Shape) -> None:
    gu, dn = mtb.engine_tiles(s.sets[0], None, None)
    k = moe.decode_kernels()
    p, rw, (D, F, A) = s.sets[0], s.w.contiguous(), s.shape
    qx = act_quant.quantize(s.x[None], p.gate_up.act_fmt)
    for _ in range(2):  # the first compiles
        h = moe._gate_up(p, s.x, rw, False, "silu", gu, None, "bench", qx, k)
        moe._down(p, h, rw, s.y, dn, None, None, k)
        moe_twin.gate_up(p, qx, torch.empty(A, F, dtype=torch.int32, device=mtb.DEVICE), gu)
        moe_twin.down(p, h, torch.empty(max(1, min(dn.split, A)), D, device=mtb.DEVICE), dn, s.y)
    torch.cuda.synchronize()
    print(f"ncu run {s.name} gate/up {gu} down {dn}", flush=True)


def main() -> None:
    args = sys.argv[1:]
    flags = {f for f in ("--narrow", "--float-h", "--ncu") if f in args}
    args = [a for a in args if a not in flags]
    if "--narrow" in flags:
        narrow()
    if not flags & {"--float-h", "--ncu"}:
        sys.argv = [sys.argv[0]] + args
        mtb.main()
        return
    opts = dict(zip(args[::2], args[1::2]))
    qtype = mtb.qtype_of(opts.get("--type", "Q8_0"))
    shapes = [tuple(int(v) for v in t.split("x")) for t in opts.get("--shapes", "2048x768x8").split(",")]
    copy_bw = kb.copy_bandwidth() if "--float-h" in flags else 0.0
    tag = "narrow" if "--narrow" in flags else "default"
    for shape in shapes:
        s = mtb.Shape(qtype, shape, reference="--float-h" in flags)
        if "--ncu" in flags:
            ncu_run(s)
        else:
            gemv_tiles_bench.print_rows(float_h(s, copy_bw, tag))
        del s
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
