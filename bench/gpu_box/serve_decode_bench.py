"""The OpenAI server's streamed decode rate, the way a client sees it: `sparkd-engine serve` in its own
process, the real openai client, streamed completions with a temperature.

For each --top-k value of the server (the default for requests that send none), one server process:
wait for /health "ready", one warm-up request (the draw graph's first capture), then --reps streamed
completions of --tokens tokens each: the usage's completion_tokens over the time from the request to
its last chunk (the server merges tokens into chunks where text is held back, so chunks are not
tokens), and the time to the first text. The warm-up is also read from the server's side (/metrics right
after it: its time to first token and decode tok/s, which a random test model's held-back text hides from
the client), with the time the server took to be ready. Run it on the box:

    python3 bench/gpu_box/serve_decode_bench.py --model M.gguf --top-k 40,0 --json out.json

--top-p sends that top_p in every request (session 17; with --top-k 0: the device's top-p path, session 19).

--prompt-tokens N (session 20) sends a prompt of about N tokens of the model's tokenizer instead (the story
prompt, then filler words): past 256 the first request's first decode step is in the 512 bucket, whose step
and draw graphs a --decode-graphs lazy server captures inside that request. The result then also has the
server's decode graph gauges after the load and after the first request, the first request's inter-token
latencies over 25 and 50 ms (/metrics histogram), and the server process's device memory after the load
(nvidia-smi), so auto and lazy loads can be compared:

    python3 bench/gpu_box/serve_decode_bench.py --model M.gguf --top-k 40 --prompt-tokens 300 --reps 1 \
        -- --device cuda --resident --cuda-graphs on --ctx 32768 --decode-graphs lazy

Each value's servers are started one after the other (never two on the device at once). --server-log
keeps their stderr (the load's log lines), one file per --top-k value.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import httpx
import openai

PROMPT = "Write a long story about a lighthouse keeper."
FILLER = "The keeper climbed the stairs at dusk and lit the lamp while the sea rose against the rocks."


def long_prompt(model_path: str, n_tokens: int) -> str:
    """PROMPT, then FILLER's words until the model's tokenizer gives n_tokens or more (the server's count:
    its BOS included)."""
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.tokenizer import Tokenizer

    m = GGUFModel.open(model_path)
    try:
        tok = Tokenizer(m.metadata, model_path)
    finally:
        m.close()
    text, words = PROMPT, FILLER.split()
    for i in range(100 * n_tokens):
        if len(tok.encode(text, add_special=True, parse_special=False)) >= n_tokens:
            return text
        text += " " + words[i % len(words)]
    raise SystemExit(f"could not make a prompt of {n_tokens} tokens")


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(base + "/health", timeout=2).json().get("status") == "ready":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not ready after {timeout_s:.0f} s")


def streamed(client: openai.OpenAI, model: str, tokens: int, seed: int, top_p: float | None = None,
             prompt: str = PROMPT) -> dict:
    """One streamed completion: time to the first text, tok/s over the whole request."""
    t0 = time.perf_counter()
    first = None
    used = prompt_tokens = 0
    cut = {} if top_p is None else {"top_p": top_p}
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0.8,
                                       seed=seed, stream=True, stream_options={"include_usage": True}, **cut)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter()
        if chunk.usage:
            used, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
    end = time.perf_counter()
    if used < tokens:
        raise SystemExit(f"the reply had {used} of {tokens} tokens (an end token?): not a decode to time")
    # a random test model's tokens can all be held back as incomplete text (no text chunk before the last)
    return {"first_text_ms": None if first is None else round((first - t0) * 1e3, 1), "tokens": used,
            "prompt_tokens": prompt_tokens, "tok_s": round(used / (end - t0), 1)}


def scrape(base: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            values[name] = float(value)
    return values


def graph_gauges(values: dict[str, float]) -> dict:
    """The decode step's and draws' graphs by state and their pool (absent where the step is eager)."""
    return {key: values.get(f'sparkd_engine_{name}{{state="{state}"}}') for key, name, state in (
        ("steps", "decode_graphs", "captured"), ("steps_failed", "decode_graphs", "failed"),
        ("draws", "draw_graphs", "captured"), ("draws_failed", "draw_graphs", "failed"))} | \
        {"pool_mib": round(values.get("sparkd_engine_decode_graph_pool_bytes", 0) / 2**20, 1)}


def server_side(base: str) -> dict:
    """The server's own account of its only finished request (/metrics): time to first token (arrival to
    the first token), decode tok/s (the tokens after the first over their time), its inter-token latencies
    over 25 and 50 ms (a capture inside the stream shows there), the graph gauges after it."""
    values = scrape(base)
    itl = "sparkd_engine_inter_token_latency_seconds"
    count = values[f"{itl}_count"]
    return {"ttft_ms": round(values["sparkd_engine_time_to_first_token_seconds_sum"] * 1e3, 1),
            "decode_tok_s": round(values["sparkd_engine_decode_tokens_per_second"], 1),
            "itl_over_25ms": int(count - values[f'{itl}_bucket{{le="0.025"}}']),
            "itl_over_50ms": int(count - values[f'{itl}_bucket{{le="0.05"}}']),
            "itl_max_bucket_s": next((float(le) for le in ("0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
                                                           "0.25", "0.5", "1.0")
                                      if values.get(f'{itl}_bucket{{le="{le}"}}') == count), None),
            "graphs": graph_gauges(values)}


def device_mib(pid: int) -> int | None:
    """The process's device memory as nvidia-smi reports it (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return next((int(mib) for p, mib in rows if int(p) == pid), None)


