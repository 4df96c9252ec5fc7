"""One replayed resident decode step, kernel by kernel: where the time outside the MoE launches goes.

For each GGUF given (loaded as `generate --device cuda --resident` loads it), after a prompt and a
warm-up, in one process:
  1. wall time a token of three loops over the same captured graph: `next_token` as `generate`
     runs it (the token and position fills, the replay, the picked token back to the host), the
     replay and the host read without the two fills, and replays alone back to back (no host
     sync: the GPU's own step time; each rewrites the same position). Their differences are
     the fills' cost and the host turnaround (sync, Python, graph launch) the GPU idles through;
  2. torch.profiler over --steps `next_token` calls: every kernel of a step in launch order,
     its median duration and the idle time before it (start minus the end of the one before:
     negative where PDL overlapped the two; the profiler adds its own spacing, so these are
     upper bounds), labelled by its place in the layer (the layer's kernel pattern repeats
     n_layer times) with the bytes it must read (the file's tensor bytes: weights, experts
     top_k/n_expert of a layer's, the KV rows attended) and the GB/s that gives;
  3. the sum by class.
--split-ab R instead: decode attention's key ranges ($SPARKD_DECODE_ATTENTION_SPLIT, step26; --rules, default
off and auto; the switch's default is grouped since session 29) interleaved, R rounds, in one process a model:
each a fresh cache, the prompt, new graphs, then --tokens greedy tokens timed as `generate` steps them (and
--long-tokens more, the decode at a longer context, also timed in --tokens pieces: the last piece's rate is the
decode at its positions).
Run on the GPU box from the checkout root:
    python3 bench/gpu_box/decode_kernels.py /var/tmp/q3-12-Q8_0.gguf --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.models import load_model

PROMPT = [1, 7, 42, 3, 99, 5, 17, 8]
OUTSIDE = "feed"  # the kernels and copies next_token launches around the replay


def layer_period(names: list[str], n_layer: int) -> tuple[int, int]:
    """(offset, length) of the kernel pattern that repeats n_layer times in one step's names,
    the earliest offset and, there, the longest pattern that fits; (len, 0) when none does."""
    for off in range(len(names)):
        for length in range((len(names) - off) // n_layer, 0, -1):
            if all(names[off + i] == names[off + i + length] for i in range((n_layer - 1) * length)):
                return off, length
    return len(names), 0


def role(name: str, nth_plain: int, where: str) -> str:
    """The part of the step a kernel serves, by its name and, for the dense GEMVs (names without a
    known part), its order among them in the layer (where "layer") or after the layers ("tail")."""
    low = name.lower()
    for key, part in (("memcpy", "host copy"), ("memset", "memset"), ("fill", "fill"),
                      ("rope_attention", "rope + KV write + attention"), ("rope", "rope + KV write"),
                      ("attention", "attention"), ("topk", "router (gate GEMV + top-k)"),
                      ("gate_up", "experts gate/up"), ("down", "experts down"), ("norm", "norm"),
                      ("argmax", "argmax"), ("index", "embedding"), ("quant", "act quant")):
        if key in low:
            return part
    if where == "layer":
        return ("qkv GEMV", "o GEMV")[nth_plain] if nth_plain < 2 else "other"
    return "head GEMV" if where == "tail" else "other"


def label(names: list[str], n_layer: int) -> list[tuple[str, str]]:
    """(where, role) of each kernel of one step: "pre" before the layers, "layer", "tail" after."""
    off, length = layer_period(names, n_layer)
    out, plain = [], 0
    for i, name in enumerate(names):
        where = "pre" if i < off else "layer" if i < off + n_layer * length else "tail"
        if where == "layer" and (i - off) % length == 0:
            plain = 0
        if where == "tail" and i == off + n_layer * length:
            plain = 0
        r = role(name, plain, where)
        if r in ("other", "qkv GEMV", "o GEMV", "head GEMV"):
            plain += 1
        out.append((where, r))
    return out


def role_bytes(gguf: GGUFModel, cfg, n_keys: int) -> dict[str, float]:
    """Bytes a layer's part must read (the mean over layers; the head's once): the file's tensors."""
    def size(name: str) -> int:
        info = gguf.tensors.get(name)
        return 0 if info is None else info.nbytes

    L = cfg.n_layer
    per = lambda *names: sum(size(f"blk.{il}.{n}.weight") for il in range(L) for n in names) / L
    share = cfg.n_expert_used / max(cfg.n_expert, 1)
    kv = n_keys * cfg.n_head_kv * (cfg.head_dim_k + cfg.head_dim_v) * 4  # float32 cache rows
    return {"qkv GEMV": per("attn_q", "attn_k", "attn_v"), "o GEMV": per("attn_output"),
            "router (gate GEMV + top-k)": per("ffn_gate_inp"), "attention": kv,
            "experts gate/up": per("ffn_gate_exps", "ffn_up_exps") * share,
            "experts down": per("ffn_down_exps") * share,
            "head GEMV": size("output.weight") or size("token_embd.weight")}


