"""Temperature sampling on the device (device_sampler.DeviceSampler, StaticDecode.begin_sampling)
against its definition: the distribution equals the host Sampler's bit for bit on the CPU, the
draws follow it (chi-square over many seeds, deterministic), a seed repeats its tokens, greedy is
untouched, and $SPARKD_DEVICE_SAMPLING refuses what it does not know. On the GPU box: the captured
draw against the eager one, the distribution against the host's, the engine's seeded requests."""

from dataclasses import replace

import pytest
import torch

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.device_sampler import DEVICE_SAMPLING_ENV, RING_TOKENS, DeviceSampler, \
    device_drawable, softmax
from sparkd.engine.errors import EngineError
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model
from sparkd.engine.runtime import GenerationRequest
from sparkd.engine.sampler import Sampler, SamplingParams, filter_logits

V = 1000
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=40),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.05),
    SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02, repetition_penalty=1.3),
    SamplingParams(temperature=0.5, top_k=1),
    SamplingParams(temperature=2.0, top_p=0.3, repetition_penalty=0.8, repetition_window=5),
]
# chi-square critical values at p = 0.001 by degrees of freedom
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46}


def rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = [torch.randn(V, generator=g) * 3 for _ in range(3)]
    out[1] = out[1].round()             # many ties among ranked logits
    out[2][100:] = -30.0                # a long flat tail
    return out


def history_of(i: int) -> list[int]:
    return [(37 * i + 11 * k) % V for k in range(90)]


@pytest.mark.parametrize("pi", range(len(PARAMS)))
def test_distribution_equals_the_host_samplers(pi):
    """Same logits, history and bias: the same float64 probabilities, bit for bit; what survives
    the filters (probability > 0) is what the host's filter_logits keeps."""
    p, ds = PARAMS[pi], DeviceSampler(V, "cpu")
    bias = torch.zeros(V)
    bias[[3, 500]] = torch.tensor([4.0, -2.5])
    for i, row in enumerate(rows()):
        hist = history_of(i)
        for b in (None, bias):
            ds.begin(p, hist, b)
            got = ds.probabilities(row)[1]
            want = Sampler(p).probabilities(row if b is None else row + b, hist)
            assert torch.equal(got, want), (p, i)
        ds.begin(replace(p, repetition_penalty=1.0))
        kept = torch.isfinite(filter_logits(row, p.top_k, p.top_p, p.min_p))
        assert torch.equal(ds.probabilities(row)[1] > 0, kept), (p, i)


def test_pushed_tokens_join_the_penalty_window():
    """The ring holds the last `window` tokens fed: after pushes, the distribution equals the
    host's over the history grown by the same tokens."""
    p = SamplingParams(temperature=0.9, repetition_penalty=1.5, repetition_window=6)
    ds, row, hist = DeviceSampler(V, "cpu", ring_tokens=8), rows()[0], [5, 6, 7]
    ds.begin(p, hist)
    for token in [int(i) for i in torch.argsort(rows()[0], descending=True)[:9]]:
        ds.push(torch.tensor([token]))
        hist.append(token)
        assert torch.equal(ds.probabilities(row)[1], Sampler(p).probabilities(row, hist))
    assert sorted(set(ds.ring.tolist()) - {V}) == sorted(set(hist[-6:]))


def test_begin_counts_the_window_and_resets_the_bias():
    """begin makes the window's counts (the fused kernels' penalty) and the bias on the device: the
    counts are the ring's bincount (the empty slots at [V]), and a request without a bias after one
    with it gets zeros."""
    ds = DeviceSampler(V, "cpu")
    bias = torch.zeros(V)
    bias[[3, 999]] = torch.tensor([2.0, -1.5])
    p = SamplingParams(temperature=0.8, repetition_penalty=1.2, repetition_window=8)
    ds.begin(p, [5, 7, 5, 9, 11, 13, 5, 2, 3, 4, 5], bias)
    assert torch.equal(ds.bias, bias)
    assert ds.ring[:8].tolist() == [9, 11, 13, 5, 2, 3, 4, 5]
    assert torch.equal(ds.counts, torch.bincount(ds.ring, minlength=V + 1).int()) and int(ds.counts[5]) == 2
    ds.begin(SamplingParams(temperature=0.8))
    assert not ds.bias.any() and int(ds.counts[V]) == RING_TOKENS and int(ds.counts.sum()) == RING_TOKENS


