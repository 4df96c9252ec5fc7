"""Where a temperature `generate` spends the time greedy does not (issue 8, session 18), in one process.

The model is loaded and prepared as cmd_generate does it (step and prompt graphs, the kernels' JIT, the
draw chains' warm-up), then for greedy, top_k 0 (the full draw), top_k 40 and top_p 0.95 in turn:
  host_first / host_again: the host Sampler's first draw of that setting in the process over the prompt's
    logits (generate's first token), then the same draw again;
  decode_1 / decode_2: cli._decode of -n tokens after the prompt, the first time (the draw graph of the
    bucket captured in it: capture_ms) and again (every graph captured, the host chain warm).
Then torch.profiler over 32 warm decode tokens, greedy and top_k 0: the runtime calls a token (graph
launches, copies, syncs), the GPU's busy time and its gaps. decode_2 is what generate would measure
without the first-use and capture costs; decode_1 - decode_2 is what they cost.

Usage: python bench/draw_gap_bench.py MODEL.gguf [-n 128] [--profile-tokens 32] [--json F] [--trace-dir D]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sparkd.engine import cli
from sparkd.engine.cuda_graphs import StaticDecode, use_graphs
from sparkd.engine.prompt_graphs import prompt_forward
from sparkd.engine.models import load_model
from sparkd.engine.models.decoder import prompt_last_only
from sparkd.engine.sampler import Sampler, SamplingParams

SETTINGS = {"greedy": SamplingParams(temperature=0.0),
            "top_k0": SamplingParams(temperature=0.8, seed=1),
            "top_k40": SamplingParams(temperature=0.8, top_k=40, seed=1),
            "top_p095": SamplingParams(temperature=0.8, top_p=0.95, seed=1)}
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 3)


def sync(step) -> None:
    if step.cache.device.type == "cuda":
        torch.cuda.synchronize()


def prepared(m, n: int, device: str = "cuda"):
    """The step and prompt forward of a PROMPT + n cache, prepared as cmd_generate does it, in its order: the
    kernels' JIT, the step and prompt graphs (on CUDA), the draw chains' warm-up."""
    graphs = use_graphs("on" if device == "cuda" else "off", m.net, device)
    cache = m.net.new_cache(len(PROMPT) + n)
    step = StaticDecode(m.net, cache, graphs=graphs)
    prompt = prompt_forward(m.net, cache, graphs)
    scratch = m.net.new_cache(3)
    m.net(torch.tensor(PROMPT[:1] * 2), scratch)
    m.net(torch.tensor(PROMPT[:1]), scratch)
    step.prepare(len(PROMPT) + n)
    prompt.prepare(len(PROMPT))
    step.warm_sampling()
    return step, prompt


def prompt_logits(step: StaticDecode, prompt) -> torch.Tensor:
    step.cache.reset()
    logits = prompt(torch.tensor(PROMPT), last=prompt_last_only())
    sync(step)
    return logits


def decode(step, prompt, params: SamplingParams, n: int) -> tuple[float, list[int]]:
    logits = prompt_logits(step, prompt)
    t0 = time.perf_counter()
    out = cli._decode(step, Sampler(params), logits, PROMPT, n, None, frozenset(), None)[0]
    return ms(t0), out


def gpu_gaps(prof) -> dict:
    """The device's kernels (and copies) as intervals: busy time, the span they cover, the gaps."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return {"kernels": 0}
    busy, gaps, (start, end) = 0.0, [], spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            gaps.append(s - end)
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    total = spans[-1][1] - spans[0][0]
    return {"kernels": len(spans), "span_us": round(total, 1), "busy_us": round(busy, 1),
            "gaps_over_5us": sum(g > 5 for g in gaps), "gap_us_over_5us": round(sum(g for g in gaps if g > 5), 1),
            "largest_gaps_us": [round(g, 1) for g in sorted(gaps)[-8:]]}


def profile(step, prompt, params: SamplingParams, n: int, trace: str | None) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    logits = prompt_logits(step, prompt)
    sample = Sampler(params)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        cli._decode(step, sample, logits, PROMPT, n, None, frozenset(), None)
        wall = ms(t0)
    if trace:
        prof.export_chrome_trace(trace)
    calls = {a.key: a.count for a in prof.key_averages() if a.key.startswith(("cuda", "aten::", "Memcpy", "Memset"))}
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return {"wall_ms": wall, "tokens": n, "calls_per_token": {k: round(v / n, 2) for k, v in sorted(calls.items())},
            "gpu": gpu_gaps(prof), "table": table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--profile-tokens", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--trace-dir")
    a = ap.parse_args()
    m = load_model(a.model, device="cuda")
    res: dict = {"n": a.n}
    try:
        step, prompt = prepared(m, a.n)
        captures: list[float] = []
        capture_draw = step._capture_draw

        def timed_capture(logits):  # the draw graph's capture, as the first draw of a bucket runs it
            t0 = time.perf_counter()
            out = capture_draw(logits)
            torch.cuda.synchronize()
            captures.append(ms(t0))
            return out
        step._capture_draw = timed_capture
        for name, params in SETTINGS.items():
            logits = prompt_logits(step, prompt)
            row, times = logits[-1], []
            for _ in range(2):
                t0 = time.perf_counter()
                Sampler(params)(row, PROMPT)
                times.append(ms(t0))
            captures.clear()
            d1, out1 = decode(step, prompt, params, a.n)
            cap = list(captures)
            d2, out2 = decode(step, prompt, params, a.n)
            res[name] = {"host_first_ms": times[0], "host_again_ms": times[1], "decode_1_ms": d1,
                         "decode_2_ms": d2, "capture_ms": cap, "tok_s_1": round(a.n / d1 * 1e3, 1),
                         "tok_s_2": round(a.n / d2 * 1e3, 1), "same_tokens": out1 == out2, "tokens": out2}
            print(name, {k: v for k, v in res[name].items() if k != "tokens"}, flush=True)
        for name in ("greedy", "top_k0", "top_k40"):
            trace = f"{a.trace_dir}/trace_{name}.json" if a.trace_dir else None
            res[f"profile_{name}"] = prof = profile(step, prompt, SETTINGS[name], a.profile_tokens, trace)
            print(f"profile {name}: wall {prof['wall_ms']} ms, gpu {prof['gpu']}\n{prof['calls_per_token']}\n"
                  f"{prof['table']}", flush=True)
    finally:
        m.close()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
