"""The side-by-side table of bench/gpu_box/streaming_bench.sh, from the files it wrote to OUT.

    python bench/gpu_box/streaming_summary.py OUT LLAMA_TOKENS BUDGET [BUDGET ...]

Bound = the best O_DIRECT cell of disk-bench. Per budget: decode tok/s, bytes read per token,
read bandwidth while demand reads were outstanding (and / bound), the end-to-end ratio to the
cache-adjusted I/O bound (tok/s x bytes/token / bound), the cgroup's own disk reads (io.stat),
memory.peak and how much memory.stat `file` grew while decoding, then the per-stage profile.
llama.cpp's row (first budget) has tok/s, its cgroup's disk reads and memory.peak.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _gb(n) -> str:
    return f"{n / 1e9:.2f}" if isinstance(n, (int, float)) else "n/a"


def _int(text: str):
    return int(text) if text.isdigit() else None


def file_growth_bytes(path: Path):
    """memory.stat `file` at the last sample minus the smallest (page cache grown while running)."""
    vals = [int(p[1]) for p in (line.split() for line in _read(path).splitlines()) if len(p) == 2 and p[1].isdigit()]
    return max(vals[-1] - min(vals), 0) if vals else None


def sparkd_row(out: Path, budget: str, bound: float) -> tuple[str, str] | None:
    g = _json(out / f"generate_{budget}.json")
    if g is None:
        return None
    s, p = g["stream"], g["stream"]["profile"]
    bpt = s["bytes_per_token"]
    ratio = g["decode_tok_s"] * bpt / bound if bound else 0.0
    hidden = 1.0 - s["wait_seconds"] / s["read_seconds"] if s["read_seconds"] else 1.0
    io = _int(_read(out / f"io_rbytes_{budget}.txt"))
    row = (f"| sparkd {budget} | {g['decode_tok_s']:.3f} | {bpt / 2**20:.0f} | {s['hit_rate']:.3f} "
           f"({s['cache_slots']} slots) | {s['bandwidth_bytes_per_second'] / 1e9:.2f} "
           f"({s['bandwidth_bytes_per_second'] / bound:.2f}) | {ratio:.2f} | {_gb(io)} | "
           f"{_gb(_int(_read(out / f'memory_peak_{budget}.txt')))} | "
           f"{_gb(file_growth_bytes(out / f'memory_stat_file_{budget}.txt'))} |")
    prof = (f"| {budget} | {p['total_seconds']:.2f} | {p['router_seconds']:.2f} | {p['expert_compute_seconds']:.2f} "
            f"| {p['read_wait_seconds']:.2f} | {p.get('attention_seconds', 0.0):.2f} | {p['other_seconds']:.2f} | {s['read_seconds']:.2f} | {hidden:.2f} "
            f"| {s['prefetch_predicted']}/{s['prefetch_useful']}/{s['prefetch_wasted']} |")
    return row, prof


def llama_row(out: Path, budget: str, tokens: int) -> tuple[str, float | None]:
    lb = _json(out / "llama_bench.json")
    tg = [r for r in lb or [] if r.get("n_gen")]
    io = _int(_read(out / "io_rbytes_llama.txt"))
    if not tg:
        why = _read(out / "llama_bench.err").splitlines()[-1:] or ["not run"]
        return f"| llama.cpp mmap {budget} | failed: {why[0][:80]} | | | | | | | |", None
    ts = tg[0]["avg_ts"]
    per_token = io / (tokens + 1) if io else None  # +1: llama-bench's warm-up token
    return (f"| llama.cpp mmap {budget} | {ts:.3f} | {per_token / 2**20 if per_token else 0:.0f} (io.stat) | | | | "
            f"{_gb(io)} | {_gb(_int(_read(out / 'memory_peak_llama.txt')))} | "
            f"{_gb(file_growth_bytes(out / 'memory_stat_file_llama.txt'))} |"), ts


def main() -> None:
    out, llama_tokens, budgets = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    print(_read(out / "machine.txt"))
    disk = _json(out / "disk.json") or {"best": {"bytes_per_second": 0.0}, "mode": "n/a"}
    bound = disk["best"]["bytes_per_second"]
    print(f"\nO_DIRECT bound (disk-bench best cell, {disk.get('mode')}): {bound / 1e9:.2f} GB/s\n")
    print("| run | decode tok/s | MiB read/token | hit rate | read GB/s while misses outstanding (/ bound) "
          "| ratio to cache-adjusted I/O bound | cgroup disk reads GB | memory.peak GB | page cache growth GB |")
    print("|" + "---|" * 9)
    profiles, first_ts = [], None
    for b in budgets:
        r = sparkd_row(out, b, bound)
        if r is None:
            print(f"| sparkd {b} | failed: {(_read(out / f'generate_{b}.err').splitlines() or ['no output'])[-1][:80]} |")
            continue
        print(r[0])
        profiles.append(r[1])
        if b == budgets[0]:
            first_ts = _json(out / f"generate_{b}.json")["decode_tok_s"]
    row, llama_ts = llama_row(out, budgets[0], llama_tokens)
    print(row)
    if llama_ts and first_ts:
        print(f"\nsparkd / llama.cpp mmap at memory.max {budgets[0]}: {first_ts / llama_ts:.2f}x")
    print("\nPer-stage profile of the decode steps (seconds; hidden = share of demand-read time not waited on):\n")
    print("| run | total | router | expert compute | read wait | attention | other (head, norms, prefetch) "
          "| reads outstanding | hidden | prefetch predicted/useful/wasted |")
    print("|" + "---|" * 10)
    print("\n".join(profiles))
    print("\nSteps (wall seconds):")
    print(_read(out / "steps.txt"))


if __name__ == "__main__":
    main()
