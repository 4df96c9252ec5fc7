"""One decode slot under several clients: served in order or refused with 429, never mixed;
a client that hangs up mid-stream cancels its generation and frees the slot."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine_server import EngineProcess, make_tiny_model, metric_value

CTX = 128
# Waiting for the server to show a queued request; generous for a loaded CI machine.
QUEUE_WAIT_SECONDS = 30.0
PROMPTS = ["The quick brown fox", "Hello, world!", "import torch", "Numbers: 0 1 2", "class Engine:"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("conc")
    model = make_tiny_model(d / "tiny.gguf")
    proc = EngineProcess(model, "--ctx", str(CTX), "--max-queue", "1", log=d / "engine.log").start()
    yield proc
    assert proc.stop() == 0, (d / "engine.log").read_text()


def _complete(client, prompt: str, max_tokens: int = 12):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)


def _wait_for(server, pred, what: str) -> dict:
    deadline = time.monotonic() + QUEUE_WAIT_SECONDS
    while not pred(h := server.health()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {h}"
        time.sleep(0.02)
    return h


def test_parallel_clients_get_their_own_reply_or_429(server):
    client = server.client()
    reference = {p: _complete(client, p).choices[0].text for p in PROMPTS}
    assert len(set(reference.values())) == len(PROMPTS)  # mixing would be visible

    def one(prompt: str):
        try:
            return prompt, _complete(client, prompt).choices[0].text
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["Retry-After"]) >= 1
            return prompt, None
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        results = list(pool.map(one, PROMPTS * 2))
    served = [(p, t) for p, t in results if t is not None]
    assert served, results
    for prompt, text in served:
        assert text == reference[prompt]
    rejected = len(results) - len(served)
    assert metric_value(server.metrics(), "sparkd_engine_requests_rejected_total") >= rejected


def test_full_queue_429_then_disconnect_frees_the_slot(server):
    client = server.client()
    before = server.metrics()
    long = client.completions.create(model="tiny", prompt="Hello", max_tokens=CTX - 8, temperature=0,
                                     stream=True, logit_bias=_no_eos(server))
    next(iter(long))  # the slot is busy generating
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(_complete, client, PROMPTS[0])
        _wait_for(server, lambda h: h["queued"] == 1, "the second request to queue")
        with pytest.raises(openai.RateLimitError, match="queue is full") as err:
            _complete(client, PROMPTS[1])
        assert int(err.value.response.headers["Retry-After"]) >= 1
        long.close()  # hang up mid-stream
        assert queued.result(timeout=60).choices[0].text == _complete(client, PROMPTS[0]).choices[0].text
    after = _wait_for(server, lambda h: h["running"] == 0 and h["queued"] == 0, "the slot to free")
    assert after["status"] == "ready"
    text = server.metrics()
    cancelled = metric_value(text, "sparkd_engine_requests_total", 'finish_reason="cancelled"')
    assert cancelled == metric_value(before, "sparkd_engine_requests_total", 'finish_reason="cancelled"') + 1
    # the cancelled generation stopped early: far fewer tokens than it asked for
    generated = metric_value(text, "sparkd_engine_generated_tokens_total") - \
        metric_value(before, "sparkd_engine_generated_tokens_total")
    assert generated < (CTX - 8) + 2 * 12


def _no_eos(server) -> dict[str, int]:
    from sparkd.engine.tokenizer import Tokenizer, read_gguf_metadata

    tok = Tokenizer(read_gguf_metadata(server.argv[4]))
    return {str(t): -100 for t in tok.eog_ids}
