"""The server's time to first token counts from the request's arrival: the body's parsing, the prompt's encode or
chat template and the wait for the decode slot are in it (before session 20 it started after the encode, which hid
the first request's pre-tokenizer compile, 0.2-0.9 s)."""

from __future__ import annotations

import re
import time

import pytest
from starlette.testclient import TestClient

from engine_server import make_tiny_model
from sparkd.engine.runtime import Engine
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
