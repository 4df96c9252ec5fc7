"""The decode step's attention kernel alone (kernels/decode_attention.py) by $SPARKD_DECODE_ATTENTION_SPLIT rule,
side by side in one process: one query token of a Qwen3-30B-A3B layer (32 query heads over 4 KV heads of 128)
at each --positions, over the decode bucket's span that holds it (cuda_graphs.buckets: 256, 512, ...), as
the static step runs it (the position on the device). GPU time a call: a CUDA graph of one call per KV
buffer, the buffers rotated past the L2 (as the step's weights evict the cache between layers), median of
--repeats replays (expert_sort_bench.graph_us). Also each rule's relative error against attend in float64 and whether two rules give
the same bits (auto vs serial: equal where one range holds the keys).

    python3 bench/gpu_box/decode_attention_bench.py --positions 8,40,72,100,136,200,300,520,1000 --json out.json
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
L2_BYTES = 128 << 20  # more KV bytes than the H200's 50 MB L2 between two reads of a buffer


def main() -> None:
    from sparkd.engine.kernels import decode_attention as da  # (Triton: not at import)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="8,40,72,100,136,200,300,520,1000")
    ap.add_argument("--rules", default="off,serial,auto")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sinks", action="store_true", help="with an attention sink a head (gpt-oss)")
    ap.add_argument("--json")
    a = ap.parse_args()
    rules, dev = a.rules.split(","), torch.device("cuda")
    torch.manual_seed(0)
    res = {"rules": rules, "rows": []}
    print(f"{'pos':>5s} {'span':>5s} " + " ".join(f"{r + ' us':>10s}" for r in rules) + "  rel err vs float64; bits equal")
    for pos in map(int, a.positions.split(",")):
        span = next(s for s in buckets(1 << 20) if s > pos)
        n_buf = max(12, -(-L2_BYTES // (2 * span * HKV * D * 4)))
        kv = [(torch.randn(span, HKV, D, device=dev), torch.randn(span, HKV, D, device=dev)) for _ in range(n_buf)]
        q = torch.randn(1, H, D, device=dev)
        sinks = torch.randn(H, device=dev) if a.sinks else None
        p = torch.tensor([pos], device=dev)
        want = attend(q.double().cpu(), kv[0][0].double().cpu(), kv[0][1].double().cpu(), 0.088, p.cpu(), 0,
                      None if sinks is None else sinks.double().cpu())
        row = {"pos": pos, "span": span, "buffers": n_buf, "us": {}, "err": {}, "out": {}}
        for rule in rules:
            da.SPLIT_RULE = rule
            da.decode_attention(q, *kv[0], p, 0.088, 0, sinks)  # compile, tickets

            def every_buffer():  # one call a KV buffer: the graph reads each past the L2
                for k, v in kv:
                    da.decode_attention(q, k, v, p, 0.088, 0, sinks)
            row["us"][rule] = graph_us(every_buffer, 1, a.repeats) / n_buf
            out = da.decode_attention(q, *kv[0], p, 0.088, 0, sinks)
            row["err"][rule] = float((out.double().cpu() - want).norm() / want.norm())
            row["out"][rule] = out
        outs = row.pop("out")
        row["bits_equal"] = {f"{x}={y}": bool(torch.equal(outs[x], outs[y]))
                             for i, x in enumerate(rules) for y in rules[i + 1:]}
        res["rows"].append(row)
        print(f"{pos:5d} {span:5d} " + " ".join(f"{row['us'][r]:10.2f}" for r in rules) + "  "
              + " ".join(f"{r} {row['err'][r]:.1e}" for r in rules) + "; " + str(row["bits_equal"]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
