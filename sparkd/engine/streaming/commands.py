"""sparkd-engine subcommands for streaming: plan, simulate-cache, and generate's options."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from sparkd.engine.errors import EngineError
from sparkd.engine.prompt_store import parse_store_mib
from sparkd.engine.streaming.device import UNIFIED_CHOICES
from sparkd.engine.streaming.policies import DEFAULT_POLICY, POLICIES


def add_kv_type_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--kv-type", choices=["auto", "f32", "f16"], default="auto",
                   help="the KV cache rows of attention layers (GQA's keys and values, MLA's latent rows): "
                        "f16 holds and reads half the bytes, rounded once as written (llama.cpp's default); "
                        "auto = f16 with --device cuda, f32 on the CPU")


def add_stream_options(s: argparse.ArgumentParser, size) -> None:
    s.add_argument("--budget", type=size, help="memory budget (default: cgroup memory.max - headroom)")
    s.add_argument("--ctx", type=int, help="positions the KV cache holds (default: 4096, at most the model's trained "
                                         "context; more than the trained context is an error, as serve's)")
    s.add_argument("--batch-tokens", type=int, default=0,
                   help="prompt chunk size (default: up to 512 tokens, as many as 1/32 of the budget holds; "
                        "--resident: the whole prompt where the memory left after the load holds its workspace)")
    s.add_argument("--policy", default=DEFAULT_POLICY, choices=sorted(POLICIES), help="expert cache policy")
    s.add_argument("--prefetch", type=int, default=0, metavar="SLOTS", help="prefetch slots (0: off)")
    # --read-threads, as on serve, where --threads is torch's CPU threads
    s.add_argument("--read-threads", type=int, default=8, help="threads issuing expert reads")
    s.add_argument("--buffered", action="store_true", help="do not use O_DIRECT")
    s.add_argument("--trace", help="record routing to this file")
    s.add_argument("--census", help="warm-start census file")
    s.add_argument("--unified", choices=UNIFIED_CHOICES, default="auto",
                   help="with --device cuda: on = the kernels read streamed experts in place from the pinned "
                        "host arena (zero-copy); off = hot experts also in a VRAM expert cache; auto = off on "
                        "a discrete GPU, on on an integrated one (GB10)")
    s.add_argument("--vram-budget", type=size, metavar="SIZE",
                   help="VRAM expert cache size on a discrete GPU (default: free device memory after trunk, "
                        "KV cache and workspace, minus a margin)")
    add_kv_type_option(s)


def stream_options(a):
    from sparkd.engine.streaming.session import StreamOptions

    return StreamOptions(budget_bytes=a.budget, ctx=a.ctx, batch_tokens=a.batch_tokens, policy=a.policy,
                         prefetch_slots=a.prefetch, threads=a.read_threads, direct=not a.buffered,
                         trace_path=getattr(a, "trace", None), census_path=getattr(a, "census", None),
                         device=getattr(a, "device", "cpu"), unified=a.unified, vram_budget_bytes=a.vram_budget,
                         kv_type=a.kv_type)


def print_plan(budget, plan, out=sys.stderr) -> None:
    if budget.warning:
        print(f"sparkd-engine: WARNING: {budget.warning}", file=out)
    print(f"memory plan:\n{plan.describe()}", file=out)


def cmd_plan(a) -> int:
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.streaming.session import plan_for

    with GGUFModel.open(a.model) as g:  # serve's plan: its prompt store term included
        budget, plan = plan_for(g, replace(stream_options(a), prompt_store_bytes=parse_store_mib(a.prompt_cache_mib)))
    if a.json:
        print(json.dumps(plan.as_dict() | {"budget_warning": budget.warning}, indent=2))
    else:
        print_plan(budget, plan, sys.stdout)
    return 0


def cmd_simulate(a) -> int:
    from sparkd.engine.streaming.simulate import simulate_all
    from sparkd.engine.streaming.trace import census, read_census, read_trace, write_census

    trace = read_trace(a.trace)
    slot = a.slot_bytes or trace.slot_bytes
    if not slot:
        raise EngineError(f"could not size the cache for {a.trace}: the trace has no slot_bytes header; "
                          "give --slot-bytes")
    capacity = a.budget // slot
    if capacity < 1:
        raise EngineError(f"could not simulate a cache of {a.budget} bytes: one expert slot is {slot} bytes")
    warm = read_census(a.census) if a.census else []
    if a.write_census:
        write_census(a.write_census, census(trace))
    rows = simulate_all(trace, capacity, warm)
    per_miss = trace.expert_bytes or slot
    table = [{"policy": r.policy, "requests": r.requests, "hits": r.hits, "misses": r.misses,
              "evictions": r.evictions, "retention": r.retention, "hit_rate": r.hit_rate,
              "bytes_read": r.misses * per_miss, "bytes_per_step": r.misses * per_miss / max(1, trace.steps)}
             for r in rows]
    if a.json:
        print(json.dumps({"capacity_slots": capacity, "steps": trace.steps, "policies": table}, indent=2))
        return 0
    print(f"{a.trace}: {trace.steps} steps, {len(trace.calls)} layer requests; cache {capacity} slots "
          f"of {slot} bytes ({a.budget} bytes)")
    print(f"{'policy':8s} {'requests':>9s} {'hits':>8s} {'misses':>8s} {'evictions':>9s} {'retention':>9s} "
          f"{'hit rate':>8s} {'MiB/step':>9s}")
    for r in table:
        print(f"{r['policy']:8s} {r['requests']:9d} {r['hits']:8d} {r['misses']:8d} {r['evictions']:9d} "
              f"{r['retention']:9.3f} {r['hit_rate']:8.3f} {r['bytes_per_step'] / 2**20:9.2f}")
    return 0


def add_commands(sub, size) -> None:
    s = sub.add_parser("plan", help="print the memory plan for a model and budget")
    s.add_argument("model")
    add_stream_options(s, size)
    s.add_argument("--device", default="cpu", help="cpu, or cuda: plan the device side too")
    s.add_argument("--prompt-cache-mib", default="auto", metavar="N|auto",
                   help="the prompt store's budget, as serve's flag (0: none)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_plan)
    s = sub.add_parser("simulate-cache", help="replay a routing trace through every cache policy")
    s.add_argument("--trace", required=True)
    s.add_argument("--budget", type=size, required=True, help="expert cache size")
    s.add_argument("--slot-bytes", type=int, default=0)
    s.add_argument("--census", help="warm-start census file")
    s.add_argument("--write-census", help="write the trace's census here")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_simulate)
