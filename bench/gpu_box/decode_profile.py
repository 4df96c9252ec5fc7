"""Where one resident CUDA decode step goes, eager vs CUDA graphs, on a generated model.

Makes a GGUF of a make-model --preset's shape (default qwen3-30b-a3b; --layers at the real widths, --experts to
cut the expert count: session 31's MLA runs --preset deepseek-v3 --experts 16 --layers 5), loads it with
--device cuda semantics (experts resident as raw blocks), its caches' rows of --kv-type (auto: f16, as
`generate --device cuda`), then:
  1. eager decode: tok/s over --tokens steps;
  2. a per-stage profile of --profile-tokens eager steps (torch.profiler, one record_function
     range per stage set by module hooks): host (CPU) ms and GPU kernel ms per token per stage,
     and the host synchronisations per token;
  3. CUDA graphs (StaticDecode, one graph per bucket, the greedy token picked on the GPU as
     `generate` does: StaticDecode.next_token; $SPARKD_DEVICE_ARGMAX=0 brings the logits row back
     and picks on the host, as before session 6): tok/s, GPU kernel ms per replayed step,
     and whether its greedy tokens equal the eager ones (and eager's its own rerun: the sums are
     ordered since session 3's kern4, so both should match; before, atomics made the last bits
     vary run to run and near-tied greedy picks of a random-weight model flipped);
  4. teacher-forced logits (both fed eager's tokens): graphs vs eager and eager vs eager.
Prints a table and writes JSON. Run on the GPU box from the checkout root:
    python3 bench/gpu_box/decode_profile.py --quant Q8_0 --layers 2 --json out.json
    python3 bench/gpu_box/decode_profile.py --preset deepseek-v3 --experts 16 --layers 5 --quant Q4_K --json mla.json
    python3 bench/gpu_box/decode_profile.py --preset kimi-k3 --experts 32 --layers 5 --quant Q4_K --eager-only \
      --py-top 25
(--eager-only: steps 1, 2 and the Python profile only: the eager step alone, or a model graphs refuse.)
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from launch_count import count_kernels
from torch.profiler import ProfilerActivity, profile, record_function

from sparkd.engine.cuda_graphs import StaticDecode, device_argmax_default, graph_blocker
from sparkd.engine.kernels import fused
from sparkd.engine.layers.kv_cache import KV_TYPES, kv_type_name
from sparkd.engine.layers.moe import MoE
from sparkd.engine.models import load_model

PROMPT = [1, 7, 42, 3, 99, 5, 17, 8]
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
              "cuStreamSynchronize", "cudaEventSynchronize")


def stage_of(name: str, module: torch.nn.Module) -> str | None:
    """The profile stage of a module by its place in the network (None: not a stage)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("q_norm", "k_norm"):  # inside attention: a stage of its own, so attention's self time is right
        return "attention q/k norms"
    if "norm" in leaf:
        return "norms"
    if leaf in ("wq", "wk", "wv", "wqkv", "wqk", "wo", "wq_a", "wq_b", "wkv_a"):  # (the last three: MLA's)
        return "attention projections"
    if leaf == "attn":
        return "rope + KV write + attention math"
    if leaf in ("compressor", "indexer"):  # DeepSeek V4's, inside its attention
        return f"attention's {leaf}"
    if leaf == "router":
        return "router"
    if leaf == "shared":
        return "shared experts"
    if leaf == "ffn":
        return "routed experts (MoE kernels)" if isinstance(module, MoE) else "dense FFN"
    if name == "output":
        return "output head"
    return None


class Stages:
    """record_function ranges around each stage module; a module's range holds its children's,
    so a stage's own time is its total minus its staged children (see report)."""

    def __init__(self, net: torch.nn.Module):
        self.handles, self.open = [], {}
        self.children: dict[str, set[str]] = defaultdict(set)  # stage → stages nested in it
        modules = dict(net.named_modules())
        for name, mod in modules.items():
            stage = stage_of(name, mod)
            if stage is None:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._enter(name, stage)))
            self.handles.append(mod.register_forward_hook(self._exit(name)))
            parent = name.rpartition(".")[0]
            if parent and (outer := stage_of(parent, modules[parent])):
                self.children[outer].add(stage)
        orig_embed = net.embed

        def embed(tokens):
            with record_function("stage:embedding"):
                return orig_embed(tokens)
        net.embed = embed

    def _enter(self, name, stage):
        def hook(mod, args):
            rf = record_function(f"stage:{stage}")
            rf.__enter__()
            self.open[name] = rf
        return hook

    def _exit(self, name):
        def hook(mod, args, out):
            self.open.pop(name).__exit__(None, None, None)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def kernel_us(events) -> float:
    """GPU time of the kernels, copies and memsets among profiler events (not annotations)."""
    return sum(e.time_range.elapsed_us() for e in events
               if e.device_type.name == "CUDA" and not e.name.startswith("stage:"))


