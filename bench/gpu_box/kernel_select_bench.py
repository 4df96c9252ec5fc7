"""Host time of the streaming store's kernel_select (one MoE layer's routing ids -> kernel table):
the per-layer, per-token bookkeeping of GPU streaming, by SPARKD_STREAM_TABLE mode.

    python bench/gpu_box/kernel_select_bench.py [--device cpu|cuda] [--vram-slots 16] [--repeats 7]

A generated qwen3moe (Q8_0, 32 experts, top-8, a few layers) is opened for streaming; random
top-8 selections go through kernel_select for every layer, `--tokens` tokens per repeat. Prints
the best repeat's microseconds per call for each mode (the best: the machine may be shared).
On cpu the CPU stands in for the device (as the interpreter tests do): only the host work counts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace

import torch

from sparkd.engine.make_model import plan as model_plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.streaming.plan import runtime_rss_bytes
from sparkd.engine.streaming.session import StreamOptions, open_streaming
from sparkd.engine.streaming.vram import VramExperts
from sparkd.engine.streaming.zero_copy import TABLE_MODES


def bench(path: str, device: str, mode: str, vram_slots: int, tokens: int, repeats: int) -> tuple[float, dict]:
    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False,
                         device=device, unified="on")
    sm = open_streaming(path, opts)
    try:
        st = sm.store
        st.kernel_device, st.table_mode = device, mode
        st.vram = VramExperts(vram_slots, sm.plan.slot_bytes, device) if vram_slots else None
        layers, n_expert = sm.model.cfg.n_layer, sm.model.cfg.n_expert
        gen = torch.Generator().manual_seed(0)

        def run(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                for il in range(layers):
                    ids = torch.randperm(n_expert, generator=gen)[:8].to(device)
                    st.kernel_select(il, ids)
            if device != "cpu":
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / (n * layers)
        run(5)  # warm: reads land, the VRAM cache fills
        best = min(run(tokens) for _ in range(repeats))
        snap = st.snapshot()
    finally:
        sm.close()
    return best, {k: snap[k] for k in ("hits", "misses", "vram_hits", "vram_requests") if k in snap}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vram-slots", type=int, nargs="*", default=[0, 16])
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    shape = replace(TINY["qwen3moe"], n_expert=32, n_expert_used=8, n_layer=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(write_model(os.path.join(tmp, "m.gguf"), model_plan(shape, "Q8_0"), seed=5)[0])
        for slots in a.vram_slots:
            for mode in TABLE_MODES:
                us, stats = bench(path, a.device, mode, slots, a.tokens, a.repeats)
                print(f"{a.device} vram_slots={slots} SPARKD_STREAM_TABLE={mode}: {us * 1e6:.0f} us per "
                      f"kernel_select (best of {a.repeats}) {stats}", flush=True)


if __name__ == "__main__":
    main()