def counts_over_seeds(ds: DeviceSampler, p: SamplingParams, row: torch.Tensor, n: int) -> torch.Tensor:
    counts = torch.zeros(row.numel(), dtype=torch.long)
    for seed in range(n):
        ds.begin(replace(p, seed=seed))
        counts[int(ds.draw(row))] += 1
    return counts


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    live = probs > 0
    expected = probs[live] * counts.sum()
    return float(((counts[live] - expected) ** 2 / expected).sum()), int(live.sum()) - 1


DRAW_CASE = (SamplingParams(temperature=0.9, top_k=6, top_p=0.97),
             torch.tensor([2.0, 1.5, 1.4, 0.3, -0.2, -0.5, -1.0, -3.0]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_draws_over_seeds_follow_the_distribution(device):
    p, row = DRAW_CASE
    probs = Sampler(p).probabilities(row)
    counts = counts_over_seeds(DeviceSampler(row.numel(), device), p, row.to(device), 4000)
    assert counts[probs == 0].sum() == 0, counts
    chi2, dof = chi_square(counts, probs)
    assert chi2 < CHI2_CRIT[dof], (chi2, dof, counts, probs)
    # the same test rejects a draw off by one rank: it can fail
    shifted = torch.roll(probs[:6], 1)
    assert chi_square(counts[:6], shifted / shifted.sum())[0] > CHI2_CRIT[5]


def test_a_seed_repeats_its_draws():
    p, row = DRAW_CASE
    ds = DeviceSampler(row.numel(), "cpu")
    runs = []
    for seed in (7, 7, 8):
        ds.begin(replace(p, seed=seed))
        runs.append([int(ds.draw(row)) for _ in range(30)])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_what_draws_on_the_device():
    """(the switch's values: tests/engine/test_switches.py)"""
    assert not device_drawable(SamplingParams(temperature=0.0))
    assert device_drawable(SamplingParams(temperature=0.7, repetition_penalty=1.1, repetition_window=RING_TOKENS))
    assert not device_drawable(SamplingParams(temperature=0.7, repetition_penalty=1.1,
                                              repetition_window=RING_TOKENS + 1))
    assert device_drawable(SamplingParams(temperature=0.7, repetition_window=RING_TOKENS + 1))
    ds = DeviceSampler(V, "cpu")
    ds.begin(PARAMS[1], [1, 2])
    before = (ds.temperature.clone(), ds.ring.clone())
    with pytest.raises(EngineError, match="could not sample on the device .* temperature > 0"):
        ds.begin(SamplingParams(temperature=0.0), [3, 4])
    assert torch.equal(ds.temperature, before[0]) and torch.equal(ds.ring, before[1])  # untouched


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny") / "q.gguf", plan(TINY["qwen3moe"], "F32"), seed=3)[0]


def decode(net, device: str, params: SamplingParams, n: int, graphs: bool, **kw) -> tuple[bool, list[int]]:
    cache = net.new_cache(32)
    net(torch.tensor([1, 7, 42]), cache)
    step = StaticDecode(net, cache, graphs, 4, **kw)
    drawing, token, out = step.begin_sampling(params, [1, 7, 42]), 3, []
    for _ in range(n):
        token = step.next_token(token)
        out.append(token)
    assert not step.failed  # with graphs: every step and draw replayed a graph
    return drawing, out


def test_static_decode_draws_with_the_seed_and_greedy_is_unchanged(tiny):
    m = load_model(tiny, device="cpu")
    try:
        hot = SamplingParams(temperature=1.5, seed=11)
        a, b = decode(m.net, "cpu", hot, 8, False), decode(m.net, "cpu", hot, 8, False)
        other = decode(m.net, "cpu", SamplingParams(temperature=1.5, seed=12), 8, False)
        assert a[0] and a == b and a[1] != other[1]
        greedy = decode(m.net, "cpu", SamplingParams(temperature=0.0), 8, False)
        plain = decode(m.net, "cpu", hot, 8, False, device_sampling=False)
        assert not greedy[0] and not plain[0]
        assert greedy[1] == plain[1]  # not drawing: next_token is the argmax, whatever the request
        assert greedy[1] == decode(m.net, "cpu", SamplingParams(temperature=0.0), 8, False, device_argmax=True)[1]
    finally:
        m.close()


def test_the_first_token_is_drawn_where_the_request_draws(tiny):
    """StaticDecode.pick_from over the prompt's last row: a request that draws on the device draws its
    first token there too (the chain begin set up: its bias, the prompt in the penalty's ring, the
    seed's stream; the host Sampler's generator left alone); one that does not (device sampling off)
    takes the host Sampler's pick over the row plus the bias, as before."""
    m = load_model(tiny, device="cpu")
    try:
        prompt = [1, 7, 42]
        row = m.net(torch.tensor(prompt), m.net.new_cache(8), last=True)[-1]
        bias = torch.zeros(row.numel())
        bias[5] = 3.0
        picks = {}
        for sampling in ("torch", False):
            step = StaticDecode(m.net, m.net.new_cache(8), graphs=False, device_sampling=sampling)
            got, want = [], []
            for seed in range(8):
                params = SamplingParams(temperature=2.0, repetition_penalty=1.3, seed=seed)
                assert step.begin_sampling(params, prompt, bias) == bool(sampling)
                sample = Sampler(params)
                state = sample.generator.get_state()
                got.append(step.pick_from(row, sample, prompt, bias))
                if sampling:
                    assert torch.equal(sample.generator.get_state(), state)
                    ds = DeviceSampler(row.numel(), "cpu")
                    ds.begin(params, prompt, bias)
                    want.append(int(ds.draw(row)))
                else:
                    want.append(Sampler(params)(row + bias, prompt))
            assert got == want, sampling
            picks[sampling] = got
        assert picks["torch"] != picks[False]  # the device's stream, not the host generator's
    finally:
        m.close()


@pytest.mark.gpu
def test_captured_draw_equals_the_eager_draw_and_repeats(tmp_path):
    # Q8_0: the routed experts run the Triton MoE kernels, which a graph can capture (F32's don't)
    m = load_model(write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0], device="cuda")
    try:
        hot = SamplingParams(temperature=1.2, top_p=0.95, repetition_penalty=1.2, seed=5)
        eager = decode(m.net, "cuda", hot, 16, False)
        captured = [decode(m.net, "cuda", hot, 16, True) for _ in range(2)]
        assert eager[0] and captured[0] == captured[1] == eager
    finally:
        m.close()


@pytest.mark.gpu
def test_cuda_distribution_is_the_hosts_within_rounding():
    for p in PARAMS:
        ds = DeviceSampler(V, "cuda")
        for i, row in enumerate(rows()):
            ds.begin(p, history_of(i))
            got = ds.probabilities(row.cuda())[1].cpu()
            want = Sampler(p).probabilities(row, history_of(i))
            # float32 division by the penalty may round differently on the GPU
            assert torch.equal(got > 0, want > 0) and torch.allclose(got, want, rtol=1e-5, atol=1e-12), (p, i)


@pytest.mark.gpu
def test_engine_seeded_requests_repeat_on_and_off_the_device(tmp_path, monkeypatch):
    from test_device_argmax import generate_on_and_off

    req = GenerationRequest([1, 7, 42], 12, SamplingParams(temperature=0.9, top_k=40, seed=3), {5: 1.5})
    got = generate_on_and_off(tmp_path, monkeypatch, DEVICE_SAMPLING_ENV, req, "drawing", runs=2)
    for flag, (runs, drawing) in got.items():
        assert drawing == (flag == "1")
        assert runs[0] == runs[1] and runs[0], flag


def test_the_spelled_out_softmax_is_torchs_within_rounding():
    """What the GPU runs (softmax() off the CPU), checked here on CPU tensors by its formula."""
    for row in rows():
        x = row.double() / 0.7
        e = torch.exp(x - x.max())
        assert torch.allclose(e / e.sum(), softmax(x), rtol=1e-12, atol=1e-300)


def test_made_in_inference_mode_it_still_takes_requests():
    """StaticDecode may make its sampler inside inference mode (a capture); a request's begin()
    later refills the buffers outside it."""
    with torch.inference_mode():
        ds = DeviceSampler(V, "cpu")
    ds.begin(PARAMS[4], [1, 2, 3])
    assert int(ds.top_k) == 50 and sorted(set(ds.ring.tolist())) == [1, 2, 3, V]