def host_events(events, prefix: str):
    return [e for e in events if e.device_type.name == "CPU" and e.name.startswith(prefix)]


def eager_step(net, cache):
    return lambda t: net(torch.tensor([t]), cache)


def eager_next(net, cache):
    """token -> the next greedy token, eager (the logits row comes back, the host picks)."""
    return lambda t: int(net(torch.tensor([t]), cache)[-1].argmax())


def graphed_next(n_total: int):
    """token -> the next greedy token, graph replay picking as `generate` does (next_token)."""
    return lambda net, cache: graphed(n_total)(net, cache).next_token


def decode(next_of, net, n: int, ctx: int):
    """Greedy: (tokens, seconds for the n decode steps); next_of(net, cache) steps a token."""
    cache = net.new_cache(ctx)
    token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
    step = next_of(net, cache)
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        out.append(token)
        token = step(token)
    return out, time.perf_counter() - t0


def forced(step_of, net, ids: list[int], ctx: int) -> torch.Tensor:
    """Logits [n, V] of each step fed the given tokens (teacher forcing: paths cannot diverge)."""
    cache = net.new_cache(ctx)
    net(torch.tensor(PROMPT), cache)
    step = step_of(net, cache)
    return torch.cat([step(t)[-1:] for t in ids])


def agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Worst per-step relative error and the share of steps whose argmax agrees."""
    err = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max()
    return {"max_rel_err": float(err), "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def graphed(n_total: int):
    def make(net, cache):
        s = StaticDecode(net, cache, graphs=True)
        s.prepare(n_total)  # capture outside the timed loop
        return s
    return make


def profile_eager(net, n: int, ctx: int) -> dict:
    stages = Stages(net)
    cache = net.new_cache(ctx)
    logits = net(torch.tensor(PROMPT), cache)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(logits[-1].argmax())
            logits = net(torch.tensor([tok]), cache)
        wall = time.perf_counter() - t0
    stages.remove()
    del net.embed
    return {"wall_ms": wall * 1e3 / n, **stage_report(prof.events(), stages, n)}


def python_profile(net, n: int, ctx: int, top: int) -> list[tuple[str, float, float, int]]:
    """The eager step's Python functions by their own host time (cProfile over n steps): [(function, own ms a
    token, cumulative ms a token, calls a token)], the most own time first; where the host part of a step goes
    below the module stages (wrappers, cache bookkeeping, Triton's launcher)."""
    import cProfile
    import pstats

    cache = net.new_cache(ctx)
    logits = net(torch.tensor(PROMPT), cache)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        logits = net(torch.tensor([int(logits[-1].argmax())]), cache)
    prof.disable()
    rows = []
    for (file, line, func), (_, calls, own, cum, _) in pstats.Stats(prof).stats.items():
        rows.append((f"{Path(file).name}:{line}({func})", own * 1e3 / n, cum * 1e3 / n, round(calls / n, 1)))
    return sorted(rows, key=lambda r: -r[1])[:top]


def stage_report(events, stages: Stages, n: int) -> dict:
    """Per n steps of a profile taken with `stages` hooked: GPU kernel ms, each stage's own host
    and GPU ms (its staged children's taken out), host syncs and kernel launches."""
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # stage → [cpu us, device us, calls]
    for e in host_events(events, "stage:"):
        t = total[e.name[6:]]
        t[0] += e.cpu_time_total
        t[1] += e.device_time_total
        t[2] += 1
    rows = {}
    for stage, (cpu, dev, count) in total.items():
        for child in stages.children.get(stage, ()):
            if child in total:
                cpu -= total[child][0]
                dev -= total[child][1]
        rows[stage] = {"host_ms": cpu / 1e3 / n, "gpu_ms": dev / 1e3 / n, "calls": count / n}
    calls = defaultdict(int)
    for e in events:
        if e.device_type.name == "CPU":
            calls[e.name] += 1
    launches = sum(calls[k] for k in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    return {"kernel_ms": kernel_us(events) / 1e3 / n, "stages": rows,
            "host_sync_calls_per_token": {k: calls[k] / n for k in SYNC_CALLS if calls[k]},
            "launches_per_token": launches / n}


def profile_graphs(net, n: int, ctx: int) -> dict:
    cache = net.new_cache(ctx)
    logits = net(torch.tensor(PROMPT), cache)
    step = StaticDecode(net, cache, graphs=True)
    step.prepare(len(PROMPT) + n)
    token = int(logits[-1].argmax())
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            token = step.next_token(token)
        wall = time.perf_counter() - t0
    kernels = count_kernels(prof.events())
    return {"wall_ms": wall * 1e3 / n, "kernel_ms": kernel_us(prof.events()) / 1e3 / n,
            "kernels_per_token": kernels["kernels"] / n, "copies_per_token": kernels["copies"] / n,
            "top_kernels_per_token": {k: v / n for k, v in list(kernels["names"].items())[:25]},
            "kernel_us_per_token": kernel_time_by_name(prof.events(), n)}


def kernel_time_by_name(events, n: int) -> dict:
    """{kernel name: [launches per token, GPU us per token]}, the most time first: where a step goes."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in events:
        if e.device_type.name == "CUDA" and not e.name.startswith("stage:"):
            by_name[e.name][0] += 1 / n
            by_name[e.name][1] += e.time_range.elapsed_us() / n
    return dict(sorted(by_name.items(), key=lambda kv: -kv[1][1]))


def make(path: Path, preset: str, quant: str, layers: int, experts: int | None) -> None:
    if path.exists():
        return
    subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "make-model", str(path), "--preset", preset,
                    "--layers", str(layers), "--quant", quant, "--quiet",
                    *(["--experts", str(experts)] if experts else [])], check=True)


def bench_args(doc: str, layers: int, tokens: int) -> argparse.ArgumentParser:
    """The arguments of the decode benches (this one, decode_switches.py): the generated model
    (--preset, --quant, --layers, --experts, --dir: made by make() if missing), its caches' --kv-type, --tokens
    timed, --profile-tokens, --json."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="make-model's --preset")
    ap.add_argument("--quant", default="Q8_0")
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--experts", type=int, help="make-model's --experts (default: the preset's)")
    ap.add_argument("--kv-type", default="auto", choices=("auto", *KV_TYPES), help="the caches' rows (auto: f16)")
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--profile-tokens", type=int, default=8)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--json")
    return ap


