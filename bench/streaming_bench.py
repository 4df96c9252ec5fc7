"""Expert streaming benchmark: the disk bound, then decode on a generated model several times
larger than the budget, swept over budgets.

    PYTHONPATH=. python bench/streaming_bench.py --dir DIR [--model-size 3G] [--budgets 1G,1.5G,2G]

Steps: (1) `sparkctl disk-bench` on the model file: O_DIRECT bandwidth by block size x queue depth
(the bound); (2) a qwen3moe model shaped like Qwen3-30B-A3B (hidden 2048, 128 experts, top-8,
expert ffn 768, Q8_0) scaled to --model-size by layer count, vocabulary cut so the trunk fits;
(3) `sparkd-engine generate --json` per budget: decode tok/s, bytes read per token, bandwidth while
reads were outstanding, the end-to-end ratio to the cache-adjusted I/O bound
(tok/s x bytes/token / bound), and the per-stage profile. Prints markdown tables and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, **kw)
    if r.returncode:
        raise SystemExit(f"could not run {' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def disk_table(path: Path, blocks: str, depths: str, seconds: float) -> dict:
    r = run(["sparkd.cli.sparkctl", "disk-bench", str(path), "--block-sizes", blocks, "--queue-depths",
             depths, "--seconds", str(seconds), "--json", "--no-save"])
    return json.loads(r.stdout)


def decode(path: Path, budget: str, n: int, prefetch: int, policy: str) -> dict:
    r = run(["sparkd.engine.cli", "generate", str(path), "--tokens", "1,2,3,4", "-n", str(n), "--ctx", "256",
             "--budget", budget, "--json", "--prefetch", str(prefetch), "--policy", policy], timeout=3600)
    out = json.loads(r.stdout)
    return {"budget": budget, "prefetch": prefetch, "policy": policy, "decode_tok_s": out["decode_tok_s"],
            **out["stream"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True, help="a directory on the disk to measure")
    ap.add_argument("--model-size", default="3G")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--budgets", default="1G,1.5G,2G")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=0)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--block-sizes", default="256K,1M,4M")
    ap.add_argument("--queue-depths", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("streaming_bench.json"))
    a = ap.parse_args()
    model = a.dir / f"bench-qwen3moe-{a.model_size}.gguf"
    if not model.exists():
        run(["sparkd.engine.cli", "make-model", str(model), "--preset", "qwen3-30b-a3b", "--vocab",
             str(a.vocab), "--size", a.model_size, "--quant", "Q8_0", "--quiet"], timeout=3600)
    disk = disk_table(model, a.block_sizes, a.queue_depths, a.seconds)
    bound = disk["best"]["bytes_per_second"]
    rows = [decode(model, b, a.tokens, a.prefetch, a.policy) for b in a.budgets.split(",")]
    for r in rows:
        r["io_bound_tok_s"] = bound / r["bytes_per_token"] if r["bytes_per_token"] else float("inf")
        r["ratio_to_io_bound"] = r["decode_tok_s"] * r["bytes_per_token"] / bound
        r["bandwidth_vs_bound"] = r["bandwidth_bytes_per_second"] / bound
    json.dump({"disk": disk, "decode": rows, "model": str(model), "model_bytes": model.stat().st_size},
              a.out.open("w"), indent=2)
    print(f"model {model} ({model.stat().st_size / 2**30:.2f} GiB); disk {disk['filesystem']}, {disk['mode']}")
    print("\n| block | QD | MB/s |\n|---|---|---|")
    for m in disk["results"]:
        print(f"| {m['block_bytes'] >> 10} KiB | {m['queue_depth']} | {m['mb_per_second']:.0f} |")
    print("\n| budget | cache slots | hit rate | retention | MiB/token | read GB/s (vs bound) | tok/s | "
          "I/O-bound tok/s | ratio | router s | expert compute s | read wait s | attention s | other s |")
    print("|" + "---|" * 14)
    for r in rows:
        p = r["profile"]
        print(f"| {r['budget']} | {r['cache_slots']} | {r['hit_rate']:.3f} | {r['retention']:.3f} | "
              f"{r['bytes_per_token'] / 2**20:.1f} | {r['bandwidth_bytes_per_second'] / 1e9:.2f} "
              f"({r['bandwidth_vs_bound']:.2f}) | {r['decode_tok_s']:.3f} | {r['io_bound_tok_s']:.2f} | "
              f"{r['ratio_to_io_bound']:.2f} | {p['router_seconds']:.2f} | {p['expert_compute_seconds']:.2f} | "
              f"{p['read_wait_seconds']:.2f} | {p.get('attention_seconds', 0.0):.2f} | {p['other_seconds']:.2f} |")


if __name__ == "__main__":
    main()
