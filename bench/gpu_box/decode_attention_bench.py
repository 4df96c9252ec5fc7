"""The decode step's attention kernel alone (kernels/decode_attention.py) by $SPARKD_DECODE_ATTENTION_SPLIT rule,
side by side in one process: one query token of a Qwen3-30B-A3B layer (32 query heads over 4 KV heads of 128)
at each --positions, over the decode bucket's span that holds it (cuda_graphs.buckets: 256, 512, ...), as
the static step runs it (the position on the device). GPU time a call: a CUDA graph of one call per KV
buffer, the buffers rotated past the L2 (as the step's weights evict the cache between layers), median of
--repeats replays (expert_sort_bench.graph_us). Also each rule's relative error against attend in float64 and
whether each rule gives the first rule's bits (auto vs serial: equal where one range holds the keys). "grouped:R"
(session 29) runs "grouped" at R ranges a head block (grouped_attention.RANGES, PROGRAMS 0), "grouped:R:F" (R may
be empty) with the fold's FOLD_VALUES F too. A rule ending in "@f16" (session 30) reads float16 KV rows (--kv-type
f16): the same values rounded, so its error against float64 is the rounding's.
--mla H (session 31) times DeepSeek V3's latent attention instead: H query heads over one 576-wide latent key row a
position whose first 512 columns are the values (a view of the keys, as layers/mla.py passes them).

--fused (session 28) times the step's whole attention instead: rope_kv then decode_attention "auto" (two
launches, "rope+auto") against kernels/rope_attention.py at each --tiles value of its TILE_VALUES ("fused:4096":
32-key ranges at 128 wide) and against rope_kv then each --rules rule but auto ("rope+grouped"), qwen3's q/k norms
folded in, the token's raw q, k, v as the qkv GEMV leaves them; the error is each form's against rope+auto's output.

    python3 bench/gpu_box/decode_attention_bench.py --rules auto,grouped --positions 8,136,1000,8000,32000
    python3 bench/gpu_box/decode_attention_bench.py --fused --tiles 4096 --rules grouped --positions 8,264,520,2000
    python3 bench/gpu_box/decode_attention_bench.py --rules grouped,grouped@f16 --positions 1000,8000,32000
    python3 bench/gpu_box/decode_attention_bench.py --fused --tiles 4096,4096@f16 --rules grouped,grouped@f16
    python3 bench/gpu_box/decode_attention_bench.py --mla 128 --rules auto,grouped,grouped@f16 --positions 8,8000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from expert_sort_bench import graph_us  # a CUDA graph of calls, median of replays

from sparkd.engine.cuda_graphs import buckets
from sparkd.engine.layers.attention import attend

H, HKV, D = 32, 4, 128
LATENT, ROPE = 512, 64  # --mla: DeepSeek V3's kv_lora_rank and rope dims
L2_BYTES = 128 << 20  # more KV bytes than the H200's 50 MB L2 between two reads of a buffer


def main() -> None:
    from sparkd.engine.kernels import decode_attention as da  # (Triton: not at import)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="8,40,72,100,136,200,300,520,1000")
    ap.add_argument("--rules", default="auto,grouped", help="decode_attention.SPLIT_RULE values; grouped:R sets "
                    "grouped_attention's ranges a head block, grouped:R:F its FOLD_VALUES too; a suffix @f16 reads "
                    "float16 KV rows")
    ap.add_argument("--fused", action="store_true",
                    help="rope_kv + attention (auto) against rope_attention and rope_kv + each --rules rule")
    ap.add_argument("--tiles", default="4096,8192", help="with --fused: rope_attention.TILE_VALUES values (a suffix "
                    "@f16 as --rules')")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sinks", action="store_true", help="with an attention sink a head (gpt-oss)")
    ap.add_argument("--mla", type=int, default=0, metavar="H",
                    help="H query heads over MLA's latent rows (DeepSeek V3: 128) instead of Qwen3's GQA")
    ap.add_argument("--json")
    a = ap.parse_args()
    rules = a.rules.split(",")
    if a.fused:
        rules = ["rope+auto", *(f"fused:{t}" for t in a.tiles.split(",")), *(f"rope+{r}" for r in rules if r != "auto")]
    elif rules[0].endswith("@f16"):
        raise SystemExit("the first rule is the others' reference for bits: give it float32 rows")
    if a.mla and (a.fused or a.sinks):
        raise SystemExit("--mla times decode_attention alone, without sinks")
    heads, kv_heads, dk, dv = (a.mla, 1, LATENT + ROPE, LATENT) if a.mla else (H, HKV, D, D)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    res = {"rules": rules, "fused": a.fused, "rows": []}
    print(f"{'pos':>5s} {'span':>5s} " + " ".join(f"{r + ' us':>12s}" for r in rules)
          + ("  rel err vs rope+auto" if a.fused else "  rel err vs float64; bits equal"))
    for pos in map(int, a.positions.split(",")):
        span = next(s for s in buckets(1 << 20) if s > pos)
        row_values = kv_heads * (dk if a.mla else dk + dv)  # a position's (MLA: the values inside the keys)
        n_buf = max(12, -(-L2_BYTES // (span * row_values * 2)))  # (float16 rows: 2 bytes a value)
        kv = [kv_rows(torch.randn(span, kv_heads, dk, device=dev), dv, a.mla) for _ in range(n_buf)]
        rows = {"f32": kv}
        if any(r.endswith("@f16") for r in rules):
            rows["f16"] = [kv_rows(k.half(), dv, a.mla, v.half()) for k, v in kv]
        q = torch.randn(1, heads, dk, device=dev)
        sinks = torch.randn(heads, device=dev) if a.sinks else None
        p = torch.tensor([pos], device=dev)
        row = {"pos": pos, "span": span, "buffers": n_buf, "us": {}, "err": {}, "out": {}}
        call = fused_calls(q, sinks, p, span, dev) if a.fused else None
        for rule in rules:
            name, _, kv_type = rule.partition("@")
            bufs = rows[kv_type or "f32"]
            if a.fused:
                def one(k, v, name=name):
                    return call(name, k, v)
            else:
                def one(k, v, name=name):
                    set_rule(name)
                    return da.decode_attention(q, k, v, p, 0.088, 0, sinks)
            one(*bufs[0])  # compile, tickets

            def every_buffer(bufs=bufs, one=one):  # one call a KV buffer: the graph reads each past the L2
                for k, v in bufs:
                    one(k, v)
            row["us"][rule] = graph_us(every_buffer, 1, a.repeats) / n_buf
            row["out"][rule] = one(*bufs[0])
        outs = row.pop("out")
        if a.fused:
            row["err"] = {r: rel(outs[r], outs["rope+auto"]) for r in rules[1:]}
        else:
            want = attend(q.double().cpu(), kv[0][0].double().cpu(), kv[0][1].double().cpu(), 0.088, p.cpu(), 0,
                          None if sinks is None else sinks.double().cpu())
            row["err"] = {r: rel(outs[r], want) for r in rules}
            row["bits_equal"] = {f"{x}={y}": bool(torch.equal(outs[x], outs[y]))
                                 for x in rules[:1] for y in rules[1:]}
        res["rows"].append(row)
        print(f"{pos:5d} {span:5d} " + " ".join(f"{row['us'][r]:12.2f}" for r in rules) + "  "
              + " ".join(f"{r} {e:.1e}" for r, e in row["err"].items()) + ("" if a.fused else f"; {row['bits_equal']}"),
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


def kv_rows(k, dv, mla, v=None):
    """A buffer's (keys, values): MLA's values are a view of the keys' first dv columns, else v (None: random)."""
    if mla:
        return k, k[..., :dv]
    return k, torch.randn(*k.shape[:2], dv, dtype=k.dtype, device=k.device) if v is None else v


