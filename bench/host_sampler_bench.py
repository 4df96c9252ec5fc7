"""The host Sampler per token, before and after ranking only the candidates, side by side in one run.

before: the chain as it was (sampler.filter_logits_sorted: a stable argsort of the whole row, then
the float64 softmax over it, the temperature softmax, torch.multinomial); after: Sampler.__call__
(filter_logits: torch.topk / a logit floor, only the candidates ranked). Both draw from a
generator seeded alike, and the run checks that they pick the same tokens.

Rows: "peaked" (model-like: N(0, 1.5^2) with 48 tokens lifted to 4..14 above it, so top-p 0.95
lies inside the lifted ones) and "flat" (N(0, 2^2): top-p 0.95 needs ~54000 tokens, all of which
top-k 0 then ranks: the worst case). 8 rows of each, cycled; the history for the penalty is the
64 tokens before. The two ways alternate token by token; times are medians, wall clock and the
calling thread's CPU time (meaningful with --threads 1).

Usage: PYTHONPATH=. python bench/host_sampler_bench.py [--vocab 151936] [--tokens 30] [--threads N] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sparkd.engine.sampler import Sampler, SamplingParams, apply_repetition_penalty, filter_logits_sorted

CHAIN = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "t0.8 top-k 40 top-p 0.95 min-p 0.05": SamplingParams(temperature=0.8, **CHAIN),
    "t0.8 top-k 0 top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "t0.8 chain + repetition penalty 1.1/64": SamplingParams(temperature=0.8, repetition_penalty=1.1, **CHAIN),
}


def rows(kind: str, n_vocab: int, n: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        if kind == "flat":
            out.append(torch.randn(n_vocab, generator=g) * 2.0)
            continue
        row = torch.randn(n_vocab, generator=g) * 1.5
        head = torch.randperm(n_vocab, generator=g)[:48]
        row[head] += torch.linspace(14.0, 4.0, 48)
        out.append(row)
    return out


def before_call(sampler: Sampler, logits: torch.Tensor, history: list[int]) -> int:
    """Sampler.__call__ as it was: the full-sort filter in the same chain."""
    p = sampler.params
    if p.temperature == 0:
        return sampler(logits, history)                    # greedy: untouched by the change
    logits = logits.float()
    if p.repetition_window:
        logits = apply_repetition_penalty(logits, history[-p.repetition_window:], p.repetition_penalty)
    filtered = filter_logits_sorted(logits, p.top_k, p.top_p, p.min_p)
    probs = torch.softmax(filtered.double() / p.temperature, dim=0)
    return int(torch.multinomial(probs, 1, generator=sampler.generator))


def run(params: SamplingParams, logits: list[torch.Tensor], tokens: int) -> dict[str, tuple[float, float, list[int]]]:
    """Per way (before, after): median ms per token over `tokens` calls (after one warm-up), wall
    clock and this thread's CPU time (with --threads 1 torch computes in this thread: the CPU time
    leaves out the waits of a busy shared machine), and the tokens picked. The two ways alternate
    token by token, so a busy machine slows both alike."""
    ways = {"before": before_call, "after": Sampler.__call__}
    samplers = {way: Sampler(params) for way in ways}
    history = {way: list(range(64)) for way in ways}
    picked, times, cpu = {way: [] for way in ways}, {way: [] for way in ways}, {way: [] for way in ways}
    for way, call in ways.items():
        call(samplers[way], logits[0], history[way])
        samplers[way].generator.manual_seed(0)
    for i in range(tokens):
        for way, call in ways.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            token = call(samplers[way], logits[i % len(logits)], history[way])
            times[way].append((time.perf_counter() - start) * 1e3)
            cpu[way].append((time.thread_time() - start_cpu) * 1e3)
            picked[way].append(token)
            history[way] = history[way][1:] + [token]
    return {way: (statistics.median(times[way]), statistics.median(cpu[way]), picked[way]) for way in ways}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"vocab {args.vocab}, {args.tokens} tokens per row, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'logits':7} {'case':40} {'before ms':>9} {'after ms':>8} {'x':>5} {'before cpu':>10} "
          f"{'after cpu':>9} {'x':>5}  same tokens")
    results = []
    for kind in ("peaked", "flat"):
        logits = rows(kind, args.vocab)
        for name, params in CASES.items():
            ways = run(params, logits, args.tokens)
            (before_ms, before_cpu, want), (after_ms, after_cpu, got) = ways["before"], ways["after"]
            results.append({"logits": kind, "case": name, "before_ms": round(before_ms, 3),
                            "after_ms": round(after_ms, 3), "speedup": round(before_ms / after_ms, 2),
                            "before_cpu_ms": round(before_cpu, 3), "after_cpu_ms": round(after_cpu, 3),
                            "cpu_speedup": round(before_cpu / after_cpu, 2), "same_tokens": got == want})
            r = results[-1]
            print(f"{kind:7} {name:40} {before_ms:9.3f} {after_ms:8.3f} {r['speedup']:5.2f} {before_cpu:10.3f} "
                  f"{after_cpu:9.3f} {r['cpu_speedup']:5.2f}  {got == want}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vocab": args.vocab, "tokens": args.tokens, "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "results": results}, f, indent=1)
    if not all(r["same_tokens"] for r in results):
        raise SystemExit("the new sampler picked other tokens than the old one")


if __name__ == "__main__":
    main()
