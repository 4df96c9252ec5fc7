"""A prompt's attention and float GEMM alone, torch against attn11's kernels and the attention
through torch's SDPA (attend_sdpa, the default since session 14), at one layer's shape: GPU time
(CUDA events around --iters calls, median of --repeats), the relative error against torch in
float64, and whether the real rows keep their bits when the prompt is padded to its CUDA-graph
bucket (cuda_graphs.prompt_bucket). attn11's kernel is timed up to --kernel-max tokens (it grows as T^2).

    python3 bench/gpu_box/prefill_attention_bench.py --tokens 128,512,600,1024,2048 --json out.json
(defaults: qwen3-30b-a3b's attention, 32 query heads over 4 KV heads of 128, and its router gate
[128 experts, 2048])
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from sparkd.engine.cuda_graphs import prompt_bucket
from sparkd.engine.kernels.float_gemm import float_gemm
from sparkd.engine.kernels.prefill_attention import prefill_attention
from sparkd.engine.layers.attention import attend, attend_sdpa


def gpu_ms(fn, iters: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def rel64(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="128,512,600,1024")
    ap.add_argument("--heads", default="32,4,128", help="H,Hkv,D")
    ap.add_argument("--gate", default="128,2048", help="the float GEMM's N,K")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kernel-max", type=int, default=1024, help="longest prompt attn11's kernel is timed at")
    ap.add_argument("--json")
    a = ap.parse_args()
    H, Hkv, D = (int(x) for x in a.heads.split(","))
    N, K = (int(x) for x in a.gate.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = {"gpu": torch.cuda.get_device_name(), "heads": [H, Hkv, D], "gate": [N, K], "rows": {}}
    w = torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5
    for T in (int(t) for t in a.tokens.split(",")):
        P = prompt_bucket(T) or T
        q = torch.randn(P, H, D, device="cuda", generator=gen)
        k, v = (torch.randn(P, Hkv, D, device="cuda", generator=gen) for _ in range(2))
        x = torch.randn(P, K, device="cuda", generator=gen)
        qt, kt, vt, xt = q[:T], k[:T], v[:T], x[:T]
        scale = D ** -0.5
        att = prefill_attention(qt, kt, vt, 0, scale)
        want = attend(qt.double(), kt.double(), vt.double(), scale, 0)
        sdpa = attend_sdpa(qt, kt, vt, scale)
        lin = float_gemm(xt, w)
        r = res["rows"][T] = {
            "bucket": P,
            "attend_ms": gpu_ms(lambda: attend(qt, kt, vt, scale, 0), a.iters, a.repeats),
            "kernel_ms": (gpu_ms(lambda: prefill_attention(qt, kt, vt, 0, scale), a.iters, a.repeats)
                          if T <= a.kernel_max else float("nan")),
            "sdpa_ms": gpu_ms(lambda: attend_sdpa(qt, kt, vt, scale), a.iters, a.repeats),
            "sdpa_err": rel64(sdpa, want),
            "sdpa_padded_bits": bool(torch.equal(attend_sdpa(q, k, v, scale)[:T], sdpa)),
            "kernel_err": rel64(att, want), "torch_err": rel64(attend(qt, kt, vt, scale, 0), want),
            "kernel_padded_bits": bool(torch.equal(prefill_attention(q, k, v, 0, scale)[:T], att)),
            "torch_padded_bits": bool(torch.equal(attend(q, k, v, scale, 0)[:T], attend(qt, kt, vt, scale, 0))),
            "cublas_ms": gpu_ms(lambda: F.linear(xt, w), a.iters, a.repeats),
            "gemm_ms": gpu_ms(lambda: float_gemm(xt, w), a.iters, a.repeats),
            "gemm_err": rel64(lin, F.linear(xt.double(), w.double())),
            "gemm_padded_bits": bool(torch.equal(float_gemm(x, w)[:T], lin)),
            "cublas_padded_bits": bool(torch.equal(F.linear(x, w)[:T], F.linear(xt, w)))}
        print(f"{T:5d} tokens (bucket {P}): attention torch {r['attend_ms']:.3f} ms, sdpa {r['sdpa_ms']:.3f} ms, "
              f"kernel {r['kernel_ms']:.3f} ms (err sdpa {r['sdpa_err']:.1e}, kernel {r['kernel_err']:.1e}, torch "
              f"{r['torch_err']:.1e}; padded bits sdpa {r['sdpa_padded_bits']}, kernel {r['kernel_padded_bits']}, "
              f"torch {r['torch_padded_bits']}); gate cuBLAS {r['cublas_ms']:.4f} ms, kernel {r['gemm_ms']:.4f} ms "
              f"(err {r['gemm_err']:.1e}; padded bits kernel {r['gemm_padded_bits']}, cuBLAS {r['cublas_padded_bits']})",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
