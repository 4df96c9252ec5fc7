"""`sparkctl bench`: a standard prompt + decode benchmark against a running service's OpenAI API.

Each run streams one /v1/completions request whose prompt is exactly `prompt_tokens` token ids
(no tokenizer on this side, so every model gets the same prompt length) and asks for
`gen_tokens` tokens at temperature 0. Measured on the client, as a user would see it:

- TTFT: request sent -> first chunk carrying text (prefill, queueing and the first token);
- prompt tok/s: prompt tokens / TTFT;
- decode tok/s: (completion tokens - 1) / (first text chunk -> finish chunk).

Token counts come from the server's `usage`, so an early end of text (the model chose its EOS)
is counted right. Results go to a JSON-lines history, one line per `sparkctl bench`.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .. import __version__
from ..errors import PolicyError, SparkdError
from ..policy import read_api_key

HISTORY_FILE = "bench-history.jsonl"
# Ids 100..399: ordinary tokens in every vocabulary of 512 or more (special tokens sit at the low
# ids or the top of real vocabularies; the generated test models have 512).
_PROMPT_ID_FIRST, _PROMPT_ID_COUNT = 100, 300
# A run on a streaming 500 GiB model can take many minutes; nothing is gained by giving up sooner.
REQUEST_TIMEOUT_SECONDS = 3600.0
_SOURCE_DIR = Path(__file__).resolve().parents[2]


class BenchError(SparkdError):
    """The benchmark could not run (unknown service, engine not ready, API error)."""


@dataclass(frozen=True)
class Target:
    service: str
    url: str
    memory_max_bytes: int | None
    api_key_file: Path | None = None  # the policy's engine.embedded.api_key_file (sparkctl reads it)


def find_target(status: dict, name: str) -> Target:
    """The service's engine URL from sparkd's status, or a BenchError saying why not."""
    services = {s["name"]: s for s in status.get("services", [])}
    if name not in services:
        known = ", ".join(sorted(services)) or "none"
        raise BenchError(f"could not benchmark {name!r}: sparkd has no such service (known: {known})")
    svc = services[name]
    if svc["state"] not in ("active", "activating", "reloading"):
        raise BenchError(f"could not benchmark {name!r}: the service is {svc['state']}; start it with "
                         f"sparkctl start {name}")
    engine = svc.get("engine")
    if engine is None:
        raise BenchError(f"could not benchmark {name!r}: it is not an embedded engine (engine: command), so sparkd "
                         "does not know its listen address; benchmark it with an OpenAI client directly")
    if engine.get("health") != "ready":
        detail = engine.get("error") or ""
        if engine.get("progress") is not None:
            detail = f"loaded {engine['progress'] * 100:.0f}%"
        raise BenchError(f"could not benchmark {name!r}: its engine at {engine['url']} is {engine.get('health')}"
                         + (f" ({detail})" if detail else "") + "; wait until sparkctl status shows it ready")
    limit = svc.get("memory_max_bytes") or svc.get("memory_max_policy_bytes")
    key_file = svc.get("api_key_file")
    return Target(name, engine["url"], limit, Path(key_file) if key_file else None)


def api_key(target: Target, given: str | None) -> str | None:
    """--api-key when given, else the key in the service's api_key_file (as sparkd reads it)."""
    if given or target.api_key_file is None:
        return given
    try:
        return read_api_key(target.api_key_file)
    except PolicyError as exc:
        raise BenchError(f"could not benchmark {target.service!r}: {exc} (services.{target.service}.engine."
                         "embedded.api_key_file); or pass --api-key") from None


def prompt_ids(count: int) -> list[int]:
    return [_PROMPT_ID_FIRST + i % _PROMPT_ID_COUNT for i in range(count)]


def _api_error(response: httpx.Response, url: str) -> BenchError:
    response.read()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200] or f"HTTP {response.status_code}"
    hint = "; pass --api-key, or check the service's engine.embedded.api_key_file" if response.status_code == 401 else ""
    return BenchError(f"could not run the benchmark request at {url}: HTTP {response.status_code}: {message}{hint}")


def _events(response: httpx.Response):
    """The JSON objects of a server-sent event stream, up to [DONE]."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            return
        body = json.loads(data)
        if "error" in body:
            raise BenchError(f"could not finish the benchmark request: {body['error'].get('message')}")
        yield body


def run_once(http: httpx.Client, url: str, model: str, prompt_tokens: int, gen_tokens: int) -> dict:
    """One streamed request: token counts, TTFT, prompt and decode speed."""
    body = {"model": model, "prompt": prompt_ids(prompt_tokens), "max_tokens": gen_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    first = end = None
    usage = None
    sent = time.perf_counter()
    with http.stream("POST", url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        if response.status_code >= 400:
            raise _api_error(response, url)
        for event in _events(response):
            now = time.perf_counter()
            choice = event["choices"][0] if event.get("choices") else {}
            if choice.get("text") and first is None:
                first = now
            if choice.get("finish_reason"):
                end = now
            usage = event.get("usage") or usage
    if usage is None or end is None:
        raise BenchError(f"could not measure the benchmark request at {url}: the stream ended without a finish and usage")
    first = end if first is None else first
    ttft = first - sent
    n_out = usage["completion_tokens"]
    decode = (n_out - 1) / (end - first) if n_out > 1 and end > first else None
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": n_out, "ttft_seconds": ttft,
            "prompt_tokens_per_second": usage["prompt_tokens"] / ttft if ttft > 0 else None,
            "decode_tokens_per_second": decode}


def spread(values: list[float | None]) -> dict:
    """{"min", "median", "max"} of the values measured (None where a run had none)."""
    found = [v for v in values if v is not None]
    if not found:
        return {"min": None, "median": None, "max": None}
    return {"min": min(found), "median": statistics.median(found), "max": max(found)}


def served_model(http: httpx.Client, url: str) -> str:
    response = http.get(url + "/v1/models", timeout=30.0)
    if response.status_code >= 400:
        raise _api_error(response, url)
    return response.json()["data"][0]["id"]


def engine_budget_bytes(http: httpx.Client, url: str) -> int | None:
    """The engine's --budget from its memory plan metric; None when it was started without one."""
    try:
        text = http.get(url + "/metrics", timeout=30.0).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith('sparkd_engine_memory_plan_bytes{term="budget"}'):
            return int(float(line.split()[-1]))
    return None


def commit_id(source_dir: Path = _SOURCE_DIR) -> str:
    """`git describe` of the checkout sparkctl runs from, else the package version."""
    try:
        out = subprocess.run(["git", "-C", str(source_dir), "describe", "--always", "--dirty", "--tags"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return f"sparkd {__version__}"


def machine(cpuinfo_path: Path = Path("/proc/cpuinfo"), meminfo_path: Path = Path("/proc/meminfo")) -> dict:
    """hostname, CPU model, CPU count, memory: what makes two history lines comparable."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in cpuinfo_path.read_text().splitlines():
            if line.startswith("model name"):  # x86; arm64 kernels omit it
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in meminfo_path.read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpu": cpu, "cpu_count": os.cpu_count(), "memory_total_bytes": memory}


def append_history(path: Path, record: dict) -> None:
    """One JSON line, appended with a single write so concurrent benches do not interleave."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as exc:
        raise BenchError(f"could not append to the bench history {path}: {exc.strerror or exc}; "
                         "pass --state-dir DIR or --no-save") from exc