def steps_of(events) -> list[list]:
    """The profiled device events cut into next_token steps: each ends with its device-to-host copy."""
    steps, cur = [], []
    for e in sorted(events, key=lambda e: e.time_range.start):
        cur.append(e)
        if "DtoH" in e.name or "Device -> Pageable" in e.name or "Device -> Pinned" in e.name:
            steps.append(cur)
            cur = []
    return steps


def kernel_table(steps: list[list], n_layer: int, nbytes: dict[str, float]) -> dict:
    """Per position of a step (median over steps): name, us, idle before; by role and class."""
    n = statistics.mode(len(s) for s in steps)
    steps = [s for s in steps if len(s) == n]
    names = [e.name for e in steps[0]]
    inside = [i for i, nm in enumerate(names) if role(nm, 0, "x") not in ("host copy", "fill")]
    first, last = inside[0], inside[-1]
    graph_names = names[first:last + 1]
    labels = [("feed", role(nm, 0, OUTSIDE)) for nm in names[:first]] + label(graph_names, n_layer) + \
        [("feed", role(nm, 0, OUTSIDE)) for nm in names[last + 1:]]
    rows = []
    for i, nm in enumerate(names):
        us = statistics.median(s[i].time_range.elapsed_us() for s in steps)
        gap = statistics.median(s[i].time_range.start - s[i - 1].time_range.end for s in steps) if i else 0.0
        rows.append({"i": i, "name": nm, "where": labels[i][0], "role": labels[i][1], "us": us, "gap_us": gap})
    between = [b[0].time_range.start - a[-1].time_range.end for a, b in zip(steps, steps[1:])]
    by_role: dict[str, dict] = {}
    for r in rows:
        t = by_role.setdefault(f"{r['where']}: {r['role']}", {"count": 0, "us": 0.0, "gap_us": 0.0})
        t["count"] += 1
        t["us"] += r["us"]
        t["gap_us"] += r["gap_us"]
    for key, t in by_role.items():
        b = nbytes.get(key.split(": ", 1)[1])
        if b is not None:
            t["mb_each"] = b / 1e6
            t["gb_s"] = b * t["count"] / (t["us"] * 1e3) if t["us"] else 0.0
    span = statistics.median(s[last].time_range.end - s[first].time_range.start for s in steps)
    return {"kernels_per_step": n, "graph_kernels": last - first + 1, "graph_span_us": span,
            "kernel_us": sum(r["us"] for r in rows[first:last + 1]),
            "gap_us_inside": sum(r["gap_us"] for r in rows[first + 1:last + 1]),
            "between_steps_us": statistics.median(between) if between else None,
            "rows": rows, "by_role": by_role}


def loops(step: StaticDecode, token: int, n: int) -> tuple[dict, int]:
    """us a token of the three loops (see the docstring, 1) → (times, the last token)."""
    def timed(body) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        body()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / n

    out = {}

    def generate_like():
        nonlocal token
        for _ in range(n):
            token = step.next_token(token)
    out["next_token"] = timed(generate_like)
    graph, _, picked = step._graphs[step._span(step.cache.n_past + 1)]  # the bucket the loops stay in

    def no_fill():
        for _ in range(n):
            graph.replay()
            int(picked)
    out["replay + read, no fills"] = timed(no_fill)

    def replays():
        for _ in range(n):
            graph.replay()
    out["replays alone"] = timed(replays)
    return out, token


def measure(path: Path, steps: int, tokens: int, ctx: int, rounds: int) -> dict:
    m = load_model(path, device="cuda")
    try:
        net = m.net
        cfg = net.cfg
        cache = net.new_cache(ctx)
        token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
        step = StaticDecode(net, cache, graphs=True)
        step.prepare(len(PROMPT) + rounds * tokens + steps + 64)
        for _ in range(16):  # warm: compiled, captured, clocks up
            token = step.next_token(token)
        times = []
        for _ in range(rounds):
            t, token = loops(step, token, tokens)
            times.append(t)
        timing = {k: statistics.median(t[k] for t in times) for k in times[0]}
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                token = step.next_token(token)
        events = [e for e in prof.events() if e.device_type.name == "CUDA"]
        gguf = GGUFModel.open(path)
        try:
            nbytes = role_bytes(gguf, cfg, cache.n_past)
        finally:
            gguf.close()
        table = kernel_table(steps_of(events), cfg.n_layer, nbytes)
        return {"model": str(path), "n_layer": cfg.n_layer, "n_past": cache.n_past, "loops_us": timing,
                "loops_rounds": times, "bytes": nbytes, **table}
    finally:
        m.close()


