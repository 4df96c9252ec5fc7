"""The graph-replayed decode step with session 5's two cuts switched off and on, in one process
on one model: the norms writing x's int8 blocks (fused kernel norm_quant) and the greedy pick on
the GPU (StaticDecode.next_token; off: the logits row comes back and Sampler picks on the host).

For each setting: tok/s over --tokens greedy steps, then a profiled replay (--profile-tokens):
kernels and copies per token and GPU us per kernel name. The greedy tokens of every setting must
be equal (the cuts change no bits). Makes the model as decode_profile.py does. On the GPU box:
    python3 bench/gpu_box/decode_switches.py --quant Q8_0 --layers 12 --json out.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from decode_profile import PROMPT, bench_args, kernel_time_by_name, load_generated
from launch_count import count_kernels
from torch.profiler import ProfilerActivity, profile

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.kernels import fused
from sparkd.engine.sampler import Sampler, SamplingParams

WITHOUT_NORM_QUANT = "rms_norm,rope_kv,attention,router"
SETTINGS = {  # name: (fused kernels, device pick)
    "before (session 4)": (WITHOUT_NORM_QUANT, False),
    "device pick": (WITHOUT_NORM_QUANT, True),
    "norm_quant": ("all", False),
    "after (both)": ("all", True),
}


def run(net, ctx: int, device_pick: bool, n: int, n_prof: int) -> dict:
    cache = net.new_cache(ctx)
    token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
    step = StaticDecode(net, cache, graphs=True, device_argmax=device_pick)
    step.prepare(len(PROMPT) + n + n_prof + 1)
    host = Sampler(SamplingParams(temperature=0.0))
    one = (lambda t: step.next_token(t)) if device_pick else (lambda t: host(step(t)[-1]))
    ids = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        token = one(token)
        ids.append(token)
    seconds = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n_prof):
            token = one(token)
    k = count_kernels(prof.events())
    by_name = kernel_time_by_name(prof.events(), n_prof)
    return {"tok_s": n / seconds, "ms_per_token": seconds * 1e3 / n, "ids": ids,
            "kernels_per_token": k["kernels"] / n_prof, "copies_per_token": k["copies"] / n_prof,
            "gpu_us_per_token": sum(v[1] for v in by_name.values()), "by_kernel": by_name}


def main() -> int:
    a = bench_args(__doc__, layers=12, tokens=128).parse_args()
    path, m = load_generated(a)
    res = {"model": str(path), "device": torch.cuda.get_device_name(), "settings": {}}
    try:
        ctx = 256
        for name, (spec, pick) in SETTINGS.items():
            before = fused.configure(spec)
            try:
                res["settings"][name] = r = run(m.net, ctx, pick, a.tokens, a.profile_tokens) | {"fused": spec}
            finally:
                fused.configure(before)
            print(f"{name:20s} {r['tok_s']:7.1f} tok/s {r['ms_per_token']:.3f} ms/token  "
                  f"{r['kernels_per_token']:.0f} kernels + {r['copies_per_token']:.0f} copies/token  "
                  f"GPU {r['gpu_us_per_token']:.1f} us/token", flush=True)
            for kname, (launches, us) in list(r["by_kernel"].items())[:12]:
                print(f"    {launches:6.1f} {us:8.1f}  {kname[:90]}")
    finally:
        m.close()
    ids = {name: r["ids"] for name, r in res["settings"].items()}
    res["greedy_equal"] = len({tuple(v) for v in ids.values()}) == 1
    print(f"greedy tokens equal across settings: {res['greedy_equal']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if res["greedy_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
