"""The greedy pick on the device (StaticDecode.next_token, sampler.greedy_pick) against the host
Sampler on the same logits: ties to the lowest id, -inf rows, NaN; the runtime's switch; and on
the GPU box the captured step with the norms writing x's int8 blocks (norm_quant) against the
same step without: the same logits bit for bit, the same greedy tokens through Engine.generate."""

import threading

import pytest
import torch

from sparkd.engine.cuda_graphs import DEVICE_ARGMAX_ENV, StaticDecode, device_argmax_default
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import Sampler, SamplingParams, greedy_pick

GREEDY = SamplingParams(temperature=0.0)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
INF, NAN = float("inf"), float("nan")


def awkward_rows(n_vocab: int = 151936) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(n_vocab, generator=g) for _ in range(6)]
    rows[0][[5, 900, n_vocab - 1]] = 50.0              # a three-way tie: the lowest id
    rows[1][:] = -INF                                  # nothing finite: id 0
    rows[2][::2] = -INF                                # half filtered out
    rows[3][[77, 12345]] = NAN                         # NaN wins, the first one
    rows[4][[3, 4]] = INF                              # +inf tie
    rows[5] = rows[5].round()                          # many ties among rounded values
    return rows


@pytest.mark.parametrize("device", DEVICES)
def test_device_pick_equals_the_host_sampler(device):
    for i, row in enumerate(awkward_rows()):
        assert int(greedy_pick(row.to(device))) == Sampler(GREEDY)(row), i


def test_only_plain_greedy_picks_on_the_device(monkeypatch):
    assert Sampler(GREEDY).plain_argmax
    assert Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.3, repetition_window=0)).plain_argmax
    assert not Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.3)).plain_argmax
    assert not Sampler(SamplingParams(temperature=0.7, seed=1)).plain_argmax
    monkeypatch.setenv(DEVICE_ARGMAX_ENV, "0")
    assert not device_argmax_default()
    monkeypatch.setenv(DEVICE_ARGMAX_ENV, "1")
    assert device_argmax_default()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny") / "q.gguf", plan(TINY["qwen3moe"], "F32"), seed=3)[0]


def test_next_token_is_the_argmax_of_the_step_logits(tiny):
    """On the CPU the static step runs uncaptured: next_token's pick equals the host sampler's
    on the logits the same step returns (two caches fed the same tokens)."""
    m = load_model(tiny, device="cpu")
    try:
        a, b = m.net.new_cache(32), m.net.new_cache(32)
        m.net(torch.tensor([1, 7, 42]), a), m.net(torch.tensor([1, 7, 42]), b)
        picks, logits = StaticDecode(m.net, a, False, 4, device_argmax=True), StaticDecode(m.net, b, False, 4)
        token = 3
        for _ in range(10):
            want = Sampler(GREEDY)(logits(token)[-1])
            token = picks.next_token(token)
            assert token == want
    finally:
        m.close()


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_captured_step_with_norm_quant_gives_the_same_bits(tmp_path, quant):
    from sparkd.engine.kernels import fused

    shape = TINY["qwen3moe"] if quant == "Q8_0" else TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    path = write_model(tmp_path / "q.gguf", plan(shape, quant), seed=3)[0]
    m = load_model(path, device="cuda")
    runs = {}
    try:
        for spec in ("all", "rms_norm,rope_kv,attention,rope_attention,router"):  # the same attention kernel
            before = fused.configure(spec)
            try:
                cache = m.net.new_cache(32)
                m.net(torch.tensor([1, 7, 42]), cache)
                step, token, rows, ids = StaticDecode(m.net, cache, True, 4, device_argmax=True), 3, [], []
                for _ in range(16):
                    token = step.next_token(token)
                    rows.append(step._graphs[step._span(cache.n_past)][1][-1].cpu())
                    ids.append(token)
                    assert token == Sampler(GREEDY)(rows[-1])
                runs[spec] = torch.stack(rows), ids
            finally:
                fused.configure(before)
    finally:
        m.close()
    (a, ids_a), (b, ids_b) = runs.values()
    assert torch.equal(a, b) and ids_a == ids_b


def generate_on_and_off(tmp_path, monkeypatch, env: str, request: GenerationRequest, step_attr: str,
                        runs: int = 1) -> dict:
    """A tiny Q8_0 model's Engine on the GPU (resident, CUDA graphs) with $env 1, then 0: flag ->
    (the request's tokens in each of `runs` runs, the attribute step_attr of its decode step)."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(env, flag)
        engine = Engine(path, ctx=64, device="cuda", resident=True, cuda_graphs="on")
        engine.load()
        try:
            tokens = [list(engine.generate(request, threading.Event())) for _ in range(runs)]
            got[flag] = tokens, getattr(engine._step, step_attr)
        finally:
            engine.close()
    return got


@pytest.mark.gpu
def test_engine_greedy_tokens_equal_with_the_device_pick_on_and_off(tmp_path, monkeypatch):
    got = generate_on_and_off(tmp_path, monkeypatch, DEVICE_ARGMAX_ENV, GenerationRequest([1, 7, 42], 12, GREEDY),
                              "device_argmax")
    (on, picked_on), (off, picked_off) = got["1"], got["0"]
    assert picked_on and not picked_off
    assert on == off and on[0]
