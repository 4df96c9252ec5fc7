"""Graph-replayed decode tok/s with the token picked four ways, in one process on one model:
greedy (torch.argmax inside the step's graph), temperature on the host (the logits row comes back,
Sampler draws; SPARKD_DEVICE_SAMPLING=0) and temperature on the device (DeviceSampler's graph
right after the step's, one int back) with the torch chain (=torch) and the fused Triton draw
(=fused; session 16: top_k 0 on the full path, and on the torch chain with =capped; session 19:
top_k 0 with top_p 0.95 on the top-p path, and on the torch chain with =chain-top-p). Also the
draw graph's own time (replays alone, CUDA events) and how many draw graphs
each run captured (greedy: none). One untimed token first: a draw graph is captured on its first
draw (session 7; before that prepare() captured it), which the timed tokens then leave out; its
time is first_ms (the process's first draw of a path also loads or compiles its kernels), and the
slowest timed token's slowest_ms (a later bucket's draw graph captured there).
On the GPU box:
    python3 bench/gpu_box/sampling_bench.py --model /tmp/q30-12l-e8-Q8_0.gguf --json out.json
--settings picks some by name (comma-separated), --repeats runs them again in turn (interleaved).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.device_sampler import DeviceSampler
from sparkd.engine.models import load_model
from sparkd.engine.sampler import Sampler, SamplingParams

PROMPT = [1, 7, 42, 3, 99, 100, 5, 17]
# llama.cpp's default chain at temperature 0.8
HOT = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
GREEDY = SamplingParams(temperature=0.0)
# top_k 0: every token (generate --temp 0.8's default, OpenAI's)
EVERY = SamplingParams(temperature=0.8, seed=1234)
TOP40 = SamplingParams(temperature=0.8, top_k=40, seed=1234)
CUT = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)  # top_k 0 with top-p (OpenAI's top_p)
SETTINGS = {"greedy (device argmax)": (GREEDY, "fused"), "temperature 0.8 host": (HOT, "off"),
            "temperature 0.8 device torch": (HOT, "torch"), "temperature 0.8 device fused": (HOT, "fused"),
            "temperature 0.8 fused 4096x1": (HOT, "fused"),
            "top_k 0 full": (EVERY, "fused"), "top_k 0 capped (torch chain)": (EVERY, "capped"),
            "top_k 40 fused": (TOP40, "fused"), "top_p 0.95 top-p path": (CUT, "fused"),
            "top_p 0.95 chain-top-p (torch chain)": (CUT, "chain-top-p")}
# the fused draw's layout where not the default (DeviceSampler's block_tokens, merge_blocks)
LAYOUTS = {"temperature 0.8 fused 4096x1": {"block_tokens": 4096, "merge_blocks": 1}}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(net, params: SamplingParams, on_device: str, n: int, layout: dict | None = None) -> tuple[dict, StaticDecode]:
    cache = net.new_cache(len(PROMPT) + n + 3)
    token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
    graphs = cache.device.type == "cuda"  # --device cpu: a dry run of this script, uncaptured
    step = StaticDecode(net, cache, graphs=graphs, device_argmax=True, device_sampling=on_device)
    step.prepare(len(PROMPT) + n + 2)
    if layout and step.fused_sampling:
        step.sampler = DeviceSampler(net.cfg.n_vocab, cache.device, fused=True, **layout)
    history = PROMPT + [token]
    drawing = step.begin_sampling(params, PROMPT)
    host = Sampler(params)
    one = step.next_token if drawing or params.temperature == 0 else (lambda t: host(step(t)[-1], history))
    sync()
    t0 = time.perf_counter()
    token = one(token)  # untimed: the draw graph's capture
    history.append(token)
    sync()
    first_ms, slowest, t0 = (time.perf_counter() - t0) * 1e3, 0.0, time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        token = one(token)  # (an int: the host waits for each token)
        slowest = max(slowest, time.perf_counter() - t)
        history.append(token)
    sync()
    seconds = time.perf_counter() - t0
    return {"tok_s": n / seconds, "ms_per_token": seconds * 1e3 / n, "drawing": drawing,
            "first_ms": first_ms, "slowest_ms": slowest * 1e3,
            "distinct_tokens": len(set(history[len(PROMPT):])), "draw_graphs": len(step._draws)}, step


def replay_us(graph: torch.cuda.CUDAGraph, reps: int = 200) -> float:
    """us per replay of a captured graph (one replay first, then reps between CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--settings", help="comma-separated names (default: all)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    names = a.settings.split(",") if a.settings else list(SETTINGS)
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        ap.error(f"unknown settings {unknown}: choose from {list(SETTINGS)}")
    m = load_model(a.model, device=a.device)
    name = torch.cuda.get_device_name() if a.device == "cuda" else a.device
    res = {"model": a.model, "device": name, "hot": repr(HOT), "settings": {}}
    try:
        for rep in range(a.repeats):
            for name in names:
                params, on_device = SETTINGS[name]
                r, step = run(m.net, params, on_device, a.tokens, LAYOUTS.get(name))
                if step._draws:
                    r["draw_graph_us"] = replay_us(next(iter(step._draws.values()))[0])
                name = f"{name} #{rep + 1}" if a.repeats > 1 else name
                res["settings"][name] = r
                print(f"{name:30s} {r['tok_s']:8.1f} tok/s {r['ms_per_token']:.3f} ms/token "
                      f"drawing={r['drawing']} distinct={r['distinct_tokens']} draw_graphs={r['draw_graphs']} "
                      f"first {r['first_ms']:.1f} ms slowest {r['slowest_ms']:.1f} ms"
                      + (f" draw graph {r['draw_graph_us']:.1f} us" if "draw_graph_us" in r else ""), flush=True)
    finally:
        m.close()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
