"""Kimi K3 parts on their own: the router at K3's real expert count, the KDA recurrent state
(per sequence, reset by a new cache, counted by the memory plan; a prompt's delta rule in chunks),
and clear configuration errors."""

import pytest
import torch

import sparkd.engine.models  # noqa: F401  first: layers.moe and models import each other
from sparkd.engine.errors import ModelError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers import kda
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.moe import Router
from sparkd.engine.layers.situ import situ
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model
from sparkd.engine.models.config import GATING_SIGMOID
from sparkd.engine.models.kimi_k3 import config
from sparkd.engine.streaming.plan import kv_bytes

TOKENS = torch.tensor([1, 5, 9, 300, 22, 17, 40, 41])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("k3") / "k3.gguf", plan(TINY["kimi-k3"], "F32"), seed=3)[0]


def _reference_route(x, gate_w, bias, k, scale):
    # plain torch, written from llama.cpp's build_moe_ffn: sigmoid, biased selection, unbiased
    # weights renormalised over the selection, then scaled
    probs = torch.sigmoid(x @ gate_w.T)
    ids = torch.argsort(probs + bias, dim=-1, descending=True)[:, :k]
    w = torch.gather(probs, 1, ids)
    return w / w.sum(-1, keepdim=True) * scale, ids


def test_router_picks_top16_of_896_experts_like_a_plain_reference():
    g = torch.Generator().manual_seed(0)
    x, gate_w = torch.randn(5, 64, generator=g), torch.randn(896, 64, generator=g) * 0.2
    bias = torch.randn(896, generator=g) * 0.1
    router = Router(Linear(gate_w), 16, GATING_SIGMOID, norm_w=True, scale=2.5, sel_bias=bias)
    w, ids = router(x)
    ref_w, ref_ids = _reference_route(x, gate_w, bias, 16, 2.5)
    assert ids.shape == (5, 16) and int(ids.max()) >= 512  # experts past 512 are reachable
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    got = torch.zeros(5, 896).scatter(1, ids, w)
    want = torch.zeros(5, 896).scatter(1, ref_ids, ref_w)
    assert torch.allclose(got, want, atol=1e-6)


def test_a_new_cache_is_a_new_sequence(tiny):
    m = load_model(tiny)
    try:
        first = m.net(TOKENS, m.net.new_cache(16))
        used = m.net.new_cache(16)
        m.net(TOKENS[:3], used)
        assert any(s.abs().sum() > 0 for ts in used.state.values() for s in ts)  # KDA state was written
        again = m.net(TOKENS, m.net.new_cache(16))
    finally:
        m.close()
    assert torch.equal(first, again)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("T,chunk,decay", [(1, 16, 0.5), (16, 16, 0.5), (37, 16, 0.5), (37, 8, 60.0)])
def test_a_prompts_delta_rule_in_chunks_is_the_token_loops(T, chunk, decay):
    """delta_rule_chunks against the token loop in float64 (the function), from a carried-in state: a chunk, a
    part chunk, several with a shorter last one, and a decay strong enough (g down to -60 a token) that
    exp(-B) would overflow float32 if the chunked form ever took it."""
    g = torch.Generator().manual_seed(T)
    H, D = 3, 16
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    v, s0 = torch.randn(T, H, D, generator=g), torch.randn(H, D, D, generator=g)
    gate, beta = -torch.rand(T, H, D, generator=g) * decay, torch.rand(T, H, generator=g)
    want_o, want_s = kda.delta_rule(*(x.double() for x in (q, k, v, gate, beta, s0)))
    o, s = kda.delta_rule_chunks(q, k, v, gate, beta, s0, chunk)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert _rel(o, want_o) < 1e-6 and _rel(s, want_s) < 1e-6  # float32 rounding (measured 0.8-2.3e-7)
    loop_o, _ = kda.delta_rule(q, k, v, gate, beta, s0)
    assert _rel(loop_o, want_o) < 1e-6  # the loop's own float32 rounding is as large


