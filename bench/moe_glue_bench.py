"""Host time of moe_prefill's glue: the torch/Triton work around its three grouped GEMMs, per MoE layer
call, with the GEMMs stubbed out (grouped_gemm returns an unfilled output: no launch), for each
SPARKD_MOE_PREFILL_GLUE way ("torch": expert_tiles' ops, the weights' gather and the slot sum as torch
ops; "kernels": a launch each, session 10's glue10). Rows: tokens, way, host us a call (perf_counter
over --calls calls, synced once at the end: the GPU keeps up, so this is the host's time), CUDA kernel
launches a call (torch.profiler). Routing: random top-k of E experts per token, the engine's shapes
(Qwen3-30B-A3B: D 2048, F 768, E 128, A 8). Every expert's bytes at offset 0 of one expert's buffer
(the stub reads none).
    python3 bench/moe_glue_bench.py --tokens 512,2048 [--device cpu: TRITON_INTERPRET=1, tiny]
"""

from __future__ import annotations

import argparse
import time

import torch
from gguf.constants import GGMLQuantizationType as T
from torch.profiler import ProfilerActivity, profile

from sparkd.engine.kernels import dispatch, moe, moe_prefill


def stub(weight, offsets, qtype, shape, x, src, tiles, precision="tf32", qx=None, block_t=16):
    return torch.empty(src.numel(), shape[0], dtype=torch.float32, device=x.device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--shape", default="2048,768,128,8", help="D,F,E,A")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    D, F, E, A = map(int, a.shape.split(","))
    fam = dispatch.family(T.Q8_0)
    span = F * fam.row_bytes(D)
    buf = torch.zeros(max(span, D * fam.row_bytes(F)), dtype=torch.uint8, device=a.device)
    table = moe.prepare(moe.ExpertTable(buf, buf, buf, [0] * E, [0] * E, [0] * E, T.Q8_0, T.Q8_0, D, F), a.device)
    moe.grouped_gemm = stub
    print(f"{'tokens':>6} {'glue':8} {'host us/call':>12} {'launches':>8}")
    for n in map(int, a.tokens.split(",")):
        x = torch.randn(n, D, device=a.device)
        slots = torch.rand(n, E, device=a.device).topk(A, dim=1).indices
        w = torch.rand(n, A, device=a.device)
        for glue in ("torch", "kernels"):
            moe_prefill.PREFILL_GLUE = glue
            call = lambda: moe_prefill.moe_prefill(table, x, slots, w, precision="int8", check_slots=False)  # noqa: E731
            for _ in range(3):
                call()
            if a.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                call()
            if a.device == "cuda":
                torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / a.calls * 1e6
            with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])) as prof:
                call()
                if a.device == "cuda":
                    torch.cuda.synchronize()
            launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            print(f"{n:6d} {glue:8} {us:12.1f} {launches:8d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
