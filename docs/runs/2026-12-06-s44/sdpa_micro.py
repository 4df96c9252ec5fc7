"""Session 44: attend_sdpa at gpt-oss-20b's heads (64 query heads over 8 KV heads of 64, sinks, a float16 cache as
generate keeps it), SPARKD_SDPA_PRECISION float32 against half, interleaved after a warm-up: ms a call (median of 5)
and half's output against float32's. Full causal layers and the 128 window. Usage: python sdpa_micro.py."""
import statistics

import torch

from sparkd.engine.layers import attention
from sparkd.engine.layers.attention import attend_sdpa


def ms(fn):
    fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


torch.manual_seed(0)
for T, window in ((2000, 0), (8000, 0), (8000, 128)):
    q = torch.randn(T, 64, 64, device="cuda")
    k, v = torch.randn(T, 8, 64, device="cuda").half(), torch.randn(T, 8, 64, device="cuda").half()
    sk = 3 * torch.randn(64, device="cuda")
    out, took = {}, {}
    for mode in ("float32", "half", "float32", "half"):
        attention.SDPA_PRECISION = mode
        took.setdefault(mode, []).append(ms(lambda: attend_sdpa(q, k, v, 0.125, 0, window, sinks=sk)))
        out[mode] = attend_sdpa(q, k, v, 0.125, 0, window, sinks=sk)
    a, b = out["float32"], out["half"]
    rel = float((b - a).norm() / a.norm())
    print(f"T {T} window {window}: float32 {took['float32']} ms, half {took['half']} ms "
          f"({min(took['float32']) / min(took['half']):.2f}x); half vs float32 rel {rel:.2e}", flush=True)
