"""The side-by-side table of bench/gpu_box/streaming_bench.sh, from the files it wrote to OUT.

    python bench/gpu_box/streaming_summary.py OUT LLAMA_TOKENS BUDGET [BUDGET ...]
    python bench/gpu_box/streaming_summary.py --cuda OUT   # cuda_side_by_side.sh's streaming runs

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
    per_token_mib = f"{per_token / 2**20:.0f} (io.stat, incl. load)" if per_token else "n/a"
    return (f"| llama.cpp mmap {budget} | {ts:.3f} | {per_token_mib} | | | | "
            f"{_gb(io)} | {_gb(_int(_read(out / 'memory_peak_llama.txt')))} | "
            f"{_gb(file_growth_bytes(out / 'memory_stat_file_llama.txt'))} |"), ts


def _llama_ts(path: Path):
    """avg_ts of llama-bench's JSON array, whatever the CUDA backend printed before it."""
    text = _read(path)
    try:
        return json.JSONDecoder().raw_decode(text[text.index("["):])[0][0]["avg_ts"]
    except (ValueError, IndexError, KeyError):
        return None


def cuda_row(tag: str, g: dict, bound: float, llama_ts, peak) -> tuple[str, str]:
    """(table row, profile row) of one streaming run of cuda_side_by_side.sh."""
    s, p = g["stream"], g["stream"]["profile"]
    ts, bpt = g["decode_tok_s"], s["bytes_per_token"]
    bw = s["bandwidth_bytes_per_second"]
    vram = f"{s['vram_hit_rate']:.3f} ({s['vram_slots']} slots)" if "vram_hit_rate" in s else "none"
    row = (f"| {tag} | {ts:.2f} | {f'{ts / llama_ts:.1f}x' if llama_ts else 'n/a'} | {bpt / 2**20:.1f} | "
           f"{f'{ts * bpt / bound:.2f}' if bound else 'n/a'} | {bw / 1e9:.2f} ({f'{bw / bound:.2f}' if bound else 'n/a'}) | "
           f"{vram} | {s['hit_rate']:.3f} ({s['cache_slots']} slots) | {_gb(peak)} |")
    n = max(1, s["tokens"])
    cols = ("total_seconds", "router_seconds", "host_sync_seconds", "read_wait_seconds", "admission_seconds",
            "table_seconds", "expert_compute_seconds", "attention_seconds", "other_seconds",
            "expert_kernels_gpu_seconds", "attention_gpu_seconds", "vram_copy_gpu_seconds")
    prof = f"| {tag} | " + " | ".join(f"{1e3 * p[c] / n:.2f}" if c in p else "" for c in cols) + \
        f" | {s['read_seconds'] * 1e3 / n:.2f} |"
    return row, prof


def cuda_main(out: Path) -> None:
    disk = _json(out / "disk.json") or {"best": {"bytes_per_second": 0.0, "block_bytes": 0, "queue_depth": 0}}
    best = disk["best"]
    bound = best["bytes_per_second"]
    print(f"\nO_DIRECT bound (sparkctl disk-bench on the model file, best cell {best['block_bytes'] >> 10} KiB x "
          f"QD {best['queue_depth']}): {bound / 1e9:.2f} GB/s\n")
    llama_ts = _llama_ts(out / "llama_stream_Q8_0.json")
    print(f"llama.cpp mmap (-ngl 99 --n-cpu-moe 99 --no-host 1 -lm mmap), same memory.max: "
          f"{f'{llama_ts:.3f} tok/s' if llama_ts else 'not run'}, memory.peak "
          f"{_gb(_int(_read(out / 'memory_peak_llama_stream.txt')))} GB\n")
    print("| run | decode tok/s | / llama.cpp | MiB read/token | ratio to cache-adjusted I/O bound "
          "| read GB/s while misses outstanding (/ bound) | VRAM hit rate | host-cache hit rate | memory.peak GB |")
    print("|" + "---|" * 9)
    profiles, feeds = [], []
    for f in sorted(out.glob("engine_stream_*.json")):
        tag = f.stem[len("engine_"):]
        g = _json(f)
        if not g or "stream" not in g:
            print(f"| {tag} | failed: {(_read(out / f'engine_{tag}.err').splitlines() or ['no output'])[-1][:80]} |")
            continue
        peak = _int(_read(out / f"memory_peak_engine_{tag}.txt"))
        row, prof = cuda_row(tag, g, bound, llama_ts, peak)
        print(row)
        profiles.append(prof)
        if "feed" in g:  # generate --feed-tokens: the same tokens, so the same experts, run to run
            fd = g["feed"]
            feeds.append(f"- {tag}: {fd['fed']} tokens fed from {fd['path']}; {fd['agreed']} of the picks agreed")
    if feeds:
        print("\nTokens fed instead of the picks (STREAM_FEED):\n\n" + "\n".join(feeds))
    print("\nPer-stage profile, ms per decode token (host wall unless GPU; expert compute = the MoE layer's "
          "host time minus router and read wait, so it holds host sync, VRAM admission and the table; GPU "
          "columns are CUDA event spans):\n")
    print("| run | total | router | host sync | read wait | VRAM admission | kernel table | expert compute (host) "
          "| attention (host) | other | expert kernels GPU | attention GPU | VRAM copies GPU | reads outstanding |")
    print("|" + "---|" * 14)
    print("\n".join(profiles))


def main() -> None:
    if sys.argv[1] == "--cuda":
        cuda_main(Path(sys.argv[2]))
        return
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
