"""`sparkd-engine serve` streams routed experts under its memory plan: the openai client gets the
same greedy reply as with every expert resident, /admin/cache shrinks and grows the cache within
what the plan allocated, /metrics counts the cache's traffic, and a budget too small for the plan
fails the load naming each term."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from starlette.testclient import TestClient

from engine_server import API_KEY, EngineProcess, free_port, make_tiny_model, metric_value, python_env
from sparkd.engine.runtime import Engine
from sparkd.engine.server.app import EngineServer, ServerConfig

CTX = 96
SLOT_BYTES = 24576  # one expert of the tiny qwen3moe (gate+up+down, 4 KiB bracketed)
ALL_SLOTS = 16  # its 2 MoE layers x 8 experts; a 2 GiB budget allocates them all
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "Hello, how are you today?"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


def _serve(model, tmp_path_factory, *args: str):
    log = tmp_path_factory.mktemp("log") / "engine.log"
    return EngineProcess(model, "--ctx", str(CTX), "--api-key", API_KEY, "--alias", "tiny", *args,
                         log=log).start()


@pytest.fixture(scope="module")
def resident(model, tmp_path_factory):
    proc = _serve(model, tmp_path_factory, "--resident")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()


@pytest.fixture(scope="module")
def streamed(model, tmp_path_factory):
    proc = _serve(model, tmp_path_factory, "--budget", "2G")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()


def _cache(proc, budget, headers=AUTH) -> httpx.Response:
    return httpx.post(proc.base + "/admin/cache", json={"budget": budget}, headers=headers, timeout=30)


def _complete(proc) -> str:
    r = proc.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    return r.choices[0].text


def test_plan_is_printed_and_exported(streamed):
    assert "memory plan:" in streamed.log.read_text() and "expert cache" in streamed.log.read_text()
    health = streamed.health()
    plan = health["memory_plan"]
    assert plan["budget"] == 2 << 30 and plan["expert_cache"] == ALL_SLOTS * SLOT_BYTES
    assert health["kv_type"] == "f32" and "f32 rows" in streamed.log.read_text()  # --kv-type auto on the CPU
    text = streamed.metrics()
    for term in ("budget", "runtime", "trunk", "kv", "rope", "workspace", "expert_cache"):
        assert metric_value(text, "sparkd_engine_memory_plan_bytes", f'term="{term}"') == plan[term]
    assert plan["rope"] > 0 and "rope tables" in streamed.log.read_text()


def test_streamed_reply_equals_resident_with_a_cache_smaller_than_the_experts(resident, streamed):
    r = _cache(streamed, 4 * SLOT_BYTES)
    assert r.status_code == 200 and r.json()["cache_bytes"] == 4 * SLOT_BYTES, r.text
    before = streamed.metrics()
    assert _complete(streamed) == _complete(resident)
    after = streamed.metrics()
    for name in ("sparkd_engine_cache_requests_total", "sparkd_engine_cache_evictions_total",
                 "sparkd_engine_read_bytes_total", "sparkd_engine_read_busy_seconds_total"):
        assert metric_value(after, name) > metric_value(before, name), name
    requests = metric_value(after, "sparkd_engine_cache_requests_total")
    assert metric_value(after, "sparkd_engine_cache_hits_total") < requests  # misses > 0
    assert metric_value(after, "sparkd_engine_cache_bytes") == 4 * SLOT_BYTES
    assert metric_value(after, "sparkd_engine_read_bandwidth_bytes_per_second") > 0
    assert _cache(streamed, ALL_SLOTS * SLOT_BYTES).status_code == 200


def test_admin_cache_shrinks_then_grows_back_to_the_plan(streamed):
    assert _cache(streamed, "48K").json()["cache_bytes"] == 2 * SLOT_BYTES
    assert httpx.get(streamed.base + "/admin/cache", headers=AUTH, timeout=10).json()["budget"] == 2 * SLOT_BYTES
    r = _cache(streamed, ALL_SLOTS * SLOT_BYTES)
    assert r.json() == {"budget": ALL_SLOTS * SLOT_BYTES, "cache_bytes": ALL_SLOTS * SLOT_BYTES,
                        "previous_bytes": 2 * SLOT_BYTES, "allocated_bytes": ALL_SLOTS * SLOT_BYTES}


@pytest.mark.parametrize("budget, words", [
    ((ALL_SLOTS + 1) * SLOT_BYTES, "could not grow the expert cache"),
    (SLOT_BYTES, "at least top-2 experts"),
    ("lots", "budget"),
    (-1, "budget"),
])
def test_admin_cache_bad_budget_is_400_and_changes_nothing(streamed, budget, words):
    r = _cache(streamed, budget)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "budget" and words in err["message"]
    assert httpx.get(streamed.base + "/admin/cache", headers=AUTH, timeout=10).json()["budget"] == \
        ALL_SLOTS * SLOT_BYTES


def test_admin_cache_needs_the_api_key(streamed):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = _cache(streamed, 2 * SLOT_BYTES, headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(streamed.base + "/admin/cache", headers=headers, timeout=10).status_code == 401
    assert metric_value(streamed.metrics(), "sparkd_engine_cache_bytes") == ALL_SLOTS * SLOT_BYTES


def test_invalid_json_body_is_400(streamed):
    r = httpx.post(streamed.base + "/admin/cache", content=b"{budget", headers=AUTH, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_resident_engine_has_no_cache(resident):
    assert _cache(resident, "1G").status_code == 409
    assert "no expert cache" in _cache(resident, "1G").json()["error"]["message"]
    assert httpx.get(resident.base + "/admin/cache", headers=AUTH, timeout=10).status_code == 409
    assert "sparkd_engine_cache_requests_total" not in resident.metrics()
    assert "experts_resident" in resident.health()["memory_plan"]


def test_budget_below_the_plan_fails_health_naming_the_terms(model):
    server = EngineServer(Engine(model, ctx=CTX, budget_bytes=64 << 10, threads=1), ServerConfig("tiny"))
    with pytest.raises(Exception, match="could not fit the model in a budget of 65536 bytes"):
        server.load()
    r = TestClient(server.app()).get("/health")
    assert r.status_code == 503 and r.json()["status"] == "error"
    for term in ("runtime", "slack", "trunk", "kv", "workspace", "prefetch", "experts", "raise --budget"):
        assert term in r.json()["error"], term


def test_budget_below_the_plan_exits_serve_non_zero(model):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "serve", str(model), "--threads", "1",
                          "--budget", "64K", "--listen", f"127.0.0.1:{port}"],
                         env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "could not fit the model in a budget of 65536 bytes" in out.stderr
    assert "workspace" in out.stderr and "trunk" in out.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
