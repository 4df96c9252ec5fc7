"""GQA through torch's SDPA on CUDA: which backend takes which form of the grouped keys, and at what time and peak
(the rows repeated per query head, the reference of each row's rel_err; the stride-0 keys, attend_sdpa's form; a loop
of KV heads; 16 query heads' rows at a time; enable_gqa). Session 40 on an H100: the efficient kernel takes the
stride-0 form, as fast as the repeated rows or faster at a fraction of their peak (docs/performance.md, session 40;
docs/runs/2026-12-05-s40/call1/sdpa.txt).

Usage: python3 bench/sdpa_gqa_bench.py [--shapes T:S:H:Hkv:D,...] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def forms(q, k, v, causal):
    """name -> a function running SDPA over q [T, H, D], k/v [S, Hkv, D] one way."""
    T, H, D = q.shape
    S, Hkv, _ = k.shape
    g = H // Hkv

    def stride0():
        q4 = q.view(T, Hkv, g, D).permute(1, 2, 0, 3)
        k4 = k.permute(1, 0, 2)[:, None].expand(Hkv, g, S, D)
        v4 = v.permute(1, 0, 2)[:, None].expand(Hkv, g, S, D)
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)

    def repeated():
        q4 = q.permute(1, 0, 2)[None]
        k4 = k.repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
        v4 = v.repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)

    def per_kv_head():
        qh = q.view(T, Hkv, g, D)
        outs = []
        for h in range(Hkv):
            k4 = k[:, h][None, None].expand(1, g, S, D).contiguous()
            v4 = v[:, h][None, None].expand(1, g, S, D).contiguous()
            outs.append(F.scaled_dot_product_attention(qh[:, h].permute(1, 0, 2)[None], k4, v4, is_causal=causal))
        return torch.cat(outs, dim=1)

    def head_blocks(heads: int = 16):  # the rows repeated for `heads` query heads at a time (whole groups)
        step = max(g, heads - heads % g)
        outs = []
        for h in range(0, H, step):
            kv = slice(h // g, (h + step) // g)
            k4 = k[:, kv].repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
            v4 = v[:, kv].repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
            outs.append(F.scaled_dot_product_attention(q[:, h:h + step].permute(1, 0, 2)[None], k4, v4,
                                                       is_causal=causal))
        return torch.cat(outs, dim=1)

    def gqa_flag():
        return F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None],
                                              v.permute(1, 0, 2)[None], is_causal=causal, enable_gqa=True)
    return {"repeated": repeated, "stride0": stride0, "per_kv_head": per_kv_head, "head_blocks16": head_blocks,
            "enable_gqa": gqa_flag}


def efficient_reason(q, k, v, causal) -> str:
    """Whether the memory-efficient kernel takes the stride-0 form (torch's own check, its warnings as the reason)."""
    import warnings

    T, H, D = q.shape
    S, Hkv, _ = k.shape
    g = H // Hkv
    q4 = q.view(T, Hkv, g, D).permute(1, 2, 0, 3)
    k4 = k.permute(1, 0, 2)[:, None].expand(Hkv, g, S, D)
    try:
        from torch.backends.cuda import SDPAParams, can_use_efficient_attention

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                params = SDPAParams(q4, k4, k4, None, 0.0, causal, False)
            except TypeError:
                params = SDPAParams(q4, k4, k4, None, 0.0, causal)
            ok = can_use_efficient_attention(params, True)
        return f"{ok}: " + " | ".join(str(w.message)[:200] for w in caught)
    except Exception as exc:  # an API this torch lacks
        return f"unknown ({type(exc).__name__}: {exc})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8000:8000:32:4:128,512:4096:32:4:128,128:8192:64:4:128,2048:2048:16:8:256")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for spec in a.shapes.split(","):
        T, S, H, Hkv, D = map(int, spec.split(":"))
        g = torch.Generator(device="cuda").manual_seed(T)
        q = torch.randn(T, H, D, device="cuda", generator=g)
        k, v = (torch.randn(S, Hkv, D, device="cuda", generator=g) for _ in range(2))
        causal = T == S
        row = {"shape": spec, "efficient_takes_stride0": efficient_reason(q, k, v, causal)}
        want = None
        for name, run in forms(q, k, v, causal).items():
            try:
                with sdpa_kernel(BACKENDS):
                    run()
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(5):
                        out = run()
                    end.record()
                    torch.cuda.synchronize()
                out = out.reshape(-1)
                want = out if want is None else want
                row[name] = {"ms": round(start.elapsed_time(end) / 5, 3),
                             "peak_mib": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
                             "rel_err": float((out - want).norm() / want.norm())}
            except Exception as exc:
                row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
