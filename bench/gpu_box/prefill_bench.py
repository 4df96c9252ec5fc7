"""Prompt processing (prefill) on CUDA: sparkd's prompt tok/s per way of running it, side by side,
and where one prompt's time goes.

Loads a GGUF resident on CUDA (as `sparkd-engine generate --device cuda --resident` does) and,
for each prompt length of --tokens and each way of --variants, runs the prompt through the network
from an empty KV cache (the forward `generate` times: logits back on the host), once to compile,
then --repeats times: median prompt tok/s. A way sets the prefill switches in this process:
  before        SPARKD_MOE_PREFILL=loop, SPARKD_PREFILL_PRECISION=ieee, SPARKD_PROMPT_LOGITS=all
                (the engine before session 9)
  grouped       moe_prefill's grouped GEMMs (three launches a MoE layer), ieee, every token's logits
  last          grouped, ieee, the last token's logits only (prefill20's default)
  tf32x3, tf32  last with the prefill GEMMs' tl.dot at that input precision
  int8          last with the integer GEMM (x as int8 blocks) for Q8_0 (prefill21), Q4_K and Q6_K
                weights (prefill22; other types ieee; the default since prefill21) and session 10's
                host side (prefill23; the defaults now)
  s9            int8 as session 9 left it: the slots' range checked on the host every MoE layer
                (SPARKD_MOE_SLOT_CHECK=always), a launch per stacked part (SPARKD_PREFILL_STACK=parts),
                16-row expert tiles (SPARKD_MOE_PREFILL_TILE=16)
  nosync        s9 without the slots' sync; stack: nosync with one launch a stack;
  t16, t32, t64 stack with expert tiles of that height
  s11g          int8 with session 11's integer GEMM table (SPARKD_IGEMM=s11: pairx's kblock; int8 has s13's)
  s12g          int8 with session 12's (SPARKD_IGEMM=s12: GGUF Q4_K's grouped GEMM without s13's register cap)
  s12w          int8 with pairx's grouped GEMM on session 12's word unpack alone (no register cap; TILES below)
  s12r          int8 with that GEMM's cap at 128 registers (session 12's call measured the engine so; TILES below)
  i64           int8 with 64-row expert tiles (SPARKD_MOE_PREFILL_TILE=64) and pairx's grouped GEMM on 8 warps
                (TILES below)
  tglue         int8 with moe_prefill's torch glue (SPARKD_MOE_PREFILL_GLUE=torch: expert_tiles' ~25 ops,
                the route weights and slot sum as ~11 ops; int8 has a launch for each since session 10's glue10)
  graphs        int8 as a CUDA graph of the prompt padded to its length bucket (prompt_graphs.PromptForward,
                session 11's prefill24; int8 is the eager forward), over one cache of the longest prompt's
                length (as the server keeps one cache): the first prompt of a bucket captures its graph
                (its time, "first_s", and the memory the graphs hold after it, "graph_mib", are recorded)
  graphs2k      graphs with buckets up to 2048 tokens (PromptForward's largest: graphs' own under sdpa since
                prefill30, prompt_graphs.prompt_last; graphs-torch and graphs-rows keep 1024, as their attention does)
  int8-rows, graphs-rows  int8 and graphs with the prompt's attention and float GEMMs (the router's gate)
                in session 11's attn11 kernels, each row's bits whatever the row count
                (SPARKD_PREFILL_ATTENTION=kernel, SPARKD_PREFILL_FLOAT_GEMM=kernel)
  int8-torch, graphs-torch  the same with attend's torch ops and cuBLAS (=torch: session 13's defaults);
                every other way takes those two switches from the environment (the defaults: the attention
                through torch's SDPA, attend_sdpa, since session 14; cuBLAS)
  t:G:N:D:T     graphs with pairx's (Q4_K_TILED) grouped integer GEMM on launch G, GGUF Q4_K's grouped one (a
                Q4_K model's down below width 4096) on N and pairx's dense one on D (bn/bt/warps/unroll/stages/
                kblock/maxnreg as igemm_bench's ways; "-": the default's) and expert tiles of T rows (session 13,
                prefill28: candidates picked from igemm_bench's rows in the same call)
before, grouped, last and s9 also make each prompt's rope table anew (KVCache.rope_table), as every
cache did before session 10 (now the model's caches share them). A way named twice runs twice (its
second rows under "way#2": interleave ways to see the box's drift).
The last token's logits of each way are compared with the first way's (largest difference over
the largest |logit|, same argmax, bit-equal) at the longest prompt ("agreement") and at each length
("agreement_by_tokens"), and each graphs way's with its eager way's last run ("padded_vs_eager": graphs
with int8, graphs-rows with int8-rows, graphs-torch with int8-torch; a padded prompt gives the eager bits or not). Then a torch.profiler breakdown of one
prompt of each --profile-tokens length for each way of --profile: GPU kernel ms and host ms per stage
(decode_profile.Stages; a stage's host ms includes its waits on the GPU at host syncs, and the
Triton launches' GPU time is not attributed to stages: read the kernel list), kernel launches,
host syncs, the kernels taking the most GPU time. The JSON is rewritten after each way.
    python3 bench/gpu_box/prefill_bench.py --model q3-12-Q8_0.gguf --tokens 128,512,2048 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from decode_profile import Stages, kernel_time_by_name, stage_report
from torch.profiler import ProfilerActivity, profile

from sparkd.engine.prompt_graphs import PROMPT_LAST_SCORES, PromptForward
from sparkd.engine.kernels import moe_prefill, prefill_gemm
from sparkd.engine.layers import attention, linear
from sparkd.engine.layers import moe as moe_layer
from sparkd.engine.models import load_model

# (moe_prefill.PREFILL, linear.PREFILL_PRECISION, last, moe_layer.SLOT_CHECK, linear.PREFILL_STACK, moe_prefill.PREFILL_TILE,
#  moe_prefill.PREFILL_GLUE)
NOW = ("router", linear.PREFILL_STACK, moe_prefill.PREFILL_TILE, moe_prefill.PREFILL_GLUE)  # the host side's defaults
S9 = ("always", "parts", 16, "torch")
VARIANTS = {"before": ("loop", "ieee", False, *S9), "grouped": ("grouped", "ieee", False, *S9),
            "last": ("grouped", "ieee", True, *S9), "tf32x3": ("grouped", "tf32x3", True, *NOW),
            "tf32": ("grouped", "tf32", True, *NOW), "int8": ("grouped", "int8", True, *NOW),
            "s9": ("grouped", "int8", True, *S9), "nosync": ("grouped", "int8", True, "router", "parts", 16, "torch"),
            "tglue": ("grouped", "int8", True, *NOW[:-1], "torch"),
            **{f"t{t}": ("grouped", "int8", True, "router", "one", t, "torch") for t in (16, 32, 64)}}
VARIANTS["stack"] = VARIANTS["t16"]
VARIANTS["graphs"] = VARIANTS["int8"]
VARIANTS["s11g"] = VARIANTS["s12g"] = VARIANTS["s12w"] = VARIANTS["s12r"] = VARIANTS["int8"]
VARIANTS["i64"] = ("grouped", "int8", True, *NOW[:2], 64, NOW[3])
IGEMM_NOW = prefill_gemm.IGEMM_WAY
TABLE_NOW = dict(prefill_gemm.IGEMM_TILES)
# per way: its launches of prefill_gemm.IGEMM_TILES in place of the default's (bench-only candidates)
TILES = {"s12w": {("Q4_K_TILED", True): prefill_gemm.IgemmTile(64, 32, 4, 1, 2, words=True)},
         "s12r": {("Q4_K_TILED", True): prefill_gemm.IgemmTile(64, 32, 4, 1, 2, words=True, maxnreg=128)},
         "i64": {("Q4_K_TILED", True): prefill_gemm.IgemmTile(64, 64, 8, 1, 2, words=True, maxnreg=128)}}
EAGER_OF = {"graphs": "int8", "graphs-rows": "int8-rows", "graphs-torch": "int8-torch",
            "graphs2k": "int8"}  # graph way: its eager way
# graph way: its largest bucket (else PromptForward's default, from the attention switch when it is made)
LARGEST = {"graphs2k": 2048, "graphs-torch": PROMPT_LAST_SCORES, "graphs-rows": PROMPT_LAST_SCORES}
for _v in EAGER_OF:
    VARIANTS[EAGER_OF[_v]] = VARIANTS[_v] = VARIANTS["int8"]
ROWS = {"int8-rows": "kernel", "graphs-rows": "kernel", "int8-torch": "torch", "graphs-torch": "torch"}
ROWS_ENV = (attention.PREFILL_ATTENTION, linear.PREFILL_FLOAT_GEMM)  # the switches' values at import


OWN_ROPE = {"before", "grouped", "last", "s9"}  # ways whose prompts make their rope tables anew
own_rope = False
graphed: PromptForward | None = None  # the graphs way's prompt forward (main makes it), while that way runs
prompt_graphs: dict[str, PromptForward] = {}  # per graph way: its graphs were captured under its switches


def candidate(variant: str) -> None:
    """Register a t:G:N:D:T way (the docstring's list): a graphs way over the eager int8 (the same integer sums)."""
    _, g, n, d, t = variant.split(":")
    tiles = {}
    for key, launch in ((("Q4_K_TILED", True), g), (("Q4_K", True), n), (("Q4_K_TILED", False), d)):
        if launch != "-":
            bn, bt, warps, unroll, stages, kb, reg = (int(v) for v in launch.split("/"))
            tiles[key] = prefill_gemm.IgemmTile(bn, bt, warps, unroll, stages, True, kb > 0, kb == 2, reg)
    VARIANTS[variant] = (*VARIANTS["int8"][:5], int(t), VARIANTS["int8"][6])
    TILES[variant], EAGER_OF[variant] = tiles, "int8"


def use(variant: str) -> bool:
    """Set the variant's switches (read per call from these module globals); returns `last`."""
    global own_rope, graphed
    (moe_prefill.PREFILL, linear.PREFILL_PRECISION, last, moe_layer.SLOT_CHECK, linear.PREFILL_STACK, moe_prefill.PREFILL_TILE,
     moe_prefill.PREFILL_GLUE) = VARIANTS[variant]
    attention.PREFILL_ATTENTION, linear.PREFILL_FLOAT_GEMM = (ROWS[variant],) * 2 if variant in ROWS else ROWS_ENV
    own_rope = variant in OWN_ROPE
    graphed = prompt_graphs.get(variant)
    prefill_gemm.IGEMM_WAY = {"s11g": "s11", "s12g": "s12"}.get(variant, IGEMM_NOW)
    prefill_gemm.IGEMM_TILES.clear()
    prefill_gemm.IGEMM_TILES.update({**TABLE_NOW, **TILES.get(variant, {})})
    return last


def prefill(net, ids: torch.Tensor, last: bool) -> torch.Tensor:
    """The prompt from an empty cache; the last token's logits (float32 [V], on the host)."""
    if own_rope:
        net.rope_tables.clear()
    if graphed is not None:
        graphed.cache.n_past = 0
        return graphed(ids, last=last)[-1]
    return net(ids, net.new_cache(ids.numel()), last=last)[-1]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reserved_mib() -> float:
    """The device memory torch holds once its unused cached blocks are let go (a graph's pool stays)."""
    if not torch.cuda.is_available():
        return 0.0
    sync()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2**20


def timed(net, ids: torch.Tensor, last: bool, repeats: int) -> dict:
    held = reserved_mib()
    sync()
    t0 = time.perf_counter()
    prefill(net, ids, last)  # compiles this shape's kernels (the graphs way: captures the bucket's graph)
    first = time.perf_counter() - t0
    extra = {"graph_mib": reserved_mib() - held} if graphed is not None else {}
    secs = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        prefill(net, ids, last)
        secs.append(time.perf_counter() - t0)
    return {"tok_s": ids.numel() / statistics.median(secs), "seconds": secs, "first_s": first, **extra}


def profiled(net, ids: torch.Tensor, last: bool, top: int) -> dict:
    prefill(net, ids, last)
    stages = Stages(net)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        prefill(net, ids, last)
        wall = time.perf_counter() - t0
    stages.remove()
    del net.embed
    events = prof.events()
    kernels = kernel_time_by_name(events, 1)
    host = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)  # where the host's time goes
    return {"wall_ms": wall * 1e3, **stage_report(events, stages, 1),
            "top_kernels_us": {k: v for k, v in list(kernels.items())[:top]},
            "top_host_self_us": {a.key: (a.count, a.self_cpu_time_total) for a in host[:top]}}


