"""The server's time to first token counts from the request's arrival: the body's parsing, the prompt's encode or
chat template and the wait for the decode slot are in it (before session 20 it started after the encode, which hid
the first request's pre-tokenizer compile, 0.2-0.9 s). The load opens what the first streamed response opens
(session 21: anyio's backend, imported on first use)."""

from __future__ import annotations

import re
import time

import pytest
from starlette.testclient import TestClient

from engine_server import make_tiny_model
from sparkd.engine.runtime import Engine
from sparkd.engine.server import app
from sparkd.engine.server.app import EngineServer, ServerConfig

SLOW = 0.25  # seconds the prompt's preparation is made to take


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = Engine(str(make_tiny_model(tmp_path_factory.mktemp("ttft") / "m.gguf")), resident=True)
    server = EngineServer(engine, ServerConfig("m"))
    server.load()
    yield server
    engine.close()


def ttft_sum(server: EngineServer) -> float:
    text = server.metrics.render().decode()
    return float(re.search(r"^sparkd_engine_time_to_first_token_seconds_sum (\S+)$", text, re.M).group(1))


@pytest.mark.parametrize("path, body, prepare", [
    ("/v1/completions", {"prompt": "hello there"}, "text_prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}]}, "chat_prompt"),
])
def test_the_time_to_first_token_counts_the_prompts_preparation(server, monkeypatch, path, body, prepare):
    real = getattr(server.engine, prepare)

    def slow(*args, **kwargs):
        time.sleep(SLOW)
        return real(*args, **kwargs)
    monkeypatch.setattr(server.engine, prepare, slow)
    before = ttft_sum(server)
    response = TestClient(server.app()).post(path, json={"model": "m", "max_tokens": 2, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    assert ttft_sum(server) - before >= SLOW


@pytest.mark.parametrize("value, opened", [(None, 1), ("0", 0)])
def test_the_load_opens_what_the_first_stream_opens(tmp_path, monkeypatch, value, opened):
    """SPARKD_LOAD_STREAM (session 21): the load opens an anyio task group (starlette's streamed response opens
    one first, and anyio imports its backend then: 61-88 ms of a fresh H200 server's first time to first token);
    "0" leaves it to the first stream."""
    opens = []

    async def spy():
        opens.append(1)
        await real()
    real = app._open_task_group
    monkeypatch.setattr(app, "_open_task_group", spy)
    if value is None:
        monkeypatch.delenv(app.LOAD_STREAM_ENV, raising=False)
    else:
        monkeypatch.setenv(app.LOAD_STREAM_ENV, value)
    engine = Engine(str(make_tiny_model(tmp_path / "m.gguf")), resident=True)
    server = EngineServer(engine, ServerConfig("m"))
    try:
        server.load()
        assert len(opens) == opened and server.state.status == "ready"
        body = {"model": "m", "prompt": "hello", "max_tokens": 2, "temperature": 0, "stream": True}
        response = TestClient(server.app()).post("/v1/completions", json=body)
        assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
    finally:
        engine.close()
