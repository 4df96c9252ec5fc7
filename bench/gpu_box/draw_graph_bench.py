"""DeviceSampler's draw as a CUDA graph on one 151936-entry logits row, alone (no model): us per
replay with the GPU's spelled-out softmax (device_sampler.softmax) and with torch.softmax (one
thread block per row; what sampling_bench.py's first run measured inside decode), and (session 16)
the Triton paths: the full draw for top_k 0 against the torch chain (SPARKD_DEVICE_SAMPLING=capped
sends top_k 0 there) and the candidates' draw at top_k 40; (session 19) the top-p path for top_k 0
with top_p < 1 (kernels/top_p_select.py) against the torch chain (SPARKD_DEVICE_SAMPLING=chain-top-p)
on three rows: flat (randn x 3), peaked (16 tokens raised by 15) and rounded (the flat one rounded:
thousands of ties at the cut, past the select's gather). The top-p rows also print the stage the
select's search ended in and how many tokens it gathered (0: the ties' count path). Session 20
(--top-p-only): the top-p rows alone at the select's 2048 bins (the default) and 4096
(SPARKD_TOP_P_BINS=4096), side by side, two rounds (topp45's call compared a folded select, since
taken out, at 4096 and 2048 bins with this staged one at 4096); since session 23 also 1024 and 512. On the GPU box:
    python3 bench/gpu_box/draw_graph_bench.py --json out.json [--top-p-only]
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
CUT90 = SamplingParams(temperature=0.8, top_p=0.9, seed=1)
PATHS = {"top_k 0, full": (CASES["temperature 0.8 only"], True, True, True, "full"),
         "top_k 0, min_p 0.05, full": (SamplingParams(temperature=0.8, min_p=0.05, seed=1), True, True, True, "full"),
         "top_k 0, torch chain (capped)": (CASES["temperature 0.8 only"], True, False, True, "torch"),
         "top_k 0, top_p 0.95, top-p path, flat": (CUT, True, True, True, "topp"),
         "top_k 0, top_p 0.95, top-p path, peaked": (CUT, True, True, True, "topp"),
         "top_k 0, top_p 0.95, top-p path, rounded": (CUT, True, True, True, "topp"),
         "top_k 0, top_p 0.9, top-p path, flat": (CUT90, True, True, True, "topp"),
         "top_k 0, top_p 0.95, min_p 0.05, top-p path, flat": (SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05,
                                                                                seed=1), True, True, True, "topp"),
         "top_k 0, top_p 0.95, torch chain (chain-top-p), flat": (CUT, True, True, False, "torch"),
         "top_k 0, top_p 0.95, torch chain (chain-top-p), peaked": (CUT, True, True, False, "torch"),
         "top_k 40, fused": (SamplingParams(temperature=0.8, top_k=40, seed=1), True, True, True, "fused"),
         "llama.cpp chain at 0.8, fused": (CASES["llama.cpp chain at 0.8"], True, True, True, "fused")}


# the top-p select's bins (--top-p-only)
SELECTS = {"4096 bins": 4096, "2048 bins": 2048, "1024 bins": 1024, "512 bins": 512}
TOP_P_ROWS = {"top_p 0.95, flat": (CUT, "flat"), "top_p 0.95, peaked": (CUT, "peaked"),
              "top_p 0.95, rounded": (CUT, "rounded"), "top_p 0.9, flat": (CUT90, "flat"),
              "top_p 0.95, min_p 0.05, flat": (SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05, seed=1), "flat")}


def draw_us(params: SamplingParams, logits: torch.Tensor, reps: int, fused: bool = False, full: bool = True,
            top_p: bool = True, path: str = "torch", bins: int | None = None) -> tuple[float, str]:
    ds = DeviceSampler(logits.numel(), "cuda", fused=fused, full=full, top_p=top_p)
    if bins is not None:
        from sparkd.engine.kernels.top_p_select import SelectScratch
        ds.select = SelectScratch(ds.scratch, ds.device, bins)
    ds.begin(params, [1, 2, 3])
    if ds.path != path:
        raise SystemExit(f"{params} took the {ds.path} path, not {path}")
    token = torch.tensor([4], device="cuda")
    ds.draw(logits)  # warm-up
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(ds.generator)
    with torch.cuda.graph(graph):
        ds.step(token, logits)  # push + draw (the kernel paths: in their launches)
    us = replay_us(graph, reps)
    if ds.select is None or path != "topp":
        return us, ""
    stage, gathered = ds.select.outcome()
    return us, f"select done at stage {stage}, {gathered} gathered"


def rows(vocab: int) -> dict[str, torch.Tensor]:
    flat = torch.randn(vocab, generator=torch.Generator().manual_seed(0)).mul(3)
    peaked = flat.clone()
    peaked[torch.arange(16) * (vocab // 17) + 5] += 15.0
    return {"flat": flat.cuda(), "peaked": peaked.cuda(), "rounded": flat.round().cuda()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json")
    ap.add_argument("--top-p-only", action="store_true", help="the top-p select's bins side by side (session 20)")
    a = ap.parse_args()
    by_name = rows(a.vocab)
    logits = by_name["flat"]
    res = {}
    if a.top_p_only:
        res["top_k 0, full"] = us = draw_us(CASES["temperature 0.8 only"], logits, a.reps, True, True, True, "full")[0]
        print(f"{'top_k 0, full':54s} {us:8.1f} us per draw", flush=True)
        for round_ in (1, 2):
            for name, (params, row) in TOP_P_ROWS.items():
                for form, bins in SELECTS.items():
                    us, how = draw_us(params, by_name[row], a.reps, True, True, True, "topp", bins)
                    res[f"{name}, {form}, round {round_}"] = us
                    print(f"{name + ', ' + form:54s} {us:8.1f} us per draw {how}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2))
        return 0
    for sname, fn in SOFTMAX.items():
        device_sampler.softmax = fn
        for cname, params in CASES.items():
            res[f"{sname}, {cname}"] = us = draw_us(params, logits, a.reps)[0]
            print(f"{sname:14s} {cname:24s} {us:8.1f} us per draw", flush=True)
    device_sampler.softmax = SOFTMAX["spelled out"]
    for name, (params, fused, full, top_p, path) in PATHS.items():
        row = by_name[name.rsplit(", ", 1)[1]] if name.endswith(tuple(by_name)) else logits
        us, how = draw_us(params, row, a.reps, fused, full, top_p, path)
        res[name] = us
        print(f"{name:54s} {us:8.1f} us per draw {how}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