def load_generated(a: argparse.Namespace):
    """(path, the model loaded on CUDA) of bench_args' model, made first if missing; its new_cache makes caches of
    --kv-type rows."""
    name = "q30" if a.preset == "qwen3-30b-a3b" else a.preset  # (q30: fused_checks.sh and graphs_checks.sh remove it)
    path = Path(a.dir) / f"{name}-{a.layers}l{f'-{a.experts}e' if a.experts else ''}-{a.quant}.gguf"
    make(path, a.preset, a.quant, a.layers, a.experts)
    m = load_model(path, device="cuda")
    m.net.new_cache = functools.partial(m.net.new_cache, kv_dtype=KV_TYPES[kv_type_name(a.kv_type, "cuda")])
    return path, m


def table(res: dict) -> str:
    p, blocked = res["profile_eager"], res.get("graphs_blocked")
    lines = [f"model {res['model']}: {res['layers']} layers {res['quant']}",
             f"eager {res['eager_tok_s']:.1f} tok/s, no graphs: {blocked}" if blocked else
             (f"eager {res['eager_tok_s']:.1f} tok/s, graphs {res['graphs_tok_s']:.1f} tok/s "
              f"(token picked on the {'GPU' if res['device_argmax'] else 'host'}), "
              f"greedy equal: {res['greedy_equal']} (eager rerun: {res['eager_rerun_greedy_equal']})"),
             "" if blocked else (f"teacher-forced logits: graphs vs eager {res['forced_graphs_vs_eager']}, eager vs "
                                 f"eager {res['forced_eager_vs_eager']}"),
             f"{'stage (eager, profiled)':36s} {'host ms/tok':>11s} {'GPU ms/tok':>10s} {'calls/tok':>9s}"]
    for stage, r in sorted(p["stages"].items(), key=lambda kv: -kv[1]["host_ms"]):
        lines.append(f"{stage:36s} {r['host_ms']:11.3f} {r['gpu_ms']:10.3f} {r['calls']:9.1f}")
    staged = sum(r["host_ms"] for r in p["stages"].values())
    lines.append(f"{'other (between stages, logits copy)':36s} {p['wall_ms'] - staged:11.3f}")
    lines.append(f"{'step wall (profiled eager)':36s} {p['wall_ms']:11.3f} {p['kernel_ms']:10.3f}")
    lines.append(f"kernel launches/token {p['launches_per_token']:.0f}; host sync calls/token "
                 f"{json.dumps(p['host_sync_calls_per_token'])}")
    if blocked:
        return "\n".join(lines)
    g = res["profile_graphs"]
    lines.append(f"{'step wall (CUDA graph replay)':36s} {g['wall_ms']:11.3f} {g['kernel_ms']:10.3f}")
    lines.append(f"graph replay: {g['kernels_per_token']:.0f} kernels + {g['copies_per_token']:.0f} "
                 f"copies/token (fused kernels: {res['fused']}); the most launched:")
    for name, n in list(g["top_kernels_per_token"].items())[:12]:
        lines.append(f"  {n:6.1f}  {name[:100]}")
    lines.append("graph replay, GPU time per token by kernel (launches, us):")
    for name, (n, us) in list(g["kernel_us_per_token"].items())[:20]:
        lines.append(f"  {n:6.1f} {us:9.1f}  {name[:100]}")
    return "\n".join(lines)


