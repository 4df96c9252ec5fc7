"""Session 44: SPARKD_SDPA_PRECISION=half against float32 on a real-shaped model (the 4-layer gpt-oss-20b F16 file,
a float16 cache as generate keeps it): the prompt's last logits (relative difference, the same argmax, top-5 overlap)
and the forward's time, the modes interleaved after a warm-up of each. Usage: python sdpa_half.py FILE [T ...]."""
import sys
import time

import torch

from sparkd.engine.layers import attention
from sparkd.engine.models import load_model

path, lengths = sys.argv[1], [int(t) for t in sys.argv[2:]] or [2000, 8000]
m = load_model(path, device="cuda", kernels=True)
for n in lengths:
    toks = torch.tensor([1 + i % 1000 for i in range(n)])

    def forward(mode):
        attention.SDPA_PRECISION = mode
        cache = m.net.new_cache(n, kv_dtype=torch.float16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = m.net(toks, cache)[-1]
        torch.cuda.synchronize()
        return out.double().cpu(), time.perf_counter() - t0

    forward("float32"), forward("half")  # warm-up: compiles, allocations
    times = {}
    logits = {}
    for mode in ("float32", "half", "float32", "half"):
        out, sec = forward(mode)
        times.setdefault(mode, []).append(sec)
        logits.setdefault(mode, out)
    a, b = logits["float32"], logits["half"]
    top = len(set(a.topk(5).indices.tolist()) & set(b.topk(5).indices.tolist()))
    print(f"{n} tokens: forward float32 {[round(t * 1e3, 1) for t in times['float32']]} ms, half "
          f"{[round(t * 1e3, 1) for t in times['half']]} ms; last logits half vs float32 rel "
          f"{float((b - a).norm() / a.norm()):.2e}, argmax {int(a.argmax())} / {int(b.argmax())}, top-5 shared {top}",
          flush=True)
m.close()
