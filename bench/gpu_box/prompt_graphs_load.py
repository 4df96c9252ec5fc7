"""The prompt graphs' capture at load (`sparkd-engine serve --prompt-graphs`) against capture on a
bucket's first request: load time, each request's time to its first token, the graphs' memory.

For each --modes choice (lazy, auto, or a list of prompt lengths) an Engine as `serve --device cuda
--resident` makes it loads the model (timed; the engine's log lines with each bucket's capture time
and pool growth are kept), then serves requests of each --tokens length twice, one token each
(a new bucket's first request, then a replay): seconds to the first token. Then, on the last
engine, each of --alone's buckets captured alone into a fresh pool (PromptForward over the engine's
cache): the memory a bucket's graph holds by itself (the engine's buckets share one pool, so
there a bucket adds only what the largest one before it did not hold).
    python3 bench/gpu_box/prompt_graphs_load.py --model q3-12-Q8_0.gguf --modes lazy,auto --json out.json
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

from sparkd.engine.prompt_graphs import PromptForward
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import SamplingParams


def first_token_s(engine: Engine, n: int) -> float:
    req = GenerationRequest([(7 * i + 3) % 1000 + 10 for i in range(n)], 1, SamplingParams(temperature=0.0))
    t0 = time.perf_counter()
    next(iter(engine.generate(req, threading.Event())))
    return time.perf_counter() - t0


def run_mode(path: str, mode: str, lengths: list[int], ctx: int) -> tuple[dict, Engine]:
    logged: list[str] = []
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    engine = Engine(path, ctx=ctx, device="cuda", resident=True, cuda_graphs="on", prompt_graphs=mode,
                    prompt_cache=False,  # each prompt from an empty cache: what the graphs serve
                    log=lambda line: logged.append(f"{time.perf_counter():.3f} {line}"))
    t0 = time.perf_counter()
    engine.load()
    res = {"load_s": time.perf_counter() - t0, "reserved_after_load_mib": (torch.cuda.memory_reserved() - base) / 2**20,
           "stats_after_load": engine.prompt_graph_stats(), "requests": {}}
    for n in lengths:
        res["requests"][n] = {"first_s": first_token_s(engine, n), "again_s": first_token_s(engine, n)}
        print(f"{mode:>12s} {n:5d} tokens: first request {res['requests'][n]['first_s'] * 1e3:7.1f} ms, "
              f"again {res['requests'][n]['again_s'] * 1e3:6.1f} ms", flush=True)
    res["stats"], res["log"] = engine.prompt_graph_stats(), logged
    print(f"{mode:>12s}: load {res['load_s']:.1f} s, {res['stats']}", flush=True)
    return res, engine


def alone(engine: Engine, spans: list[int]) -> dict[int, float]:
    """MiB each bucket's graph holds in a pool of its own."""
    out = {}
    for span in spans:
        p = PromptForward(engine.net, engine._cache)
        engine._cache.n_past = 0
        p.warm([span])
        out[span] = p.pool_bytes.get(span, float("nan")) / 2**20
        del p
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        print(f"bucket {span} alone: {out[span]:.0f} MiB", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--modes", default="lazy,auto", help="--prompt-graphs choices, ';' between them")
    ap.add_argument("--tokens", default="40,128,200,512,600,1000")
    ap.add_argument("--alone", default="64,128,256,512,1024")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json")
    a = ap.parse_args()
    lengths = [int(t) for t in a.tokens.split(",")]
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "modes": {}}
    modes = a.modes.split(";") if ";" in a.modes else a.modes.split(",")
    for i, mode in enumerate(modes):
        res["modes"][mode], engine = run_mode(a.model, mode, lengths, a.ctx)
        if i == len(modes) - 1 and a.alone:
            res["alone_mib"] = alone(engine, [int(s) for s in a.alone.split(",")])
        engine.close()
        del engine
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
