"""The pipelined decode (StaticDecode.launch/pick/drop, SPARKD_DECODE_PIPELINE): Engine.generate and
the CLI's _decode launch each next step before reading the pick that feeds it, and give exactly what
the one-step-at-a-time loop gives: the tokens (greedy, seeded draws), n_past and the prompt cache's
claimed rows after an end-of-generation token, max_tokens, the context's end, a forced reasoning
token, a cancel, the iterator closed (a stop string) and --feed-tokens, and the same logits for the
next request that continues the cache. CPU: the static step without graphs; gpu: CUDA graphs."""

from __future__ import annotations

import threading

import pytest
import torch

from sparkd.engine import cli
from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.errors import EngineError
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import Sampler, SamplingParams
from sparkd.engine.think import ThinkTags

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=1.2, seed=7)
TAGS = ThinkTags((3,), (4, 5), "<t>", "</t>")
CTX = 64


def script(engine: Engine) -> list[tuple]:
    """A run of requests over one engine, each continuing what the last left in the cache -> per
    request (tokens, n_past, the claimed token ids, the prompt's last logits)."""
    seen = []

    def ask(ids, n, sampling=GREEDY, cancel_at=None, close_at=None, **kw):
        cancel, out = threading.Event(), []
        tokens = engine.generate(GenerationRequest(list(ids), n, sampling, **kw), cancel)
        for token in tokens:
            out.append(token)
            cancel_at is not None and len(out) == cancel_at and cancel.set()
            if len(out) == close_at:  # the server's stop string
                break
        tokens.close()
        seen.append((out, engine._cache.n_past, engine._held.tokens, engine._held.logits))
        return out

    first = ask(range(10, 20), 6)  # max_tokens
    drawn = ask(list(range(10, 20)) + first + [9], 6, HOT)  # seeded draws, the cache continued
    stop = next(t for i, t in enumerate(drawn) if i and t not in drawn[:i])  # mid-way, not first
    eog = engine.tokenizer.eog_ids
    engine.tokenizer.eog_ids = frozenset({stop})
    try:
        ask(list(range(10, 20)) + first + [9], 8, HOT)  # stops at `stop`
    finally:
        engine.tokenizer.eog_ids = eog
    ask([30, 31, 32], 7, GREEDY, think=TAGS, starts_in_reasoning=True, reasoning_budget=2)  # 4, 5 forced
    ask([30, 31, 32, 40], 8, cancel_at=3)
    ask(list(range(1, CTX - 3)), 8)  # the context's end
    ask([30, 31, 32, 40, 41], 6, HOT, close_at=2)  # continues the cancelled request's rows; closed
    ask([30, 31, 32, 40, 41, 8], 3)
    return seen


def static_step(engine: Engine, pipeline: bool) -> Engine:
    engine._step = StaticDecode(engine.net, engine._cache, graphs=False, device_argmax=True,
                                device_sampling="torch", pipeline=pipeline)
    return engine


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    for (tokens, n_past, held, logits), (tokens0, n_past0, held0, logits0) in zip(got, want, strict=True):
        assert (tokens, n_past, held) == (tokens0, n_past0, held0)
        assert torch.equal(logits, logits0)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("pipe") / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=1)[0]


def test_pipelined_generate_equals_the_step_at_a_time_loop(model):
    runs = {}
    for pipeline in (False, True):
        engine = Engine(model, ctx=CTX, threads=1, resident=True)
        engine.load()
        try:
            runs[pipeline] = script(static_step(engine, pipeline))
            assert (engine._step._launched > 0) == pipeline  # the pipelined loop ran (not the other twice)
        finally:
            engine.close()
    assert_same(runs[True], runs[False])
    tokens = [r[0] for r in runs[False]]
    assert len(tokens[0]) == 6 and tokens[2][-1] not in tokens[2][:-1] and len(tokens[2]) < 8
    assert tokens[3][2:4] == [4, 5] and len(tokens[4]) == 3 and runs[False][5][1] == CTX


def test_pipelined_cli_decode_equals_the_step_at_a_time_loop(model):
    from sparkd.engine.models import load_model

    m = load_model(model, device="cpu")
    prompt = [10, 11, 12]
    try:
        for feed, eog, limit in ((None, (), 6), ([7, 8, 9, 8, 7, 6], {9}, 6), ([7, 8, 9, 8], (), 4)):
            got = []
            for pipeline in (False, True):
                cache = m.net.new_cache(len(prompt) + limit)
                step = StaticDecode(m.net, cache, graphs=False, device_argmax=True, pipeline=pipeline)
                logits = m.net(torch.tensor(prompt), cache)
                got.append((cli._decode(step, Sampler(GREEDY), logits, prompt, limit, feed, eog, None), cache.n_past))
                assert (step._launched > 0) == pipeline  # _decode_pipelined ran
            assert got[0] == got[1]
    finally:
        m.close()


def test_generate_and_the_server_draw_the_same_tokens(model):
    """A seeded temperature request: cli._decode (generate) and Engine.generate (the server) give the
    same tokens, the first one included (StaticDecode.pick_from: drawn on the device where the request
    draws there, else the host Sampler's), pipelined or not, with device sampling or without."""
    prompt = list(range(10, 20))
    for sampling, pipeline in (("torch", False), ("torch", True), (False, False)):
        engine = Engine(model, ctx=CTX, threads=1, resident=True)
        engine.load()
        try:
            engine._step = StaticDecode(engine.net, engine._cache, graphs=False, device_argmax=True,
                                        device_sampling=sampling, pipeline=pipeline)
            served = list(engine.generate(GenerationRequest(prompt, 8, HOT), threading.Event()))
            cache = engine.net.new_cache(CTX)
            step = StaticDecode(engine.net, cache, graphs=False, device_argmax=True, device_sampling=sampling,
                                pipeline=pipeline)
            logits = engine.net(torch.tensor(prompt), cache, last=True)
            generated = cli._decode(step, Sampler(HOT), logits, prompt, 8, None, engine.tokenizer.eog_ids, None)[0]
        finally:
            engine.close()
        assert served == generated and served, (sampling, pipeline)


def test_launch_refuses_what_it_cannot_do(model):
    from sparkd.engine.models import load_model

    m = load_model(model, device="cpu")
    try:
        step = StaticDecode(m.net, m.net.new_cache(8), graphs=False, device_argmax=True, pipeline=True)
        with pytest.raises(EngineError, match="no step was launched"):
            step.launch()
        first = step.launch(3)
        step.launch()
        with pytest.raises(EngineError, match="read the pick"):
            step.launch()
        step.drop(first)  # not the newest launch: nothing
        assert step.cache.n_past == 2
        host = StaticDecode(m.net, m.net.new_cache(8), graphs=False, device_argmax=False, pipeline=True)
        with pytest.raises(EngineError, match="device argmax off"):
            host.launch(3)
        assert host.cache.n_past == 0
    finally:
        m.close()


@pytest.mark.gpu
def test_pipelined_generate_with_graphs_equals_the_loop_on_cuda(tmp_path, monkeypatch):
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    runs = {}
    for mode in ("off", "auto"):
        monkeypatch.setenv("SPARKD_DECODE_PIPELINE", mode)
        engine = Engine(path, ctx=CTX, device="cuda", resident=True, cuda_graphs="on")
        engine.load()
        try:
            assert isinstance(engine._step, StaticDecode) and engine._step.pipeline == (mode == "auto")
            runs[mode] = script(engine)
        finally:
            engine.close()
    assert_same(runs["auto"], runs["off"])
