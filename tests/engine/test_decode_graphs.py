"""serve --decode-graphs (session 20): the decode step's buckets captured at load. On the CPU the
flag's values and which buckets the load asks for, in which order (graphs forced on, every capture
failing); on the GPU box that the tokens are those of a lazy load and that a reply crossing 256
positions captures nothing."""

import argparse
import threading

import pytest
import torch

from sparkd.engine import cuda_graphs
from sparkd.engine.cuda_graphs import StaticDecode, parse_decode_graphs
from sparkd.engine.errors import EngineError
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import SamplingParams
from sparkd.engine.server.metrics import EngineMetrics
from sparkd.engine.server.serve import add_arguments

CTX = 600  # buckets 256, 512, 600
SHAPE = TINY["qwen3moe"].replace(n_ctx=1024)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("dg") / "q.gguf", plan(SHAPE, "F32"), seed=3)[0]


def test_decode_graphs_flag_values():
    assert [parse_decode_graphs(v) for v in ("auto", " Lazy")] == ["auto", "lazy"]
    assert parse_decode_graphs("600,300, 1,300") == (1, 300, 600)
    for bad in ("sometimes", "off", "300,,600", "0", "-5", ""):
        with pytest.raises(EngineError, match=rf"could not use --decode-graphs '{bad}': choose one of auto, lazy or "
                                              r"positions separated by commas, 1 or more each"):
            parse_decode_graphs(bad)
    with pytest.raises(EngineError, match=r"could not use --decode-graphs 'always'"):
        Engine("unused.gguf", decode_graphs="always")
    parser = argparse.ArgumentParser()
    add_arguments(parser, int)
    assert parser.parse_args(["m.gguf"]).decode_graphs == "auto"
    assert parser.parse_args(["m.gguf", "--decode-graphs", "lazy"]).decode_graphs == "lazy"


def load(model, monkeypatch, choice: str) -> tuple[Engine, list[int], list[str]]:
    """An engine loaded with graphs forced on (the CPU has none: each step capture fails, recorded)."""
    tried, logged = [], []

    def no_cuda(self, span):
        tried.append(span)
        raise RuntimeError("no CUDA here")
    monkeypatch.setattr(cuda_graphs, "use_graphs", lambda *args, **kwargs: True)
    monkeypatch.setattr(StaticDecode, "_capture", no_cuda)
    monkeypatch.setenv(cuda_graphs.LOAD_DRAW_GRAPHS_ENV, "0")
    engine = Engine(model, ctx=CTX, resident=True, prompt_graphs="off", decode_graphs=choice, log=logged.append)
    engine.load()
    return engine, tried, logged


@pytest.mark.parametrize("choice, spans", [("auto", [600, 512, 256]), ("lazy", [256]), ("300", [512, 256]),
                                           ("1,513,600", [600, 256])])
def test_the_load_asks_for_the_buckets_longest_first(model, monkeypatch, choice, spans):
    """auto: every bucket up to --ctx, the longest first; lazy: the first (as before session 20); positions:
    their buckets and the first. Each failed capture is logged and given up (its steps run eagerly), a
    summary follows, and /metrics shows the buckets by state."""
    engine, tried, logged = load(model, monkeypatch, choice)
    try:
        assert tried == spans and sorted(engine._step.failed) == sorted(spans)
        given_up = [line for line in logged if line.startswith("decode graph of ")]
        assert given_up == [f"decode graph of {s} positions not captured, run eagerly from now on: RuntimeError: "
                            "no CUDA here" for s in spans]
        assert any(line.startswith(f"decode graphs at load: 0 held, {len(spans)} given up, in ") and
                   line.endswith("s; their pool 0.0 MiB") for line in logged), logged
        stats = engine.decode_graph_stats()
        assert stats == {"captured": 0, "failed": len(spans), "draws": 0, "draws_failed": 0, "pool_bytes": 0}
        text = EngineMetrics(lambda: None, dict, decode_graph_stats=engine.decode_graph_stats).render().decode()
        assert f'sparkd_engine_decode_graphs{{state="failed"}} {len(spans)}.0' in text
        assert 'sparkd_engine_draw_graphs{state="captured"} 0.0' in text
        assert "sparkd_engine_decode_graph_pool_bytes 0.0" in text
        req = GenerationRequest([1, 7, 42], 4, SamplingParams(temperature=0.0))
        assert len(list(engine.generate(req, threading.Event()))) == 4 and tried == spans  # no capture tried again
    finally:
        engine.close()


