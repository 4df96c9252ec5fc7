"""A prompt's KDA delta rule (kimi-k3's linear attention, sparkd/engine/layers/kda.py): the token loop
against the chunked form at several chunk lengths, on random inputs of a model's shape (default kimi-k3's:
64 KDA heads of 128, make-model's preset), interleaved repeats, the median in ms (the device synchronized
around each run); each one's error against the loop in float64 (on the same device) and its largest
difference from the float32 loop (outputs and final state). With --graph (CUDA) each chunk length is also
captured as a CUDA graph and replayed ("graph C" rows: the launches' share of the eager time, and a check
that the chunked rule captures: no host sync, fixed shapes). On CUDA each eager way's peak bytes
(torch.cuda.max_memory_allocated above what was allocated before it) stand beside the memory plan's count
(kda.chunks_peak_bytes, the loop's: rule_peak_bytes); --before FILE times another revision's kda.py beside
("before C" rows: its delta_rule_chunks).

    python3 bench/kda_prompt_bench.py --tokens 256 --heads 32 --dim 128 --chunks 16,32,64 --threads 1
    python3 bench/kda_prompt_bench.py --device cuda --tokens 256,512,2048 --chunks 16,32,64 --graph
    python3 bench/kda_prompt_bench.py --device cuda --tokens 512,2048 --chunks 32,64 --before /tmp/kda_main.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch

from sparkd.engine.layers.kda import chunks_peak_bytes, delta_rule, delta_rule_chunks, rule_peak_bytes


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def graphed(fn):
    """fn captured as a CUDA graph (after a warm-up on a side stream, as torch asks): replay, outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return lambda: (g.replay(), out)[1]


def peak_bytes(fn, device: torch.device) -> int | None:
    """What fn allocates at most above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("kda_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.delta_rule_chunks


def run(T: int, H: int, D: int, chunks: list[int], reps: int, dev: torch.device, graph: bool, before) -> dict:
    g = torch.Generator().manual_seed(T)
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    v, s0 = torch.randn(T, H, D, generator=g), torch.randn(H, D, D, generator=g)
    gate, beta = -torch.rand(T, H, D, generator=g) * 0.1, torch.rand(T, H, generator=g)
    args = [x.to(dev) for x in (q, k, v, gate, beta, s0)]
    want_o, want_s = delta_rule(*(x.double() for x in args))
    ways = {"loop": lambda: delta_rule(*args)}
    ways.update({f"chunks {c}": (lambda c=c: delta_rule_chunks(*args, chunk=c)) for c in chunks})
    if before:
        ways.update({f"before {c}": (lambda c=c: before(*args, chunk=c)) for c in chunks})
    counts = {"loop": rule_peak_bytes(T, H, D, D, cuda=False)}
    counts.update({f"{w} {c}": chunks_peak_bytes(T, H, D, D, c) for c in chunks for w in ("chunks", "before")})
    if graph:
        ways.update({f"graph {c}": graphed(lambda c=c: delta_rule_chunks(*args, chunk=c)) for c in chunks})
    for fn in ways.values():  # warm-up (allocator, kernels)
        fn()
    ms: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(reps):
        for w, fn in ways.items():
            ms[w].append(timed(fn, dev))
    peaks = {w: peak_bytes(fn, dev) for w, fn in ways.items() if not w.startswith("graph")}
    loop_o, loop_s = ways["loop"]()
    rows = []
    for w, fn in ways.items():
        o, s = fn()
        row = {"way": w, "ms": round(statistics.median(ms[w]), 3),
               "rel_err_vs_float64": ((o.double() - want_o).norm() / want_o.norm()).item(),
               "state_rel_err_vs_float64": ((s.double() - want_s).norm() / want_s.norm()).item(),
               "max_abs_out_vs_loop": (o - loop_o).abs().max().item(),
               "max_abs_state_vs_loop": (s - loop_s).abs().max().item()}
        row["x_loop"] = round(statistics.median(ms["loop"]) / row["ms"], 2)
        row["peak_bytes"], row["count_bytes"] = peaks.get(w), counts.get(w)
        rows.append(row)
        mem = (f"  peak {row['peak_bytes'] / 2**20:8.2f} MiB (count {row['count_bytes'] / 2**20:8.2f})"
               if peaks.get(w) else "")
        print(f"{T:5d} tok {w:10s} {row['ms']:9.2f} ms  x{row['x_loop']:6.2f}  err {row['rel_err_vs_float64']:.1e} "
              f"(state {row['state_rel_err_vs_float64']:.1e})  vs loop: out {row['max_abs_out_vs_loop']:.1e} "
              f"state {row['max_abs_state_vs_loop']:.1e}{mem}", flush=True)
    return {"tokens": T, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="256", help="prompt lengths, comma-separated (default 256)")
    ap.add_argument("--heads", type=int, default=64, help="KDA heads (default 64, kimi-k3's)")
    ap.add_argument("--dim", type=int, default=128, help="head dim (default 128, kimi-k3's)")
    ap.add_argument("--chunks", default="16,32,64", help="chunk lengths to time (default 16,32,64)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--graph", action="store_true", help="also replay each chunk length as a CUDA graph")
    ap.add_argument("--before", help="another revision's kda.py: its delta_rule_chunks timed beside (\"before C\")")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if a.graph and dev.type != "cuda":
        ap.error("--graph needs --device cuda")
    chunks = [int(c) for c in a.chunks.split(",")]
    before = load_before(a.before) if a.before else None
    runs = [run(int(t), a.heads, a.dim, chunks, a.reps, dev, a.graph, before) for t in a.tokens.split(",")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"heads": a.heads, "dim": a.dim, "device": a.device, "threads": torch.get_num_threads(),
                       "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
