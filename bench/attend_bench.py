"""attention.attend's time and peak memory at decode and prompt-chunk shapes, one shape a fresh process (peak RSS only
grows). Run it with PYTHONPATH at two trees to compare them (docs/performance.md, session 38: GQA without the keys
repeated to each query head). CPU by default; --device cuda reports torch.cuda.max_memory_allocated instead of RSS
and times attend_sdpa too where a shape has no sinks.

Usage: PYTHONPATH=. python3 bench/attend_bench.py [--device cpu] [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

# (T queries, S keys, Hkv, group, D, sinks)
SHAPES = [(1, 400_000, 8, 8, 64, False), (1, 4096, 8, 8, 64, False), (1, 32768, 8, 8, 64, False),
          (16, 4096, 8, 8, 64, False), (256, 2048, 4, 8, 128, False), (256, 2048, 8, 8, 64, True)]


def one(shape: tuple, device: str, sdpa: bool) -> dict:
    from sparkd.engine.layers.attention import attend, attend_sdpa

    T, S, Hkv, group, D, with_sinks = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, D, generator=g).to(device) for n, h in ((T, Hkv * group), (S, Hkv), (S, Hkv)))
    sinks = torch.randn(Hkv * group, generator=g).to(device) if with_sinks else None
    run = ((lambda: attend_sdpa(q, k, v, 0.125, S - T)) if sdpa
           else (lambda: attend(q, k, v, 0.125, S - T, sinks=sinks)))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    sync()
    peak = (torch.cuda.max_memory_allocated() - before if device == "cuda"
            else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    best = float("inf")
    for _ in range(3 if S > 100_000 else 7):
        t = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - t)
    return dict(T=T, S=S, Hkv=Hkv, group=group, D=D, sinks=with_sinks, sdpa=sdpa, peak_bytes=peak, best_ms=best * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (the shared machine's noise)")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a shape's index and sdpa flag, in the child process
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        i, sdpa = args.one.split(",")
        print(json.dumps(one(SHAPES[int(i)], args.device, sdpa == "1")))
        return
    rows = []
    for i, shape in enumerate(SHAPES):
        for sdpa in ([False, True] if args.device == "cuda" and not shape[-1] else [False]):
            out = subprocess.run([sys.executable, __file__, "--device", args.device, "--threads", str(args.threads),
                                  "--one", f"{i},{int(sdpa)}"], capture_output=True, text=True, env=os.environ)
            if out.returncode:
                print(f"shape {shape}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout)
            rows.append(row)
            print(f"{'sdpa' if sdpa else 'attend':6s} T {row['T']:>3d} S {row['S']:>6d} {row['Hkv']} x {row['group']} "
                  f"D {row['D']:>3d}{' sinks' if row['sinks'] else '      '}  peak {row['peak_bytes'] / 1e6:9.1f} MB  "
                  f"{row['best_ms']:8.2f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
