"""A prompt's attention and float GEMM alone, torch against attn11's kernels and the attention
through torch's SDPA (attend_sdpa, the default since session 14), at one layer's shape: GPU time
(CUDA events around --iters calls, median of --repeats), the relative error against torch in
float64, and whether the real rows keep their bits when the prompt is padded to its CUDA-graph
bucket (prompt_graphs.prompt_bucket). attn11's kernel is timed up to --kernel-max tokens (it grows as T^2).

    python3 bench/gpu_box/prefill_attention_bench.py --tokens 128,512,600,1024,2048 --json out.json
(defaults: qwen3-30b-a3b's attention, 32 query heads over 4 KV heads of 128, and its router gate
[128 experts, 2048])

--cached C,...: a prompt of --new T,... tokens continuing a cache of C instead, each way's GPU time inside a
CUDA graph of --iters calls (launches off the clock), median of --repeats replays: eagerly (a host start, keys
0..C+T) attend ("torch"), attend_sdpa's boolean mask ("sdpa"), SDPA's own bottom-right causal mask
(torch.nn.attention.bias.causal_lower_right, bench only: no mask in memory); as a continued graph runs it
(the queries padded to their bucket, positions on the device, keys over the decode bucket's span) attend
("graph_torch") and attend_sdpa ("graph_sdpa"); and the whole prompt's attention from position 0 (C + T
queries, attend_sdpa's causal kernel: what running the prompt whole spends there). Errors: relative
Frobenius against attend in float64 (the real rows).

    python3 bench/gpu_box/prefill_attention_bench.py --new 64,256,1024 --cached 512,2048 --json grid.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from expert_sort_bench import graph_us  # a CUDA graph of calls, median of replays
from torch.nn.attention import sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from sparkd.engine.cuda_graphs import FIRST_BUCKET, buckets
from sparkd.engine.prompt_graphs import prompt_bucket
from sparkd.engine.kernels.float_gemm import float_gemm
from sparkd.engine.kernels.prefill_attention import prefill_attention
from sparkd.engine.layers.attention import SDPA_BACKENDS, attend, attend_sdpa


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


def lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """attend_sdpa for a host start through SDPA's bottom-right causal mask (query t reads keys 0..S - T + t)."""
    H, Hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    with sdpa_kernel(SDPA_BACKENDS):
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           attn_mask=causal_lower_right(q.shape[0], k.shape[0]), scale=scale)
    return o[0].transpose(0, 1)


def continuation_grid(a, H: int, Hkv: int, D: int, gen: torch.Generator) -> dict:
    """--new x --cached: each way's ms and errors (the module docstring)."""
    rows_out, scale = {}, D ** -0.5
    spans = buckets(1 << 16, FIRST_BUCKET)
    for C in map(int, a.cached.split(",")):
        for T in map(int, a.new.split(",")):
            S, P = C + T, prompt_bucket(T)
            span = next(s for s in spans if s >= C + P)
            q = torch.randn(P, H, D, device="cuda", generator=gen)
            k, v = (torch.randn(span, Hkv, D, device="cuda", generator=gen) for _ in range(2))
            qw = torch.randn(S, H, D, device="cuda", generator=gen)
            pos = torch.arange(C, C + P, device="cuda")
            want = attend(q[:T].double(), k[:S].double(), v[:S].double(), scale, C)
            ways = {"torch": lambda: attend(q[:T], k[:S], v[:S], scale, C),
                    "sdpa": lambda: attend_sdpa(q[:T], k[:S], v[:S], scale, C),
                    "lower_right": lambda: lower_right(q[:T], k[:S], v[:S], scale),
                    "graph_torch": lambda: attend(q, k, v, scale, pos),
                    "graph_sdpa": lambda: attend_sdpa(q, k, v, scale, pos),
                    "whole_sdpa": lambda: attend_sdpa(qw, k[:S], v[:S], scale)}
            r = rows_out[f"{T}@{C}"] = {"new": T, "cached": C, "rows": P, "span": span}
            for name, fn in ways.items():
                r[name + "_ms"] = graph_us(fn, a.iters, a.repeats) / 1e3
                if name != "whole_sdpa":
                    r[name + "_err"] = rel64(fn()[:T], want)
            del want
            r["lower_right_bits"] = bool(torch.equal(ways["lower_right"](), ways["sdpa"]()))
            r["graph_sdpa_bits"] = bool(torch.equal(ways["graph_sdpa"]()[:T], ways["sdpa"]()))  # (span > S: may differ)
            best = min(("torch", "sdpa", "lower_right"), key=lambda w: r[w + "_ms"])
            print(f"{T:5d} new over {C:5d} (rows {P}, span {span}): eager torch {r['torch_ms']:.3f} sdpa "
                  f"{r['sdpa_ms']:.3f} lower-right {r['lower_right_ms']:.3f} ms (torch/sdpa "
                  f"{r['torch_ms'] / r['sdpa_ms']:.2f}x, best {best}); graph torch {r['graph_torch_ms']:.3f} sdpa "
                  f"{r['graph_sdpa_ms']:.3f} ms (torch/sdpa {r['graph_torch_ms'] / r['graph_sdpa_ms']:.2f}x); whole "
                  f"{S} sdpa {r['whole_sdpa_ms']:.3f} ms; err torch {r['torch_err']:.1e} sdpa {r['sdpa_err']:.1e} "
                  f"lr {r['lower_right_err']:.1e} graph sdpa {r['graph_sdpa_err']:.1e}; bits lr=sdpa "
                  f"{r['lower_right_bits']}, graph=eager {r['graph_sdpa_bits']}", flush=True)
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="128,512,600,1024")
    ap.add_argument("--heads", default="32,4,128", help="H,Hkv,D")
    ap.add_argument("--gate", default="128,2048", help="the float GEMM's N,K")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kernel-max", type=int, default=1024, help="longest prompt attn11's kernel is timed at")
    ap.add_argument("--new", default="64,256,1024", help="with --cached: the continuation's new tokens")
    ap.add_argument("--cached", help="tokens in the cache: time continuations (--new) instead of whole prompts")
    ap.add_argument("--json")
    a = ap.parse_args()
    H, Hkv, D = (int(x) for x in a.heads.split(","))
    N, K = (int(x) for x in a.gate.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = {"gpu": torch.cuda.get_device_name(), "heads": [H, Hkv, D], "gate": [N, K], "rows": {}}
    if a.cached:
        res["continued"] = continuation_grid(a, H, Hkv, D, gen)
        a.tokens = ""
    w = torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5
    for T in (int(t) for t in a.tokens.split(",") if t):
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
