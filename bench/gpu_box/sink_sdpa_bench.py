"""gpt-oss's prompt attention with sinks on CUDA: attend (the [Hkv, T, S] scores of one query head a group at a
time, the way before session 41) against attend_sdpa with the sinks as a key (attention.with_sink_key) through the
memory-efficient kernel alone (SDPA_BACKENDS narrowed to it: an input it cannot take raises, no silent fall to the
math kernel). Per shape: ms a call (CUDA events, median of 5 after a warm-up), the peak bytes beyond the inputs, and
the relative error of each against attend in float64 on the first and the last 256 queries' outputs.

A windowed shape runs attend_sdpa once a --blocks value (attention.WINDOW_BLOCK, session 42: its queries in blocks
over the keys their windows reach) and once whole ("sdpa-whole": the boolean [T, S] mask over every key, the way
before session 42).

Usage (GPU box): PYTHONPATH=. python3 bench/gpu_box/sink_sdpa_bench.py [--blocks 128,256,512] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from sparkd.engine.layers import attention
from sparkd.engine.layers.attention import attend, attend_sdpa

# (T queries, start, window) at gpt-oss-20b's heads (64 over 8 KV heads of 64): a whole prompt, a windowed layer, a
# chunk continuing the cache, a windowed layer's chunk after its ring's rows (ring_append: 127 of them)
SHAPES = [(2000, 0, 0), (8000, 0, 0), (2000, 0, 128), (8000, 0, 128), (2048, 6000, 0), (512, 127, 128)]
H, HKV, D = 64, 8, 64


def timed(fn) -> tuple[float, int, torch.Tensor]:
    """(median ms of 5 calls after one, the peak bytes beyond what was allocated before, the last result)."""
    out = fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size(), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--blocks", default="128,256,512", help="WINDOW_BLOCK values a windowed shape runs")
    args = ap.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    attention.SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION]
    default = attention.WINDOW_BLOCK
    rows = []
    for T, start, window in SHAPES:
        S = start + T
        g = torch.Generator(device="cuda").manual_seed(T + start)
        q = torch.randn(T, H, D, device="cuda", generator=g)
        k = torch.randn(S, HKV, D, device="cuda", generator=g).half()  # the cache's rows
        v = torch.randn(S, HKV, D, device="cuda", generator=g).half()
        sinks = 3 * torch.randn(H, device="cuda", generator=g)
        wide = [t.double() for t in (q, k, v, sinks)]
        want = torch.cat([attend(wide[0][:256], wide[1][:start + 256], wide[2][:start + 256], 0.125, start, window,
                                 wide[3]),
                          attend(wide[0][-256:], wide[1], wide[2], 0.125, S - 256, window, wide[3])])
        ways = [("attend", None), ("sdpa", attention.WINDOW_BLOCK)]
        if window:
            ways = [("attend", None), ("sdpa-whole", 1 << 30)] + [(f"sdpa-{b}", b) for b in blocks]
        for name, block in ways:
            attention.WINDOW_BLOCK = block or attention.WINDOW_BLOCK
            fn = (lambda: attend(q, k, v, 0.125, start, window, sinks)) if name == "attend" else \
                (lambda: attend_sdpa(q, k, v, 0.125, start, window, sinks=sinks))
            ms, peak, out = timed(fn)
            err = float((torch.cat([out[:256], out[-256:]]).double() - want).norm() / want.norm())
            rows.append(dict(T=T, start=start, window=window, way=name, ms=ms, peak_bytes=peak, rel_err=err))
            print(f"T {T:5d} start {start:5d} window {window:4d} {name:10s} {ms:8.2f} ms  peak {peak / 2**20:8.1f} MiB"
                  f"  rel_err {err:.1e}", flush=True)
        attention.WINDOW_BLOCK = default
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
