"""The graph-replayed decode step with programmatic dependent launch (kernels/pdl.py) off and on,
in one process on one model, rounds alternating off, on three times (a new StaticDecode each, so
each captures its graphs in its mode): greedy tok/s over --tokens steps, then the logits of
--forced teacher-forced steps (the greedy tokens of the first round fed). PDL changes no bits:
every round's greedy tokens and forced logits must be the same bits as the first's (exit code 1
if not); also the eager step's greedy tokens, PDL off and on. Makes the model as decode_profile.py
does. On the GPU box:
    python3 bench/gpu_box/pdl_decode.py --quant Q8_0 --layers 12 --json out.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from decode_profile import PROMPT, bench_args, decode, eager_next, load_generated

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.kernels import pdl

ROUNDS = ("off", "on") * 3


def run(net, ctx: int, n: int, feed: list[int] | None, n_forced: int) -> dict:
    cache = net.new_cache(ctx)
    token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
    step = StaticDecode(net, cache, graphs=True)
    step.prepare(len(PROMPT) + n + n_forced + 1)
    ids = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        ids.append(token)
        token = step.next_token(token)
    seconds = time.perf_counter() - t0
    cache = net.new_cache(ctx)  # teacher-forced logits from the prompt again: the same positions every round
    net(torch.tensor(PROMPT), cache)
    step = StaticDecode(net, cache, graphs=True)
    logits = torch.cat([step(t)[-1:] for t in (feed or ids)[:n_forced]])
    return {"tok_s": n / seconds, "ms_per_token": seconds * 1e3 / n, "ids": ids, "logits": logits}


def main() -> int:
    ap = bench_args(__doc__, layers=12, tokens=256)
    ap.add_argument("--forced", type=int, default=32, help="teacher-forced steps whose logits bits are compared")
    a = ap.parse_args()
    path, m = load_generated(a)
    res = {"model": str(path), "device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
           "pdl_default": pdl.current(), "enabled_auto": pdl.enabled("cuda"), "rounds": []}
    ctx = 512
    try:
        first = None
        for mode in ROUNDS:
            with pdl.using(mode):
                r = run(m.net, ctx, a.tokens, first and first["ids"], a.forced)
            first = first or r
            same = r["ids"] == first["ids"] and torch.equal(r["logits"], first["logits"])
            res["rounds"].append({"pdl": mode, "tok_s": r["tok_s"], "ms_per_token": r["ms_per_token"],
                                  "same_bits_as_first": same})
            print(f"pdl {mode:3s} {r['tok_s']:8.1f} tok/s {r['ms_per_token']:.4f} ms/token  greedy tokens and "
                  f"forced logits the first round's bits: {same}", flush=True)
        eager = {}
        for mode in ("off", "on"):
            with pdl.using(mode):
                eager[mode] = decode(eager_next, m.net, 16, ctx)[0]
        res["eager_on_greedy_equal"] = eager["on"] == eager["off"]
    finally:
        m.close()
    by = {mode: [r["tok_s"] for r in res["rounds"] if r["pdl"] == mode] for mode in ("off", "on")}
    res["median_tok_s"] = {mode: statistics.median(v) for mode, v in by.items()}
    res["on_over_off"] = res["median_tok_s"]["on"] / res["median_tok_s"]["off"]
    res["same_bits"] = all(r["same_bits_as_first"] for r in res["rounds"]) and res["eager_on_greedy_equal"]
    print(f"median tok/s off {res['median_tok_s']['off']:.1f} on {res['median_tok_s']['on']:.1f} "
          f"(on/off {res['on_over_off']:.3f}); eager greedy with PDL on equal: {res['eager_on_greedy_equal']}; "
          f"same bits everywhere: {res['same_bits']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if res["same_bits"] else 1


if __name__ == "__main__":
    sys.exit(main())
