"""DeviceSampler's draw as a CUDA graph on one 151936-entry logits row, alone (no model): us per
replay with the GPU's spelled-out softmax (device_sampler.softmax) and with torch.softmax (one
thread block per row; what sampling_bench.py's first run measured inside decode), and (session 16)
the Triton paths: the full draw for top_k 0 against the torch chain (SPARKD_DEVICE_SAMPLING=capped
sends top_k 0 there) and the candidates' draw at top_k 40; (session 17) the top-p path for top_k 0
with top_p 0.95 against the torch chain (SPARKD_DEVICE_SAMPLING=chain-top-p). On the GPU box:
    python3 bench/gpu_box/draw_graph_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from sampling_bench import replay_us

from sparkd.engine import device_sampler
from sparkd.engine.device_sampler import DeviceSampler
from sparkd.engine.sampler import SamplingParams

CASES = {"llama.cpp chain at 0.8": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1),
         "temperature 0.8 only": SamplingParams(temperature=0.8, seed=1)}
SOFTMAX = {"spelled out": device_sampler.softmax, "torch.softmax": lambda x: torch.softmax(x, dim=0)}
# the kernel paths (spelled-out softmax where the torch chain runs): name -> params, DeviceSampler's
# fused, full and top_p, the path begin() must pick
CUT = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
PATHS = {"top_k 0, full": (CASES["temperature 0.8 only"], True, True, True, "full"),
         "top_k 0, min_p 0.05, full": (SamplingParams(temperature=0.8, min_p=0.05, seed=1), True, True, True, "full"),
         "top_k 0, torch chain (capped)": (CASES["temperature 0.8 only"], True, False, True, "torch"),
         "top_k 0, top_p 0.95, top-p path": (CUT, True, True, True, "topp"),
         "top_k 0, top_p 0.95, min_p 0.05, top-p path": (SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05,
                                                                          seed=1), True, True, True, "topp"),
         "top_k 0, top_p 0.95, torch chain (chain-top-p)": (CUT, True, True, False, "torch"),
         "top_k 40, fused": (SamplingParams(temperature=0.8, top_k=40, seed=1), True, True, True, "fused"),
         "llama.cpp chain at 0.8, fused": (CASES["llama.cpp chain at 0.8"], True, True, True, "fused")}


def draw_us(params: SamplingParams, logits: torch.Tensor, reps: int, fused: bool = False, full: bool = True,
            top_p: bool = True, path: str = "torch") -> float:
    ds = DeviceSampler(logits.numel(), "cuda", fused=fused, full=full, top_p=top_p)
    ds.begin(params, [1, 2, 3])
    if ds.path != path:
        raise SystemExit(f"{params} took the {ds.path} path, not {path}")
    token = torch.tensor([4], device="cuda")
    ds.draw(logits)  # warm-up
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(ds.generator)
    with torch.cuda.graph(graph):
        ds.step(token, logits)  # push + draw (the kernel paths: in their launches)
    return replay_us(graph, reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json")
    a = ap.parse_args()
    logits = torch.randn(a.vocab, generator=torch.Generator().manual_seed(0)).mul(3).cuda()
    res = {}
    for sname, fn in SOFTMAX.items():
        device_sampler.softmax = fn
        for cname, params in CASES.items():
            res[f"{sname}, {cname}"] = us = draw_us(params, logits, a.reps)
            print(f"{sname:14s} {cname:24s} {us:8.1f} us per draw", flush=True)
    device_sampler.softmax = SOFTMAX["spelled out"]
    for name, (params, fused, full, top_p, path) in PATHS.items():
        res[name] = us = draw_us(params, logits, a.reps, fused, full, top_p, path)
        print(f"{name:46s} {us:8.1f} us per draw", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