def _prompt_and_step(m, monkeypatch, rules, tokens=TOKENS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per SPARKD_KDA_PROMPT value of rules: the prompt's logits and the next decode step's, back on the CPU."""
    runs = []
    for rule in rules:
        monkeypatch.setattr(kda, "PROMPT_RULE", rule)
        cache = m.net.new_cache(tokens.numel() + 8)
        prompt = m.net(tokens, cache)
        runs.append((prompt.cpu(), m.net(torch.tensor([7]), cache).cpu()))
    return runs


def test_a_prompt_in_chunks_gives_the_loops_logits(tiny, monkeypatch):
    """The model's prompt with SPARKD_KDA_PROMPT's chunks and its loop: the same logits to float32 rounding, and
    the decode after it (token by token either way) from states that agree as closely; auto (the default) runs
    the loop on the CPU."""
    m = load_model(tiny)
    try:
        (chunks, step_c), (loop, step_l), auto = _prompt_and_step(m, monkeypatch, ("chunks", "loop", "auto"))
    finally:
        m.close()
    assert not torch.equal(chunks, loop)  # the chunks ran (another summation order)
    assert _rel(chunks, loop.double()) < 1e-5 and _rel(step_c, step_l.double()) < 1e-5
    assert torch.equal(auto[0], loop) and torch.equal(auto[1], step_l)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16, 37, 300])
@pytest.mark.parametrize("chunk", [kda.CHUNK, kda.CHUNK_CUDA])
def test_the_chunked_rule_on_cuda_is_the_loops(T, chunk):
    """On CUDA at kimi-k3's KDA shape (64 heads of 128), from a carried-in state: the chunked rule's outputs and
    final state against the loop in float64 (the function; the float32 loop's own error beside it), at lengths
    below, at and past a chunk (a shorter last chunk)."""
    g = torch.Generator().manual_seed(T)
    H, D = 64, 128
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    v, s0 = torch.randn(T, H, D, generator=g), torch.randn(H, D, D, generator=g)
    gate, beta = -torch.rand(T, H, D, generator=g) * 0.5, torch.rand(T, H, generator=g)
    args = [x.cuda() for x in (q, k, v, gate, beta, s0)]
    want_o, want_s = kda.delta_rule(*(x.double() for x in args))
    o, s = kda.delta_rule_chunks(*args, chunk=chunk)
    loop_o, loop_s = kda.delta_rule(*args)
    assert _rel(loop_o, want_o) < 1e-6 and _rel(loop_s, want_s) < 1e-6
    # the H200 (bench/kda_prompt_bench.py, up to 2048 tokens): 2.0-2.3e-7, the state's 1.2-2.5e-7, as the loop's own
    assert _rel(o, want_o) < 1e-6 and _rel(s, want_s) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_a_prompt_on_cuda_runs_in_chunks_and_gives_the_loops_logits(tmp_path, monkeypatch, quant):
    """A tiny kimi-k3 on CUDA, a 40-token prompt: auto (the default) runs the chunks there, of CHUNK_CUDA tokens,
    and they give the loop's logits within float32 rounding, the same top-1 at every position, and the decode
    step after it from states as close. (Q8_0 rounds the KDA output to int8 blocks before wo: on the H200 its
    logits were the loop's bit for bit; F32 carries the 1e-7 differences through.)"""
    path = write_model(tmp_path / "k3.gguf", plan(TINY["kimi-k3"], quant), seed=3)[0]
    m = load_model(path, device="cuda")
    tokens = torch.randint(0, m.cfg.n_vocab, (40,), generator=torch.Generator().manual_seed(1))
    chunked, real = [], kda.delta_rule_chunks
    monkeypatch.setattr(kda, "delta_rule_chunks", lambda *a: chunked.append(a[-1]) or real(*a))
    try:
        runs = {}
        for rule in ("chunks", "loop", "auto"):
            runs[rule] = _prompt_and_step(m, monkeypatch, (rule,), tokens)[0]
            runs[rule + " chunks"] = list(chunked)
            chunked.clear()
    finally:
        m.close()
    n_kda = sum(m.cfg.extra["kda_layers"])
    assert runs["chunks chunks"] == runs["auto chunks"] == [kda.CHUNK_CUDA] * n_kda and runs["loop chunks"] == []
    (chunks, step_c), (loop, step_l), auto = runs["chunks"], runs["loop"], runs["auto"]
    assert torch.equal(auto[0], chunks) and torch.equal(auto[1], step_c)
    assert torch.equal(chunks.argmax(-1), loop.argmax(-1)) and torch.equal(step_c.argmax(-1), step_l.argmax(-1))
    assert _rel(chunks, loop.double()) < 1e-5 and _rel(step_c, step_l.double()) < 1e-5


def test_plan_counts_the_kda_state_and_mla_latent(tiny):
    g = GGUFModel.open(tiny)
    m = load_model(tiny)
    try:
        cfg = config_of(g)
        for ctx in (16, 100):
            assert kv_bytes(cfg, ctx) == m.net.new_cache(ctx).nbytes
        cache = m.net.new_cache(16)
        s = TINY["kimi-k3"]
        assert cache.k[2].shape == (16, 1, s.kv_lora_rank + s.qk_rope)  # MLA: latent + key part
        assert cache.k[0].numel() == 0 and set(cache.state) == {0, 1}  # KDA layers: state only
    finally:
        m.close()
        g.close()


def test_head_count_kv_must_mark_the_layers(tiny):
    g = GGUFModel.open(tiny)
    try:
        md = dict(g.metadata)
    finally:
        g.close()
    md["kimi-k3.attention.head_count_kv"] = 1
    with pytest.raises(ModelError, match="could not configure kimi-k3 model .*head_count_kv must be a per-layer"):
        config(md, "x.gguf")
    md["kimi-k3.attention.head_count_kv"] = [0, 1]
    with pytest.raises(ModelError, match="has 2 entries for 3 layers"):
        config(md, "x.gguf")


def test_situ_matches_its_formula_and_refuses_a_zero_beta():
    gate, up = torch.linspace(-30, 30, 61), torch.linspace(40, -40, 61)
    got = situ(4.0, 16.0)(gate, up)
    want = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * 16.0 * torch.tanh(up / 16.0)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(situ(4.0, 0.0)(gate, up), 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * up)
    with pytest.raises(ValueError, match="situ_beta must be positive, got 0.0"):
        situ(0.0, 1.0)


def test_kda_tensors_as_q8_0_load(tmp_path):
    # the field report's loader failure: ssm_f_b arrives as Q8_0, not F16; any type dequantizes here
    path = write_model(tmp_path / "q8.gguf", plan(TINY["kimi-k3"], "Q8_0"), seed=4)[0]
    with GGUFModel.open(path) as g:
        assert g.tensors["blk.0.ssm_f_b.weight"].ggml_type.name == "Q8_0"
    m = load_model(path)
    try:
        out = m.net(TOKENS, m.net.new_cache(16))
    finally:
        m.close()
    assert torch.isfinite(out).all() and out.std() > 0.1
