"""The first token of a temperature request drawn on the device (StaticDecode.pick_from) against the host
Sampler's draw it replaced (session 18, draw42), side by side in one process.

The model is loaded and prepared as cmd_generate does it (step and prompt graphs, the kernels' JIT, the draw
chains' warm-up, the request's draw graphs, the host chain's first use), then per setting (greedy, top_k 0,
top_k 40, top_p 0.95), one untimed decode, then --rounds rounds of, in turn:
  host: cli._decode of -n tokens after the prompt, its first token drawn by the host Sampler (the step's
    pick_from replaced by the host's: what `generate` ran before);
  device: the same with the step as it is (the first token drawn on the device).
Each decode is timed as `generate` times its decode (after the prompt's logits are on the host): tok/s.
first_ms: the first pick alone (pick_from after begin_sampling; host: the Sampler's draw), the median of
--picks tries. Tokens: each way's should repeat over the rounds (same seed).

Usage: python bench/first_draw_bench.py MODEL.gguf [-n 128] [--rounds 3] [--picks 5] [--json F] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from draw_gap_bench import PROMPT, SETTINGS, decode, prepared, prompt_logits, sync
from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.models import load_model
from sparkd.engine.sampler import Sampler, SamplingParams, warm_sampler


class HostFirst:
    """The step with the first token drawn by the host Sampler (before this change); the rest is the step's."""

    def __init__(self, step: StaticDecode):
        self._step = step

    def __getattr__(self, name: str):
        return getattr(self._step, name)

    def pick_from(self, logits, sample, history=(), bias=None) -> int:
        return sample(logits, history, bias)


def first_ms(step, prompt, params: SamplingParams, tries: int) -> float:
    row, times = prompt_logits(step, prompt)[-1], []
    for _ in range(tries):
        step.begin_sampling(params, PROMPT)
        sync(step)
        t0 = time.perf_counter()
        step.pick_from(row, Sampler(params), PROMPT)
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--picks", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cpu: the bench's own check (no graphs), not a measurement")
    a = ap.parse_args()
    m = load_model(a.model, device=a.device)
    res: dict = {"n": a.n}
    try:
        step, prompt = prepared(m, a.n, a.device)
        ways = {"host": HostFirst(step), "device": step}
        for name, params in SETTINGS.items():
            if params.temperature > 0:
                step.prepare_draws(params, len(PROMPT) + a.n)
                warm_sampler(params, m.net.cfg.n_vocab)
            decode(step, prompt, params, a.n)
            row = res[name] = {way: {"tok_s": [], "tokens": [], "first_ms": None} for way in ways}
            for _ in range(a.rounds):
                for way, s in ways.items():
                    dt, out = decode(s, prompt, params, a.n)
                    row[way]["tok_s"].append(round(len(out) / dt * 1e3, 1))  # dt in ms
                    row[way]["tokens"].append(out)
            for way, s in ways.items():
                row[way]["first_ms"] = first_ms(s, prompt, params, a.picks)
                toks = row[way].pop("tokens")
                row[way]["repeats"] = all(t == toks[0] for t in toks)
                row[way]["tokens"] = toks[0]
            print(name, {w: {k: v for k, v in r.items() if k != "tokens"} for w, r in row.items()}, flush=True)
    finally:
        m.close()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
