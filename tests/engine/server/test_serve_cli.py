"""`sparkd-engine serve` bad inputs give one clear line and exit 2 without serving; /health
reports load progress; the memory plan refuses a too-small --budget with the numbers."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from starlette.testclient import TestClient

from engine_server import EngineProcess, free_port, make_tiny_model, python_env
from sparkd.engine.runtime import Engine
from sparkd.engine.server.app import EngineServer, ServerConfig


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def _serve(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "sparkd.engine.cli", "serve", *args]
    return subprocess.run(argv, env=python_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, words", [
    (["{model}", "--listen", "localhost"], "could not use --listen 'localhost': expected HOST:PORT"),
    (["{model}", "--ctx", "0"], "could not use --ctx 0"),
    (["{model}", "--max-queue", "-1"], "could not use --max-queue -1"),
    (["{model}", "--top-k", "-1"], "could not use --top-k -1: it must be 0 (every token) or more"),
    (["/nonexistent/x.gguf"], "could not open model /nonexistent/x.gguf: no such file"),
    (["{model}", "--api-key-file", "/nonexistent/key"], "could not read --api-key-file /nonexistent/key"),
    (["{model}", "--ctx", "100000"], "could not use --ctx 100000: the model was trained for 256 positions"),
    (["{model}", "--budget", "64K"], "could not fit the model in a budget of 65536 bytes"),
    (["{model}", "--budget", "64K", "--resident"], "could not plan memory for"),
])
def test_bad_arguments_exit_2_with_a_clear_line(model, args, words):
    port = free_port()
    out = _serve(*[a.format(model=model) for a in args], "--listen", f"127.0.0.1:{port}") \
        if "--listen" not in args else _serve(*[a.format(model=model) for a in args])
    assert out.returncode == 2, out.stderr
    assert words in out.stderr, out.stderr
    with pytest.raises(httpx.ConnectError):  # nothing left listening
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_resident_budget_refusal_names_the_terms(model):
    out = _serve(str(model), "--budget", "64K", "--resident", "--listen", f"127.0.0.1:{free_port()}")
    assert "trunk" in out.stderr and "KV" in out.stderr and "exceeds --budget 0.1 MiB" in out.stderr


def test_health_reports_loading_progress_then_ready(model):
    server = EngineServer(Engine(model, threads=1), ServerConfig("tiny"))
    client = TestClient(server.app())
    r = client.get("/health")
    assert (r.status_code, r.json()["status"], r.json()["progress"]) == (503, "loading", 0.0)
    r = client.post("/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 503 and "the model is loading" in r.json()["error"]["message"]
    seen: list[float] = []
    server.load(lambda done, total: seen.append(done / total))
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) > 3
    r = client.get("/health")
    assert (r.status_code, r.json()["status"]) == (200, "ready")
    assert "sparkd_engine_load_progress_ratio 1.0" in client.get("/metrics").text


def test_top_k_default_applies_to_requests_that_send_none(model):
    """serve --top-k's value (ServerConfig.top_k) samples a request without top_k; the body's top_k wins: with
    top-k 1 a temperature-1 draw is the greedy reply, with the body's 0 (every token) the same seed is not."""
    server = EngineServer(Engine(model, threads=1), ServerConfig("tiny", top_k=1))
    server.load()
    client = TestClient(server.app())

    def text(**body) -> str:
        r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 12, **body})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    greedy = text(temperature=0)
    assert text(temperature=1.0, seed=3) == greedy
    assert text(temperature=1.0, seed=3, top_k=0) != greedy


def test_load_failure_is_reported_in_health(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    server = EngineServer(Engine(bad), ServerConfig("bad"))
    with pytest.raises(Exception):
        server.load()
    body = TestClient(server.app()).get("/health").json()
    assert body["status"] == "error" and str(bad) in body["error"]


def test_api_key_file(model, tmp_path):
    key = tmp_path / "key"
    key.write_text("from-file\n")
    proc = EngineProcess(model, "--api-key-file", str(key), log=tmp_path / "log").start()
    try:
        assert httpx.get(proc.base + "/v1/models", timeout=10).status_code == 401
        ok = httpx.get(proc.base + "/v1/models", headers={"Authorization": "Bearer from-file"}, timeout=10)
        assert ok.status_code == 200
    finally:
        assert proc.stop() == 0