def one_server(model_path: str, top_k: int, port: int, tokens: int, reps: int, extra: list[str],
               top_p: float | None = None, log_path: str | None = None, prompt: str = PROMPT) -> dict:
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sparkd.engine.cli", "serve", model_path, "--listen", f"127.0.0.1:{port}",
           "--top-k", str(top_k), "--alias", "m", *extra]
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        wait_ready(base, proc, 120)
        ready_s = round(time.perf_counter() - t0, 2)
        loaded = {"device_mib": device_mib(proc.pid), "graphs": graph_gauges(scrape(base))}
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        warm = streamed(client, "m", tokens, seed=0, top_p=top_p, prompt=prompt) | {"server": server_side(base)}
        runs = [streamed(client, "m", tokens, seed=1 + i, top_p=top_p, prompt=prompt) for i in range(reps)]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log_path:
            log.close()
    rates = sorted(r["tok_s"] for r in runs)
    return {"top_k": top_k, "top_p": top_p, "ready_s": ready_s, "loaded": loaded, "warm_up": warm, "runs": runs,
            "median_tok_s": rates[len(rates) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--top-k", default="40,0", help="the servers' --top-k values, comma-separated (default 40,0)")
    ap.add_argument("--tokens", type=int, default=256, help="completion tokens a request (default 256)")
    ap.add_argument("--reps", type=int, default=3, help="timed requests a server (default 3)")
    ap.add_argument("--port", type=int, default=7791, help="the servers' port (default 7791)")
    ap.add_argument("--top-p", type=float, help="top_p sent in every request (default: none sent)")
    ap.add_argument("--prompt-tokens", type=int, help="a prompt of about this many tokens (default: the short one)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--server-log", help="the servers' stderr to this file (.K appended: the --top-k value)")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER,
                    help="after --: more serve flags (default: --device cuda --resident --cuda-graphs on)")
    a = ap.parse_args()
    extra = [x for x in a.serve_args if x != "--"] or ["--device", "cuda", "--resident", "--cuda-graphs", "on"]
    results = []
    prompt = PROMPT if a.prompt_tokens is None else long_prompt(a.model, a.prompt_tokens)
    for k in (int(v) for v in a.top_k.split(",")):
        r = one_server(a.model, k, a.port, a.tokens, a.reps, extra, a.top_p,
                       a.server_log and f"{a.server_log}.{k}", prompt)
        print(f"serve --top-k {k} (top_p {a.top_p}): ready in {r['ready_s']} s, {r['loaded']}; {r['median_tok_s']} "
              f"tok/s (median of {a.reps}), first text {r['runs'][0]['first_text_ms']} ms; warm-up {r['warm_up']}",
              flush=True)
        results.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(a.model), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
