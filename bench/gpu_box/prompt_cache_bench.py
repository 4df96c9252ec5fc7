"""A two-turn chat's second-turn prompt time with the prompt cache on and off (serve --prompt-cache),
one Engine (CUDA resident, graphs), interleaved repeats: turn 1 (a prompt of --turn1 tokens and a
--reply-token greedy reply), then turn 2 = turn 1 + the reply + --new tokens, timed to its first
token. Also the second turn's greedy tokens on and off, and the continued prompt's last-token
logits against the whole prompt's (tests/engine/test_prompt_cache.continued_gap).

    python3 bench/gpu_box/prompt_cache_bench.py --model M.gguf --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine"))
from test_prompt_cache import continued_gap  # noqa: E402

from sparkd.engine.runtime import Engine, GenerationRequest  # noqa: E402
from sparkd.engine.sampler import SamplingParams  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--turn1", default="512,1536", help="turn-1 prompt lengths")
    ap.add_argument("--reply", type=int, default=64)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(a.model, ctx=a.ctx, device="cuda", resident=True, cuda_graphs="on", prompt_graphs="lazy")
    t0 = time.perf_counter()
    engine.load()
    res = {"load_s": time.perf_counter() - t0, "cases": {}}
    for n1 in map(int, a.turn1.split(",")):
        ids1 = [(7 * i + 3) % 5000 + 10 for i in range(n1)]
        times = {"on": [], "off": []}
        tokens = {}
        for rep in range(a.reps + 1):  # rep 0 warms (JIT, graphs) and is not counted
            for mode in ("on", "off"):
                engine.prompt_cache = True
                reply, _, _ = turn(engine, ids1, a.reply)  # the cache now holds turn 1 and its reply
                engine.prompt_cache = mode == "on"
                ids2 = ids1 + reply + [(11 * i + 5) % 5000 + 10 for i in range(a.new)]
                out, first, cached = turn(engine, ids2, 16)
                tokens[mode] = out, cached, len(ids2)
                if rep:
                    times[mode].append(first)
        gap = continued_gap(engine, torch.tensor(ids2), n1)
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        res["cases"][n1] = {"turn2_tokens": len(ids2), "cached": tokens["on"][1], "first_token_s_on": on,
                            "first_token_s_off": off, "speedup": off / on, "times": times,
                            "same_tokens": tokens["on"][0] == tokens["off"][0], "logits_gap": gap}
        print(f"turn 1 {n1} tokens + reply {a.reply} + {a.new} new = {len(ids2)}: cached {tokens['on'][1]}, "
              f"first token on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms ({off / on:.2f}x), same greedy tokens "
              f"{tokens['on'][0] == tokens['off'][0]}, logits gap {gap:.3g}", flush=True)
    engine.close()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