def set_rule(rule: str) -> None:
    """decode_attention.SPLIT_RULE = rule; "grouped:R" also sets grouped_attention's ranges a head block to R (its
    default: range_count), "grouped:R:F" (R may be empty) its FOLD_VALUES to F."""
    from sparkd.engine.kernels import decode_attention as da
    from sparkd.engine.kernels import grouped_attention as ga

    name, ranges, fold = (rule.split(":") + ["", ""])[:3]
    da.SPLIT_RULE = name
    ga.RANGES, ga.PROGRAMS = (int(ranges), 0) if ranges else (32, 128)
    ga.FOLD_VALUES = int(fold or 16384)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want.double().cpu()).norm() / want.double().cpu().norm())


def fused_calls(q, sinks, p, span, dev):
    """call(rule, k_cache, v_cache) → the attention output of the token (raw q; its k, v rows and qwen3's q/k
    norms fixed here) with the cache rows at p written: "rope+auto" as two launches, "fused:N" as rope_attention
    at TILE_VALUES N."""
    from sparkd.engine.kernels import decode_attention as da
    from sparkd.engine.kernels import rope_attention as ra
    from sparkd.engine.kernels.rope_kv import rope_kv
    from sparkd.engine.layers.rope import RopeConfig, rope_cos_sin

    cos, sin = (t.to(dev) for t in rope_cos_sin(RopeConfig(n_rot=D, base=1e6, neox=True), torch.arange(span)))
    k_new, v_new = torch.randn(1, HKV, D, device=dev), torch.randn(1, HKV, D, device=dev)
    norms = (torch.rand(D, device=dev) + 0.5, torch.rand(D, device=dev) + 0.5, 1e-6)

    def call(rule, k, v):
        if rule.startswith("rope+"):
            set_rule(rule[len("rope+"):])
            q_rot = rope_kv(q, k_new, v_new, cos, sin, p, k, v, True, norms)
            return da.decode_attention(q_rot, k, v, p, 0.088, 0, sinks)
        ra.TILE_VALUES = int(rule.split(":")[1])
        return ra.rope_attention(q, k_new, v_new, cos, sin, p, k, v, True, norms, 0.088, 0, sinks)
    return call


if __name__ == "__main__":
    main()
