"""The grouped MoE prompt GEMM's expert sort alone (kernels/moe_prefill.moe_prefill: the (token, slot) pairs
stably sorted by expert), torch.sort against two ways that give the same keys and order: one sort of
a combined key (expert * R + pair index: unique keys, so any sort is the stable one) and a counting
sort in torch ops (one-hot running counts for each pair's rank among its expert's, each expert's
start from the counts, the pairs scattered to start + rank). GPU time of each inside a CUDA graph
of --calls calls (launches off the clock), median of --repeats replays; and whether each gives
torch.sort's keys and order.

    python3 bench/gpu_box/expert_sort_bench.py --tokens 512,2048 --json out.json
(defaults: qwen3-30b-a3b's router, 128 experts, top 8)
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def stable(flat: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sort(flat, stable=True)


def combined(flat: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    R = flat.numel()
    key = torch.sort(flat * R + torch.arange(R, device=flat.device)).values
    return key // R, key % R


def counting(flat: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    seen = torch.nn.functional.one_hot(flat, n).cumsum(0)  # [R, n]: pairs of each expert so far
    rank = seen.gather(1, flat[:, None])[:, 0] - 1
    counts = seen[-1]
    dest = (counts.cumsum(0) - counts)[flat] + rank
    order = torch.empty_like(flat).index_copy_(0, dest, torch.arange(flat.numel(), device=flat.device))
    return flat[order], order


WAYS = {"torch.sort": stable, "combined key": combined, "counting": counting}


def graph_us(fn, calls: int, repeats: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / calls)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "experts": a.experts, "top": a.top, "us": {}}
    for T in map(int, a.tokens.split(",")):
        slots = torch.randn(T, a.experts, device="cuda").topk(a.top, dim=1).indices
        flat = torch.sort(slots, dim=1, stable=True).values.reshape(-1)  # moe_prefill sorts each token's first
        want = stable(flat, a.experts)
        row = {}
        for name, way in WAYS.items():
            got = way(flat, a.experts)
            row[name] = {"us": graph_us(lambda: way(flat, a.experts), a.calls, a.repeats),
                         "same": all(torch.equal(g, w) for g, w in zip(got, want))}
        row["row sort"] = {"us": graph_us(lambda: torch.sort(slots, dim=1, stable=True), a.calls, a.repeats)}
        res["us"][T] = row
        print(f"{T} tokens x top {a.top} of {a.experts}: " + ", ".join(
            f"{name} {r['us']:.1f} us" + (f" (same {r['same']})" if "same" in r else "") for name, r in row.items()),
            flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