def test_positions_past_the_context_fail_the_load(model, monkeypatch):
    with pytest.raises(EngineError, match=rf"could not capture decode graphs for 601 positions: the context is {CTX} "
                                          r"positions \(raise --ctx or list fewer in --decode-graphs\)"):
        load(model, monkeypatch, "300,601")


def test_a_negative_decode_graph_margin_is_refused(model):
    net = Engine(model, ctx=CTX, resident=True)
    net.load()
    try:
        with pytest.raises(EngineError, match=r"could not use a decode graph margin of -1 bytes: it must be 0 or more"):
            StaticDecode(net.net, net.net.new_cache(CTX), graphs=False, margin=-1)
    finally:
        net.close()


def test_eager_decode_ignores_the_list(model):
    """The CPU decodes eagerly: a list is ignored with a line, and /metrics has no decode graph family."""
    logged = []
    engine = Engine(model, ctx=CTX, resident=True, prompt_graphs="off", decode_graphs="300", log=logged.append)
    engine.load()
    try:
        assert logged == ["--decode-graphs 300 ignored: the decode step runs eagerly here"]
        assert engine.decode_graph_stats() is None
        assert "decode_graph" not in EngineMetrics(lambda: None, dict, decode_graph_stats=engine.decode_graph_stats)\
            .render().decode()
    finally:
        engine.close()


@pytest.mark.gpu
def test_a_reply_crossing_a_bucket_captures_nothing_under_auto_on_cuda(tmp_path, monkeypatch):
    """A 250-token prompt and a 24-token reply (positions 250-273: the 256 and 512 buckets): --decode-graphs
    auto captured every bucket's step and draw graphs at load and the requests capture none; lazy captures
    256 at load and 512 in the first request; a margin the device cannot keep captures no step (logged, the
    steps eager). The tokens (greedy, and seeded draws of the candidates' and the full draw's paths) are the
    same in all three."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = write_model(tmp_path / "q.gguf", plan(SHAPE, "Q8_0"), seed=3)[0]
    prompt = [(7 * i + 3) % SHAPE.n_vocab for i in range(250)]
    requests = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=40, seed=5),
                SamplingParams(temperature=0.8, top_k=0, seed=5)]
    captured = []
    real = StaticDecode._capture
    monkeypatch.setattr(StaticDecode, "_capture", lambda self, span: captured.append(span) or real(self, span))
    tokens, at_request = {}, {}
    for choice, margin in (("auto", None), ("lazy", None), ("auto", 1 << 50)):
        tag, logged = f"{choice}/{margin}", []
        engine = Engine(path, ctx=CTX, device="cuda", resident=True, cuda_graphs="on", prompt_graphs="off",
                        decode_graphs=choice, prompt_graph_margin=margin, log=logged.append)
        captured.clear()
        engine.load()
        try:
            step, at_load = engine._step, list(captured)
            draws = set(step._draws)
            print(tag, [line for line in logged if "decode graph" in line])
            tokens[tag] = [list(engine.generate(GenerationRequest(prompt, 24, params), threading.Event()))
                           for params in requests]
            at_request[tag] = captured[len(at_load):]
            if tag == "auto/None":
                assert at_load == [600, 512, 256] and at_request[tag] == []
                assert draws == {(s, p) for s in (256, 512, 600) for p in step.sampler.paths}
                assert set(step._draws) == draws  # no request captured a draw graph either
                assert any(line.startswith("decode graphs at load: 3 held, 0 given up") for line in logged), logged
                text = EngineMetrics(lambda: None, dict, decode_graph_stats=engine.decode_graph_stats).render()
                assert 'sparkd_engine_decode_graphs{state="captured"} 3.0' in text.decode()
                assert engine.decode_graph_stats()["pool_bytes"] > 0
            elif choice == "lazy":
                assert at_load == [256] and at_request[tag] == [512]
            else:
                assert sorted(step.failed) == [256, 512, 600] and not step._graphs and not step._draws
                assert any("not captured, run eagerly from now on: it would leave" in line for line in logged)
        finally:
            engine.close()
    assert tokens["auto/None"] == tokens["lazy/None"] == tokens[f"auto/{1 << 50}"]
    assert all(len(t) == 24 for t in tokens["auto/None"])