def split_ab(path: Path, rounds: int, tokens: int, long_tokens: int, ctx: int,
             rules: tuple[str, ...] = ("off", "auto")) -> dict:
    """tok/s of greedy decode with the attention's key ranges by each rule, interleaved (see the docstring)."""
    from sparkd.engine.kernels import decode_attention  # (Triton: not at import, the CPU tests load this script)

    m = load_model(path, device="cuda")
    runs: dict[str, list[dict]] = {rule: [] for rule in rules}
    try:
        net = m.net
        for _ in range(rounds):
            for rule in runs:
                decode_attention.SPLIT_RULE = rule
                cache = net.new_cache(ctx)
                token = int(net(torch.tensor(PROMPT), cache)[-1].argmax())
                step = StaticDecode(net, cache, graphs=True)
                step.prepare(len(PROMPT) + tokens + long_tokens + 1)
                ids, pieces = [], []  # seconds of each --tokens piece
                for n in [tokens] * (1 + long_tokens // tokens) + [long_tokens % tokens]:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        ids.append(token)
                        token = step.next_token(token)
                    torch.cuda.synchronize()
                    pieces.append(time.perf_counter() - t0)
                runs[rule].append({"tok_s": tokens / pieces[0], "long_tok_s": long_tokens / sum(pieces[1:]),
                                   "last_piece_tok_s": tokens / pieces[-2],  # the last whole piece
                                   "ids": ids})
                del step
                torch.cuda.empty_cache()
    finally:
        m.close()
    return {"model": str(path), "tokens": tokens, "long_tokens": long_tokens, "runs": runs,
            "same_tokens": {rule: all(r["ids"] == rs[0]["ids"] for r in rs) for rule, rs in runs.items()}}


def ab_report(res: dict) -> str:
    lines = [f"== {res['model']}: attention key ranges {' / '.join(res['runs'])} (greedy tokens the same "
             f"every round: {res['same_tokens']})"]
    for rule, rs in res["runs"].items():
        lines.append(f"  {rule:6s} first {res['tokens']} tokens: " + " ".join(f"{r['tok_s']:.1f}" for r in rs)
                     + f" tok/s; the next {res['long_tokens']}: " + " ".join(f"{r['long_tok_s']:.1f}" for r in rs)
                     + f"; their last {res['tokens']}: " + " ".join(f"{r['last_piece_tok_s']:.1f}" for r in rs))
    return "\n".join(lines)


def report(res: dict) -> str:
    t = res["loops_us"]
    lines = [f"== {res['model']} ({res['n_layer']} layers, {res['n_past']} positions)",
             "us a token: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()) +
             f" -> {1e6 / t['next_token']:.1f} tok/s; fills {t['next_token'] - t['replay + read, no fills']:.1f}, "
             f"host turnaround {t['replay + read, no fills'] - t['replays alone']:.1f}",
             f"profiled step: {res['kernels_per_step']} device events, {res['graph_kernels']} in the graph over "
             f"{res['graph_span_us']:.1f} us: kernels {res['kernel_us']:.1f} + idle between them "
             f"{res['gap_us_inside']:.1f}; between steps {res['between_steps_us']:.1f}",
             f"{'where: role':44s} {'n':>4s} {'us':>8s} {'idle us':>8s} {'MB each':>8s} {'GB/s':>7s}"]
    for key, r in sorted(res["by_role"].items(), key=lambda kv: -kv[1]["us"]):
        mb, gbs = r.get("mb_each"), r.get("gb_s")
        lines.append(f"{key:44s} {r['count']:4d} {r['us']:8.1f} {r['gap_us']:8.1f} "
                     f"{'' if mb is None else f'{mb:8.2f}':>8s} {'' if gbs is None else f'{gbs:7.0f}':>7s}")
    lines.append("one step in order (the first layer's kernels and the head; us, idle before):")
    first_layer = [r for r in res["rows"] if r["where"] != "layer"]
    layer = [r for r in res["rows"] if r["where"] == "layer"]
    per = len(layer) // res["n_layer"] if res["n_layer"] else 0
    for r in sorted(first_layer + layer[:per], key=lambda r: r["i"]):
        lines.append(f"  {r['i']:4d} {r['where']:5s} {r['role']:28s} {r['us']:7.2f} {r['gap_us']:7.2f}  {r['name'][:70]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=16, help="next_token calls profiled")
    ap.add_argument("--tokens", type=int, default=128, help="tokens a timed loop")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three timed loops (medians)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--split-ab", type=int, default=0, help="rounds of the attention split A/B instead")
    ap.add_argument("--long-tokens", type=int, default=896, help="--split-ab: tokens timed after --tokens")
    ap.add_argument("--rules", default="off,auto", help="--split-ab: $SPARKD_DECODE_ATTENTION_SPLIT values, commas")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = []
    for path in a.models:
        if a.split_ab:
            res = split_ab(path, a.split_ab, a.tokens, a.long_tokens, a.ctx, tuple(a.rules.split(",")))
            print(ab_report(res), flush=True)
        else:
            res = measure(path, a.steps, a.tokens, a.ctx, a.rounds)
            print(report(res), flush=True)
        out.append(res)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
