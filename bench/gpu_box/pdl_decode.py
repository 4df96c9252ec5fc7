"""The graph-replayed decode step with programmatic dependent launch (kernels/pdl.py) off and on,
in one process on one model, rounds alternating off, on three times (a new StaticDecode each, so
each captures its graphs in its mode): greedy tok/s over --tokens steps, then the logits of
--forced teacher-forced steps (the greedy tokens of the first round fed). PDL changes no bits:
every round's greedy tokens and forced logits must be the same bits as the first's (exit code 1
if not); also the eager step's greedy tokens, PDL off and on. Makes the model as decode_profile.py
does. --prefetch off,bulk (session 11, pdl11): the rounds are PDL on in these weight prefetch modes
(pdl.PREFETCHES) in turn, --repeats times, instead of PDL off and on (the same checks; the medians'
ratios over the first mode's). A mode "MODE/RULE" (session 11, pdl12; e.g. off/wave2) runs its rounds with
matmul.split_for's rule RULE (the GEMV configs worked out again): its bits are checked against its own
first round (another split sums in another order), its greedy tokens against the first round's (reported).
--moe-tiles s8,new (session 12, moe22): the rounds are PDL on at these MoE decode tile sets
($SPARKD_MOE_TILES' values, moe_tiles.TILES set in this process) in turn; bits checked per set, as for a
split rule. A set "SET+LAUNCH" (session 13, moe23; e.g. new+start,new+loop): SET with the MoE down launched where
$SPARKD_MOE_DOWN_LAUNCH=LAUNCH has it (moe_tiles.DOWN_LAUNCH set; the same bits, checked per set as above).
On the GPU box:
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
from sparkd.engine.kernels import matmul, moe_tiles, pdl
from sparkd.engine.layers.linear import KernelLinear

ROUNDS = ("off", "on")
DOWN_LAUNCH0 = moe_tiles.DOWN_LAUNCH  # $SPARKD_MOE_DOWN_LAUNCH's (a set without "+LAUNCH")


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


def use_split_rule(net, rule: str) -> None:
    """From now on the GEMVs take their split by rule (KernelLinear works its config out again)."""
    if rule not in matmul.SPLIT_RULES:
        raise SystemExit(f"split rule {rule!r} is not one of {matmul.SPLIT_RULES}")
    matmul.SPLIT_RULE = rule
    for mod in net.modules():
        if isinstance(mod, KernelLinear):
            mod._gemv_configs.clear()


def use_moe_tiles(which: str) -> None:
    """From now on the MoE decode takes tile set `which` (moe_tiles.decode_tiles reads TILES per call), "SET+LAUNCH":
    with the down launched as moe_tiles.DOWN_LAUNCH=LAUNCH has it (read per call too; unset: the default's)."""
    which, _, launch = which.partition("+")
    if which not in moe_tiles.TILE_SETS or launch not in ("", *moe_tiles.DOWN_LAUNCHES):
        raise SystemExit(f"MoE tile set {which!r} is not one of {moe_tiles.TILE_SETS} (+{launch!r}: "
                         f"one of {moe_tiles.DOWN_LAUNCHES})")
    moe_tiles.TILES, moe_tiles.DOWN_LAUNCH = which, launch or DOWN_LAUNCH0


def main() -> int:
    ap = bench_args(__doc__, layers=12, tokens=256)
    ap.add_argument("--forced", type=int, default=32, help="teacher-forced steps whose logits bits are compared")
    ap.add_argument("--prefetch", default="", help="rounds of PDL on in these weight prefetch modes (e.g. off,bulk); "
                    "MODE/RULE: at matmul's split rule RULE (e.g. off/wave2)")
    ap.add_argument("--repeats", type=int, default=3, help="times each mode's round runs, interleaved")
    ap.add_argument("--moe-tiles", default="", help="rounds of PDL on at these MoE tile sets (e.g. s8,new)")
    a = ap.parse_args()
    prefetches = [m for m in a.prefetch.split(",") if m]
    # (label, PDL mode, prefetch mode, split rule, MoE tile set) of each round
    rule0, tiles0 = matmul.SPLIT_RULE, moe_tiles.TILES
    modes = [(f"prefetch {m}", "on", *(m.split("/") + [rule0])[:2], tiles0) for m in prefetches] or [
        (f"moe {t}", "on", pdl.current_prefetch(), rule0, t) for t in a.moe_tiles.split(",") if t] or [
        (m, m, pdl.current_prefetch(), rule0, tiles0) for m in ROUNDS]
    path, m = load_generated(a)
    res = {"model": str(path), "device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
           "pdl_default": pdl.current(), "enabled_auto": pdl.enabled("cuda"), "rounds": []}
    ctx = 512
    try:
        first, firsts = None, {}  # (the first round, the first round of each (split rule, MoE tile set))
        for label, mode, prefetch, rule, tiles in modes * a.repeats:
            use_split_rule(m.net, rule)
            use_moe_tiles(tiles)
            with pdl.using(mode), pdl.prefetching(prefetch):
                r = run(m.net, ctx, a.tokens, first and first["ids"], a.forced)
            first, own = first or r, firsts.setdefault((rule, tiles), r)
            same = r["ids"] == own["ids"] and torch.equal(r["logits"], own["logits"])
            res["rounds"].append({"pdl": label, "tok_s": r["tok_s"], "ms_per_token": r["ms_per_token"],
                                  "same_bits_as_first": same, "split_rule": rule, "moe_tiles": tiles,
                                  "same_tokens_as_first": r["ids"] == first["ids"]})
            print(f"pdl {label:3s} {r['tok_s']:8.1f} tok/s {r['ms_per_token']:.4f} ms/token  greedy tokens and "
                  f"forced logits the bits of the first round at split rule {rule}: {same}; greedy tokens the "
                  f"first round's: {r['ids'] == first['ids']}", flush=True)
        eager = {}
        use_moe_tiles(tiles0)
        for mode, prefetch in (("off", "off"), ("on", modes[-1][2])):  # (PDL on: the last prefetch mode)
            with pdl.using(mode), pdl.prefetching(prefetch):
                eager[mode] = decode(eager_next, m.net, 16, ctx)[0]
        res["eager_on_greedy_equal"] = eager["on"] == eager["off"]
    finally:
        m.close()
    labels = [label for label, *_ in modes]
    by = {label: [r["tok_s"] for r in res["rounds"] if r["pdl"] == label] for label in labels}
    res["median_tok_s"] = {label: statistics.median(v) for label, v in by.items()}
    res["over_first"] = {label: v / res["median_tok_s"][labels[0]] for label, v in res["median_tok_s"].items()}
    res["same_bits"] = all(r["same_bits_as_first"] for r in res["rounds"]) and res["eager_on_greedy_equal"]
    medians = ", ".join(f"{label} {v:.1f} ({res['over_first'][label]:.3f})" for label, v in res["median_tok_s"].items())
    print(f"median tok/s (over the first): {medians}; eager greedy with PDL on equal: {res['eager_on_greedy_equal']}; "
          f"same bits everywhere: {res['same_bits']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if res["same_bits"] else 1


if __name__ == "__main__":
    sys.exit(main())