def main() -> int:
    ap = bench_args(__doc__, layers=2, tokens=64)
    ap.add_argument("--ctx", type=int, default=1024, help="KV cache positions (graphs attend over a bucket of them)")
    ap.add_argument("--py-top", type=int, default=0, help="also the eager step's N Python functions with the most "
                    "own host time (cProfile)")
    ap.add_argument("--eager-only", action="store_true", help="the eager step's timing and profiles only (also for a "
                    "model graphs refuse: graph_blocker)")
    ap.add_argument("--fused", default=None, help="fused decode kernels: all, none or names "
                    f"({', '.join(fused.KERNELS)}); default: ${fused.ENV} or all")
    a = ap.parse_args()
    if a.fused is not None:
        fused.configure(a.fused)
    path, m = load_generated(a)
    try:
        net, ctx = m.net, max(a.ctx, len(PROMPT) + a.tokens + 1)
        why = graph_blocker(net)
        if why and not a.eager_only:
            print(f"not graph-safe: {why} (--eager-only profiles its eager step)")
            return 1
        why = why or ("--eager-only" if a.eager_only else None)
        decode(eager_next, net, 4, ctx)  # JIT-compile the kernels first
        eager_ids, eager_s = decode(eager_next, net, a.tokens, ctx)
        res = {"model": str(path), "layers": a.layers, "quant": a.quant, "tokens": a.tokens, "kv_type": a.kv_type,
               "fused": fused.current(), "device_argmax": device_argmax_default(),
               "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "eager_tok_s": a.tokens / eager_s, "eager_ids": eager_ids, "graphs_blocked": why,
               "profile_eager": profile_eager(net, a.profile_tokens, ctx)}
        if not why:
            graph_ids, graph_s = decode(graphed_next(ctx), net, a.tokens, ctx)
            res.update(graphs_tok_s=a.tokens / graph_s, greedy_equal=eager_ids == graph_ids, graph_ids=graph_ids,
                       eager_rerun_greedy_equal=decode(eager_next, net, a.tokens, ctx)[0] == eager_ids,
                       profile_graphs=profile_graphs(net, a.profile_tokens, ctx))
        if a.py_top:
            res["python_eager"] = python_profile(net, a.profile_tokens, ctx, a.py_top)
        if not why:
            eager = forced(eager_step, net, eager_ids, ctx)
            res["forced_graphs_vs_eager"] = agreement(eager, forced(graphed(ctx), net, eager_ids, ctx))
            res["forced_eager_vs_eager"] = agreement(eager, forced(eager_step, net, eager_ids, ctx))
    finally:
        m.close()
    print(table(res), flush=True)
    for name, own, cum, calls in res.get("python_eager", []):
        print(f"  {own:8.3f} ms own {cum:8.3f} ms cum {calls:7.1f}x  {name}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
