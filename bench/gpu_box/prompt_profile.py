"""Where a long prompt's eager forward goes on CUDA, kernel by kernel, under each MLA prompt form (session 32).

Loads a model resident on CUDA (as `generate --device cuda --resident`), runs a --tokens-long prompt from an empty
cache of --kv-type rows once to warm up, times --repeats forwards (CUDA events), then profiles one: GPU time by
kernel, the most first. Each --ways value mla[:slab[:sdpa[:expert_rows]]] sets layers/mla.py's MLA_PROMPT for its
runs ("mha", "absorbed"), layers/linear.py's SLAB_GEMM ("off" the integer GEMMs, "bf16" the slab GEMM; session 46),
layers/attention.py's SDPA_PRECISION ("float32", "half": MLA's expansion follows it since session 46; session 46's
call 2 named that "mha-half") and layers/moe.py's SLAB_EXPERT_ROWS (a number; a large one keeps the experts on the
integer GEMMs); a field left out or empty keeps the default.

    python3 bench/gpu_box/prompt_profile.py /var/tmp/dsv3-5l-16e-Q4_K.gguf --tokens 8000 --json prompt.json
    python3 bench/gpu_box/prompt_profile.py /var/tmp/dsv3-5l-16e-Q4_K.gguf --ways mha:off:float32,mha,absorbed
A process per way (--ways mha, then --ways absorbed) gives each its first forward's time (first_ms: Triton compiles,
the allocator's first blocks) without the other's warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sparkd.engine.layers import attention, linear, mla, moe
from sparkd.engine.layers.kv_cache import KV_TYPES, kv_type_name
from sparkd.engine.models import load_model


def forward_ms(net, tokens: torch.Tensor, kv: torch.dtype) -> float:
    cache = net.new_cache(tokens.shape[0] + 8, kv)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    net(tokens, cache, last=True)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def by_kernel(net, tokens: torch.Tensor, kv: torch.dtype, top: int) -> list[tuple[str, int, float]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward_ms(net, tokens, kv)
    ms: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            ms[e.name][0] += 1
            ms[e.name][1] += e.time_range.elapsed_us() / 1e3
    return [(name[:110], int(n), round(t, 2)) for name, (n, t) in sorted(ms.items(), key=lambda kv: -kv[1][1])[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--ways", default="mha,absorbed")
    ap.add_argument("--kv-type", default="auto")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    net = load_model(a.model, device="cuda").net
    kv = KV_TYPES[kv_type_name(a.kv_type, "cuda")]
    tokens = torch.arange(a.tokens) % 1000 + 1
    res = {"model": a.model, "tokens": a.tokens}
    defaults = linear.SLAB_GEMM, attention.SDPA_PRECISION, moe.SLAB_EXPERT_ROWS
    for way in a.ways.split(","):
        form, slab, sdpa, rows = (way.split(":") + ["", "", ""])[:4]
        mla.MLA_PROMPT, linear.SLAB_GEMM, attention.SDPA_PRECISION = form, slab or defaults[0], sdpa or defaults[1]
        moe.SLAB_EXPERT_ROWS = int(rows) if rows else defaults[2]
        first = forward_ms(net, tokens, kv)  # warm-up: kernels compiled, the allocator's blocks made
        times = [forward_ms(net, tokens, kv) for _ in range(a.repeats)]
        ms = statistics.median(times)
        res[way] = {"first_ms": first, "ms": ms, "tok_s": a.tokens / ms * 1e3, "kernels": by_kernel(net, tokens, kv, a.top)}
        print(f"{way}: {res[way]['ms']:.1f} ms ({res[way]['tok_s']:.0f} tok/s), the first {first:.1f} ms", flush=True)
        for name, n, t in res[way]["kernels"]:
            print(f"  {t:9.2f} ms {n:5d}x  {name}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
