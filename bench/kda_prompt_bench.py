"""A prompt's KDA delta rule (kimi-k3's linear attention, sparkd/engine/layers/kda.py): the token loop
against the chunked form at several chunk lengths, on random inputs of a model's shape, interleaved
repeats, the median in ms; and each one's error against the loop in float64.

    python3 bench/kda_prompt_bench.py --tokens 256 --heads 32 --dim 128 --chunks 16,32,64 --threads 1
    python3 bench/kda_prompt_bench.py --device cuda --tokens 2048 --heads 32 --dim 128 --chunks 16,32,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sparkd.engine.layers.kda import delta_rule, delta_rule_chunks


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("--heads", type=int, default=32, help="KDA heads (default 32)")
    ap.add_argument("--dim", type=int, default=128, help="head dim (default 128, kimi-k3's)")
    ap.add_argument("--chunks", default="16,32,64", help="chunk lengths to time (default 16,32,64)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    g = torch.Generator().manual_seed(0)
    T, H, D = a.tokens, a.heads, a.dim
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    v, s0 = torch.randn(T, H, D, generator=g), torch.randn(H, D, D, generator=g)
    gate, beta = -torch.rand(T, H, D, generator=g) * 0.1, torch.rand(T, H, generator=g)
    want, _ = delta_rule(*(x.double() for x in (q, k, v, gate, beta, s0)))
    args = [x.to(dev) for x in (q, k, v, gate, beta, s0)]
    ways = {"loop": lambda: delta_rule(*args)}
    ways.update({f"chunks {c}": (lambda c=c: delta_rule_chunks(*args, chunk=c)) for c in map(int, a.chunks.split(","))})
    for fn in ways.values():  # warm-up (allocator, kernels)
        fn()
    ms: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(a.reps):
        for w, fn in ways.items():
            ms[w].append(timed(fn, dev))
    rows = []
    for w, fn in ways.items():
        out = fn()[0].cpu().double()
        err = ((out - want).norm() / want.norm()).item()
        rows.append({"way": w, "ms": round(statistics.median(ms[w]), 2), "rel_err_vs_float64": err})
        print(f"{w:10s} {rows[-1]['ms']:9.2f} ms  err {err:.1e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tokens": T, "heads": H, "dim": D, "device": a.device, "threads": torch.get_num_threads(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