def agreement(row: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"max_diff_over_max": float((row - ref).abs().max() / ref.abs().max()),
            "argmax_equal": bool(row.argmax() == ref.argmax()), "bit_equal": bool(torch.equal(row, ref))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="128,512,2048", help="prompt lengths, comma-separated")
    ap.add_argument("--variants", default="before,grouped,last,tf32x3,tf32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", default="before,last", help="ways profiled at --profile-tokens ('': none)")
    ap.add_argument("--profile-tokens", default="512", help="prompt lengths profiled, comma-separated")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per profile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run under TRITON_INTERPRET=1 (a tiny model)")
    a = ap.parse_args()
    variants, lengths = a.variants.split(","), [int(t) for t in a.tokens.split(",")]
    profile_lengths = [int(t) for t in a.profile_tokens.split(",")]
    for v in {v for v in variants + a.profile.split(",") if v.startswith("t:")}:
        try:
            candidate(v)
        except ValueError:
            ap.error(f"bad way {v!r}: t:G:N:D:T, G/N/D bn/bt/warps/unroll/stages/kblock/maxnreg or -, T a tile height")
    unknown = [v for v in variants + [p for p in a.profile.split(",") if p] if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    m = load_model(a.model, device=a.device, kernels=True)
    gen = torch.Generator().manual_seed(a.seed)
    prompts = {n: torch.randint(0, m.cfg.n_vocab, (n,), generator=gen) for n in lengths}
    res = {"model": a.model, "gpu": torch.cuda.get_device_name() if a.device == "cuda" else a.device, "runs": {},
           "agreement": {}, "agreement_by_tokens": {}, "padded_vs_eager": {}, "profiles": {}}
    refs, eager_rows = {}, {}
    for v in set(EAGER_OF) & set(variants + a.profile.split(",")):  # one cache for every prompt, as the server keeps
        prompt_graphs[v] = PromptForward(m.net, m.net.new_cache(max(lengths + profile_lengths)),
                                         "graphs" if a.device == "cuda" else "padded", **(
                                             {"largest": LARGEST[v]} if v in LARGEST else {}))

    def save() -> None:  # after each way: a run stopped by its timeout keeps what it measured
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)

    for v in variants:
        last, key = use(v), v
        while key in res["runs"]:
            key = f"{v}#{int(key.partition('#')[2] or 1) + 1}"
        for n in lengths:
            r = res["runs"].setdefault(key, {})[n] = timed(m.net, prompts[n], last, a.repeats)
            print(f"{key:8s} {n:5d} tokens: {r['tok_s']:9.1f} tok/s (first {r['first_s'] * 1e3:.0f} ms"
                  + (f", graphs hold {r['graph_mib']:.0f} MiB)" if "graph_mib" in r else ")"), flush=True)
            row = prefill(m.net, prompts[n], last)
            ref = refs.setdefault(n, row)
            res["agreement_by_tokens"].setdefault(key, {})[n] = agreement(row, ref)
            if v in EAGER_OF.values():
                eager_rows[v, n] = row
            elif (EAGER_OF.get(v), n) in eager_rows:
                res["padded_vs_eager"].setdefault(key, {})[n] = agreement(row, eager_rows[EAGER_OF[v], n])
                print(f"{key:8s} {n:5d} tokens vs {EAGER_OF[v]}: {res['padded_vs_eager'][key][n]}", flush=True)
        res["agreement"][key] = res["agreement_by_tokens"][key][lengths[-1]]
        print(f"{key:8s} vs {variants[0]}: {res['agreement_by_tokens'][key]}", flush=True)
        save()
    for v, n in [(p, n) for p in a.profile.split(",") if p for n in profile_lengths]:
        ids = torch.randint(0, m.cfg.n_vocab, (n,), generator=gen)
        p = res["profiles"][v if n == profile_lengths[0] else f"{v}@{n}"] = profiled(m.net, ids, use(v), a.top)
        print(f"profile {v}, {n} tokens: wall {p['wall_ms']:.1f} ms, GPU kernels {p['kernel_ms']:.1f} ms, "
              f"{p['launches_per_token']:.0f} launches, syncs {p['host_sync_calls_per_token']}")
        for stage, s in sorted(p["stages"].items(), key=lambda kv: -kv[1]["gpu_ms"]):
            print(f"  {stage:34s} host {s['host_ms']:7.2f} ms  GPU {s['gpu_ms']:7.2f} ms  x{s['calls']:.0f}")
        for name, (count, us) in p["top_kernels_us"].items():
            print(f"  {us / 1e3:8.2f} ms x{count:4.0f}  {name[:100]}")
        print("  host self time:")
        for name, (count, us) in p["top_host_self_us"].items():
            print(f"  {us / 1e3:8.2f} ms x{count:4.0f}  {name[:100]}")
        save()
    m.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
