"""A fresh server's first requests against its later ones: several `sparkd-engine serve` processes of one model,
each a configuration, loaded at once (their loads overlap; no two serve a request at once), then each one's
requests in turn (the first with session 19's prompt, each later one another first word: none continues
the cache): the time to first token from the server's /metrics (the histogram's sum before and after each
request), the client's time to the stream's first chunk (sent before the engine runs: the body's parsing, the
encode, the admission) and to its end, the tokens' digest (the same seed must give the same text on every
server). Run it on the box (session 21, srv48):

    python3 bench/gpu_box/first_request_bench.py --model M.gguf --servers auto,auto:off,lazy,auto:draws0 \\
        --requests 5 --json out.json --logs DIR

A server's spec is `DECODE[:flag...]`: DECODE its --decode-graphs (auto, lazy); flags: `off` sets
SPARKD_LOAD_STREAM=0 (the first streamed request imports what its response opens, as before session 21), `draws0`
SPARKD_LOAD_DRAW_GRAPHS=0. Each server's stderr goes to DIR/server_<i>.log (the load's lines: every capture's time).
Session 21's call (bench/results/srv48_h200_s21_call.sh) ran it with a tracer since taken out (SPARKD_TRACE_FIRST:
the spans of each request's way to its first token) and an `off` that also left out the load's graph replays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import httpx

PROMPT = "Write a long story about a lighthouse keeper."
# the later requests' prompts: another first word each, so none continues the cache (its prompt cache would
# skip a repeated prompt's forward, and a continued one would capture its graph in the request)
VERBS = ("Tell", "Give", "Make", "Draft", "Compose", "Narrate", "Invent", "Sketch")


def prompt(r: int) -> str:
    return PROMPT if r == 0 else VERBS[(r - 1) % len(VERBS)] + PROMPT.removeprefix("Write")
ENV = {"off": ("SPARKD_LOAD_STREAM", "0"), "draws0": ("SPARKD_LOAD_DRAW_GRAPHS", "0")}


def ttft_sum(base: str) -> tuple[float, float]:
    """(the time-to-first-token histogram's sum, its count) from /metrics."""
    values = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("sparkd_engine_time_to_first_token_seconds_"):
            values[name.rsplit("_", 1)[1]] = float(value)
    return values["sum"], values["count"]


def request(base: str, tokens: int, seed: int, top_p: float | None, text_in: str) -> dict:
    """One streamed completion at temperature 0.8: client times to the first chunk and the end, the server's
    time to first token (/metrics delta), the text's digest."""
    before, _ = ttft_sum(base)
    body = {"model": "m", "prompt": text_in, "max_tokens": tokens, "temperature": 0.8, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}} | ({} if top_p is None else {"top_p": top_p})
    text, used, first = [], 0, None
    t0 = time.perf_counter()
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter()
            data = json.loads(line[6:])
            if data.get("choices"):
                text.append(data["choices"][0].get("text") or "")
            if data.get("usage"):
                used = data["usage"]["completion_tokens"]
    end = time.perf_counter()
    after, _ = ttft_sum(base)
    return {"ttft_ms": round((after - before) * 1e3, 2), "first_chunk_ms": round((first - t0) * 1e3, 2),
            "total_ms": round((end - t0) * 1e3, 1), "tokens": used, "tok_s": round(used / (end - t0), 1),
            "digest": hashlib.md5("".join(text).encode()).hexdigest()[:8]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--servers", required=True, help="comma-separated specs DECODE[:off][:draws0]")
    ap.add_argument("--requests", type=int, default=5, help="requests a server, the first included (default 5)")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--top-k", type=int, default=0, help="the servers' --top-k (default 0)")
    ap.add_argument("--top-p", type=float, default=0.95, help="top_p of every request (default 0.95)")
    ap.add_argument("--port", type=int, default=7800)
    ap.add_argument("--stagger", type=float, default=1.0, help="seconds between the servers' starts")
    ap.add_argument("--ready-timeout", type=float, default=120)
    ap.add_argument("--logs", default=".")
    ap.add_argument("--json")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: more serve flags")
    a = ap.parse_args()
    extra = [x for x in a.serve_args if x != "--"] or ["--device", "cuda", "--resident", "--cuda-graphs", "on"]
    specs = a.servers.split(",")
    procs, t0 = [], {}
    try:
        for i, spec in enumerate(specs):
            decode, *flags = spec.split(":")
            env = dict(os.environ) | dict(ENV[f] for f in flags)
            cmd = [sys.executable, "-m", "sparkd.engine.cli", "serve", a.model, "--listen", f"127.0.0.1:{a.port + i}",
                   "--top-k", str(a.top_k), "--alias", "m", "--decode-graphs", decode, *extra]
            log = open(os.path.join(a.logs, f"server_{i}.log"), "w")
            t0[i] = time.perf_counter()
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env))
            time.sleep(a.stagger)
        ready = {}
        deadline = time.monotonic() + a.ready_timeout
        while len(ready) < len(procs) and time.monotonic() < deadline:
            for i, proc in enumerate(procs):
                if i in ready:
                    continue
                if proc.poll() is not None:
                    raise SystemExit(f"server {i} ({specs[i]}) exited with {proc.returncode}")
                try:
                    if httpx.get(f"http://127.0.0.1:{a.port + i}/health", timeout=2).json().get("status") == "ready":
                        ready[i] = round(time.perf_counter() - t0[i], 2)
                except (httpx.HTTPError, ValueError):
                    pass
            time.sleep(0.25)
        print(f"ready: {ready}", flush=True)
        results = []
        for i, spec in enumerate(specs):
            if i not in ready:
                continue
            base = f"http://127.0.0.1:{a.port + i}"
            runs = [request(base, a.tokens, 100 + r, a.top_p, prompt(r)) for r in range(a.requests)]
            results.append({"server": i, "spec": spec, "ready_s": ready[i], "runs": runs})
            print(f"server {i} {spec:20s} ready {ready[i]:6.2f} s  ttft " +
                  " ".join(f"{r['ttft_ms']:7.2f}" for r in runs) + "  first chunk " +
                  " ".join(f"{r['first_chunk_ms']:6.2f}" for r in runs) + "  tok/s " +
                  " ".join(f"{r['tok_s']:6.1f}" for r in runs) + "  " + " ".join(r["digest"] for r in runs), flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump({"model": os.path.basename(a.model), "results": results}, f, indent=1)
        digests = {tuple(r["digest"] for r in res["runs"]) for res in results}
        print(f"the same texts on every server: {len(digests) == 1}", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
