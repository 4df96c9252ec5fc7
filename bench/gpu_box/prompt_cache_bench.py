"""A two-turn chat's second-turn prompt time with the prompt cache on and off (serve --prompt-cache),
one Engine (CUDA resident, graphs), interleaved repeats: turn 1 (a prompt of --turn1 tokens and a
--reply-token greedy reply), then turn 2 = turn 1 + the reply + --new tokens, timed to its first
token. Three ways for turn 2: "graph" (the cache continued by a continued prompt graph, the default),
"eager" (the cache continued eagerly: SPARKD_CONTINUE_GRAPHS=0's forward, here continuing at every
length), "off" (the whole prompt). Also the second turn's greedy tokens of each against "off", the
continued prompt's last-token logits against the whole prompt's (continued_gap, which
tests/engine/test_prompt_cache.py checks against its bounds), and the prompt graphs' keys and pool.
--ab: two conversations taking turns instead (A's turn, B's, A's next, ...; no shared prefix), each
turn after the first timed to its first token with the prompt store (serve --prompt-cache-mib, the
default) against the single live cache (--prompt-cache-mib 0: every turn runs whole), interleaved.

    python3 bench/gpu_box/prompt_cache_bench.py --model M.gguf --turn1 48:16:16,88,512 --json out.json
    python3 bench/gpu_box/prompt_cache_bench.py --model M.gguf --ab --turn1 512,1536 --json ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from sparkd.engine.prompt_store import DEFAULT_BYTES, PromptStore
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def turn(engine: Engine, ids: list[int], n: int) -> tuple[list[int], float, int]:
    """(greedy tokens, seconds to the first, prompt tokens reused)."""
    req = GenerationRequest(ids, n, GREEDY)
    t0 = time.perf_counter()
    out, first = [], None
    for token in engine.generate(req, threading.Event()):
        torch.cuda.synchronize()
        first = first or time.perf_counter() - t0
        out.append(token)
    return out, first, req.cached_tokens


def continued_gap(engine: Engine, ids: torch.Tensor, cut: int) -> float:
    """max |logits of the prompt's last token continued at cut (rows up to cut from a prompt
    forward, the rest fed one token a step up to the last, then the last as a prompt) - the whole
    prompt's| / max |whole prompt's|: a chat turn's path through the engine's own forward and step."""
    cache, forward = engine._cache, engine._prompt
    cache.reset()
    whole = forward(ids, last=True)[-1]
    cache.reset()
    forward(ids[:cut], last=True)
    for token in ids[cut:-1].tolist():
        engine._step(token)
    continued = forward(ids[-1:], last=True)[-1]
    engine._held.begin([])  # the rows are not a request's
    return float((continued - whole).abs().max() / whole.abs().max())


def ab_case(engine: Engine, n1: int, n_reply: int, n_new: int, reps: int) -> dict:
    """A and B (n1-token first prompts) take turns for 1 + reps rounds with the store, then with the
    single cache, all of it twice (the first pass captures every prompt graph both need: lazily, a
    capture would land in a timed turn); -> per mode the second pass's first-token seconds of rounds
    1.., cached tokens, replies, the store's counters."""
    convs = {c: [(k * i + k) % 400 + 10 for i in range(n1)] for c, k in (("A", 7), ("B", 13))}
    res = {}
    for mode in ("store", "single") * 2:
        engine._store = PromptStore(DEFAULT_BYTES) if mode == "store" else None
        engine._cache.reset(), engine._held.begin([])
        prompts, times, cached, replies = dict(convs), [], [], []
        for r in range(reps + 1):
            for c, k in (("A", 11), ("B", 17)):
                out, first, n = turn(engine, prompts[c], n_reply)
                if r:
                    times.append(first)
                    cached.append(n)
                replies.append(out)
                prompts[c] = prompts[c] + out + [(k * i + r) % 400 + 10 for i in range(n_new)]
        res[mode] = {"first_token_s": statistics.median(times), "times": times, "cached": cached,
                     "replies": replies, "store": engine.prompt_store_stats()}
    engine._store = PromptStore(engine.memory_plan()["prompt_store"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--turn1", default="512,1536",
                    help="turn-1 prompt lengths, each optionally T1:REPLY:NEW (else --reply and --new)")
    ap.add_argument("--reply", type=int, default=64)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--ab", action="store_true", help="two conversations taking turns: the store against one cache")
    ap.add_argument("--no-gap", action="store_true",
                    help="skip the logits gap (it steps through every token after turn 1: long for many new tokens)")
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(a.model, ctx=a.ctx, device="cuda", resident=True, cuda_graphs="on", prompt_graphs="lazy")
    t0 = time.perf_counter()
    engine.load()
    res = {"load_s": time.perf_counter() - t0, "cases": {}}
    prompt = engine._prompt
    for case in a.turn1.split(","):
        n1, n_reply, n_new = (list(map(int, case.split(":"))) + [a.reply, a.new])[:3]
        if a.ab:
            ab = res["cases"][case] = ab_case(engine, n1, n_reply, n_new, a.reps)
            st, one = ab["store"], ab["single"]
            print(f"A/B turns of {n1} + reply {n_reply} + {n_new} new: first token with the store "
                  f"{st['first_token_s'] * 1e3:.1f} ms (cached {st['cached']}), single cache "
                  f"{one['first_token_s'] * 1e3:.1f} ms (cached {one['cached']}): single/store "
                  f"{one['first_token_s'] / st['first_token_s']:.2f}x; same tokens {st['replies'] == one['replies']}; "
                  f"store {st['store']}", flush=True)
            continue
        engine._store = None  # the live cache alone: the store would hold the last repeat's turn 2 whole
        ids1 = [(7 * i + 3) % 5000 + 10 for i in range(n1)]
        times = {"graph": [], "eager": [], "off": []}
        tokens = {}
        for rep in range(a.reps + 1):  # rep 0 warms (JIT, graphs) and is not counted
            for mode in times:
                engine.prompt_cache = True
                reply, _, _ = turn(engine, ids1, n_reply)  # the cache now holds turn 1 and its reply
                engine.prompt_cache = mode != "off"
                prompt.continued = mode != "eager"
                if mode == "eager":  # continue at every length (the engine itself would run <= 1024 whole)
                    prompt.continues = lambda n, start, last=True: True
                ids2 = ids1 + reply + [(11 * i + 5) % 5000 + 10 for i in range(n_new)]
                try:
                    out, first, cached = turn(engine, ids2, 16)
                finally:
                    prompt.continued = True
                    prompt.__dict__.pop("continues", None)
                tokens[mode] = out, cached
                if rep:
                    times[mode].append(first)
        gap = float("nan") if a.no_gap else continued_gap(engine, torch.tensor(ids2), n1)
        med = {mode: statistics.median(t) for mode, t in times.items()}
        res["cases"][case] = {"turn2_tokens": len(ids2), "cached": tokens["graph"][1], "new": len(ids2) - tokens["graph"][1],
                              "first_token_s": med, "times": times,
                              "same_tokens": {m: tokens[m][0] == tokens["off"][0] for m in ("graph", "eager")},
                              "logits_gap": gap}
        print(f"turn 1 {n1} tokens + reply {n_reply} + {n_new} new = {len(ids2)}: cached {tokens['graph'][1]} "
              f"(eager {tokens['eager'][1]}, off {tokens['off'][1]}), first token graph {med['graph'] * 1e3:.1f} ms, "
              f"eager {med['eager'] * 1e3:.1f} ms, off {med['off'] * 1e3:.1f} ms (off/graph "
              f"{med['off'] / med['graph']:.2f}x, eager/graph {med['eager'] / med['graph']:.2f}x), same greedy tokens "
              f"as off: graph {tokens['graph'][0] == tokens['off'][0]}, eager {tokens['eager'][0] == tokens['off'][0]}, "
              f"logits gap {gap:.3g}", flush=True)
    res["prompt_graphs"] = engine.prompt_graph_stats()
    res["pool_bytes"] = {str(key): n for key, n in prompt.pool_bytes.items()}
    res["failed"] = {str(key): why for key, why in prompt.failed.items()}
    print(f"prompt graphs {res['prompt_graphs']}, pool bytes by key {res['pool_bytes']}, failed {res['failed']}")
    engine.close()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
