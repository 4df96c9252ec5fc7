"""Session 48: dequantize_experts alone at the slab ranges' shapes (gate | up into one [n, 2F, D] bf16 buffer, down
into [n, D, F]), each kernel way side by side in one process, against the same buffer's fill (writes only):
words (the word kernel where the layout has one), tile (the tile kernel), tile-round (the tile kernel with session 47's
rounding by hand, the code before); words@ROWS/WARPS: dequantize's WORDS_ROWS, WORDS_WARPS. --once: one call of each (for ncu).
Usage: PYTHONPATH=.:bench python3 deq_probe.py --models qwen3 --ways words,tile,tile-round"""
import argparse

import torch
from kernels_bench import events_seconds
from moe_slab_bench import MODELS, matrices

from sparkd.engine.kernels import dequantize as dq, dispatch
from sparkd.engine.kernels.matmul import aux_arg


def tile_round(weight, offsets, qtype, shape, out):
    """dequantize_experts as session 47 ran it: the tile kernel, the bf16 rounding by hand."""
    fam, (rows, cols) = dispatch.family(qtype), shape
    grid = (-(-rows // dq.BLOCK_N), -(-cols // 256), offsets.numel())
    dq._dequantize_kernel[grid](weight, aux_arg(fam, cols, weight.device), out, offsets, out, rows, rows, cols,
                                fam.row_bytes(cols), out.stride(0), DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
                                BLOCK_N=dq.BLOCK_N, GATHER=False, EXPERTS=True, ROUND=True, num_warps=dq.WARPS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3,deepseek-v3,gpt-oss")
    ap.add_argument("--experts", type=int, default=0, help="experts a table (0: the model's, at most 2 GiB of bf16)")
    ap.add_argument("--ways", default="words,tile,tile-round")
    ap.add_argument("--once", action="store_true")
    a = ap.parse_args()
    for name in a.models.split(","):
        D, F, n, _, gu_layout, d_layout, _, _ = MODELS[name]
        n = a.experts or min(n, (2 << 30) // (3 * F * D * 2))
        gate, goff, gtype = matrices(gu_layout, n, F, D)
        down, doff, dtype_ = matrices(d_layout, n, D, F)
        goff, doff = goff.cuda(), doff.cuda()
        gu = torch.empty(n, 2 * F, D, dtype=torch.bfloat16, device="cuda")
        dn = torch.empty(n, D, F, dtype=torch.bfloat16, device="cuda")
        ref = {}
        for way in a.ways.split(","):
            kind, _, launch = way.partition("@")
            deq = tile_round if kind == "tile-round" else dq.dequantize_experts
            dq.WORDS = kind == "words"
            dq.WORDS_ROWS, dq.WORDS_WARPS = (int(v) for v in launch.split("/")) if launch else (16, 4)
            jobs = {"gate+up": lambda: (deq(gate, goff, gtype, (F, D), gu[:, :F]),
                                        deq(gate, goff, gtype, (F, D), gu[:, F:])),
                    "down": lambda: deq(down, doff, dtype_, (D, F), dn)}
            for what, fn in jobs.items():
                fn()
                out = gu if what == "gate+up" else dn
                same = ref.setdefault(what, out.clone()).equal(out)
                if a.once:
                    continue
                read = gate.numel() * 2 if what == "gate+up" else down.numel()
                s = events_seconds(fn, 20)
                fill = events_seconds(lambda: out.fill_(1.0), 20)
                gbs = (read + out.numel() * 2) / s / 1e9
                print(f"{name:12s} {what:8s} {n:3d} experts {way:10s}: {s * 1e3:7.3f} ms ({gbs:5.0f} GB/s read+write) "
                      f"fill {fill * 1e3:6.3f} ms ({out.numel() * 2 / fill / 1e9:5.0f} GB/s) deq/fill {s / fill:4.2f} "
                      f"bits as the first way's: {same}", flush=True)
            dq.WORDS, dq.WORDS_ROWS, dq.WORDS_WARPS = True, 16, 4
        del gate, down, gu, dn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
