"""Sliding-window layers keep a ring of rows (layers/kv_cache.py, KVCache.ring): the decode kernels over a ring give
the bits they give over a row per position; gpt-oss's and Gemma 3's logits, eager prompts in chunks, decode steps and
static (CUDA graph) steps past the ring's wrap, are those of the cache of a row per position; the memory plan counts
the rings; a new request goes back at most rewind_limit positions and gives the tokens a fresh cache gives.

Where there is no GPU the kernels run under TRITON_INTERPRET=1 on the CPU (tiny shapes); on the GPU box the same
checks run compiled (marker gpu)."""

import dataclasses
import os
import threading

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine.cuda_graphs import StaticDecode  # noqa: E402
from sparkd.engine.kernels import decode_attention as da  # noqa: E402
from sparkd.engine.kernels.family import KernelArgumentError  # noqa: E402
from sparkd.engine.kernels.rope_attention import rope_attention  # noqa: E402
from sparkd.engine.kernels.rope_kv import rope_kv  # noqa: E402
from sparkd.engine.layers import kv_cache  # noqa: E402
from sparkd.engine.layers.rope import RopeConfig, rope_cos_sin  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402
from sparkd.engine.prompt_graphs import PROMPT_LAST, PromptForward, prompt_bucket  # noqa: E402
from sparkd.engine.runtime import Engine, GenerationRequest  # noqa: E402
from sparkd.engine.sampler import SamplingParams  # noqa: E402
from sparkd.engine.streaming.plan import kv_bytes  # noqa: E402

BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant runs where there "
                       "is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
H, HKV, D, WINDOW, RING, POSITIONS = 8, 2, 32, 40, 40 + 72, 300  # a ring past the window by more than RING_MARGIN
ARCHS = ["gpt-oss", "gemma3"]
CTX = 1400  # past each tiny model's window + RING_SLACK: its windowed layers keep rings
PROMPT = [(i * 37 + 11) % 200 + 1 for i in range(1100)]  # past every ring's rows (window + 1024)


def history(device, seed=0):
    """Keys and values of POSITIONS positions, and the ring the positions below each pos leave (filled in order)."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(POSITIONS, HKV, D, generator=g), torch.randn(POSITIONS, HKV, D, generator=g)
    return k.to(device), v.to(device)


def ring_of(full: torch.Tensor, pos: int) -> torch.Tensor:
    """The ring after positions [0, pos) were written in order (rows of positions never written: NaN)."""
    ring = torch.full((RING, *full.shape[1:]), float("nan"), device=full.device)
    for p in range(pos):
        ring[p % RING] = full[p]
    return ring


POSITIONS_READ = [5, 39, 41, RING - 1, RING, RING + 30, 2 * RING + 7, POSITIONS - 2]  # before, at and past the wraps


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("split", ["grouped", "auto", "off"])
def test_decode_attention_over_a_ring_is_bit_equal_to_a_row_per_position(device, split, monkeypatch):
    monkeypatch.setattr(da, "SPLIT_RULE", split)
    k, v = history(device)
    q = torch.randn(1, H, D, generator=torch.Generator().manual_seed(1)).to(device)
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(2)).to(device)
    for pos in POSITIONS_READ:
        at = torch.tensor([pos], device=device)
        ring_k, ring_v = ring_of(k, pos + 1), ring_of(v, pos + 1)
        want = da.decode_attention(q, k[:pos + 1], v[:pos + 1], at, 0.2, WINDOW, sinks)
        got = da.decode_attention(q, ring_k, ring_v, at, 0.2, WINDOW, sinks, ring=RING)
        assert torch.equal(got, want), (split, pos)


@pytest.mark.parametrize("device", BACKENDS)
def test_rope_kv_and_rope_attention_write_the_positions_ring_row(device):
    k, v = history(device)
    g = torch.Generator().manual_seed(3)
    q_new, k_new, v_new = (torch.randn(1, n, D, generator=g).to(device) for n in (H, HKV, HKV))
    cos, sin = (t.to(device) for t in rope_cos_sin(RopeConfig(n_rot=16, base=10000.0, neox=True),
                                                   torch.arange(POSITIONS)))
    for pos in POSITIONS_READ:
        at = torch.tensor([pos], device=device)
        full_k, full_v = k[:pos + 1].clone(), v[:pos + 1].clone()
        ring_k, ring_v = ring_of(k, pos), ring_of(v, pos)
        want = rope_attention(q_new, k_new, v_new, cos, sin, at, full_k, full_v, True, None, 0.2, WINDOW)
        got = rope_attention(q_new, k_new, v_new, cos, sin, at, ring_k, ring_v, True, None, 0.2, WINDOW, ring=RING)
        assert torch.equal(got, want), pos
        assert torch.equal(ring_k[pos % RING], full_k[pos]) and torch.equal(ring_v[pos % RING], full_v[pos])
        ring_k, ring_v = ring_of(k, pos), ring_of(v, pos)
        rope_kv(q_new, k_new, v_new, cos, sin, at, ring_k, ring_v, True, ring=RING)
        assert torch.equal(ring_k[pos % RING], full_k[pos]) and torch.equal(ring_v[pos % RING], full_v[pos])
        assert torch.equal(ring_k.nan_to_num(7.0), ring_of(full_k, pos + 1).nan_to_num(7.0)), pos  # no other row


def test_a_ring_without_room_past_its_window_is_refused():
    k, v = history("cpu")
    q, at = torch.zeros(1, H, D), torch.tensor([3])
    for ring, rows, window in ((RING, RING + 1, WINDOW), (RING, RING, RING - da.RING_MARGIN + 1), (RING, RING, 0)):
        with pytest.raises(KernelArgumentError, match="ring"):
            da.decode_attention(q, k[:rows], v[:rows], at, 0.2, window, ring=ring)
    before = k[:RING + 1].clone()
    cos = sin = torch.zeros(POSITIONS, 8)
    with pytest.raises(KernelArgumentError, match=f"a ring of {RING} rows must be the caches' rows"):
        rope_kv(q, k[:1, :, :], v[:1], cos, sin, at, k[:RING + 1], v[:RING + 1], True, ring=RING)
    assert torch.equal(k[:RING + 1], before)  # refused before anything is written


def test_padded_prompt_graphs_stay_within_the_rings_slack():
    """A padded prompt graph writes its padding's rows past the prompt, a pipelined step one row ahead: with the
    positions a request may go back, those stay within the slack past the window, so no row a later query reads
    is overwritten (kv_cache.RING_SLACK)."""
    padding = max(prompt_bucket(n) - n for n in range(1, PROMPT_LAST + 1))
    assert padding + 1 + kv_cache.REWIND_ROWS <= kv_cache.RING_SLACK, padding


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("swa")
    return {a: write_model(d / f"{a}.gguf", plan(dataclasses.replace(TINY[a], n_ctx=2048), "F32"), seed=5)[0]
            for a in ARCHS}


def run_model(net, rows: bool, steps: str):
    """The prompt in chunks of 384 then 12 greedy tokens (eager, static steps, or those as CUDA graphs) → (logits,
    the cache)."""
    cache = net.new_cache(CTX)
    if rows:
        assert not any(cache.ring)
    chunks = [net(torch.tensor(PROMPT[a:a + 384]), cache) for a in range(0, len(PROMPT), 384)]
    one = StaticDecode(net, cache, graphs=steps == "graphs", first_bucket=64) if steps != "eager" else \
        (lambda t: net(torch.tensor([t]), cache))
    out = [chunks[-1][-1:]]
    for _ in range(12):
        out.append(one(int(out[-1][-1].argmax()))[-1:])
    return torch.cat(chunks + out[1:]), cache


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("device, steps", [("cpu", "eager"), ("cpu", "static"),
                                           pytest.param("cuda", "eager", marks=pytest.mark.gpu),
                                           pytest.param("cuda", "graphs", marks=pytest.mark.gpu)])
def test_the_rings_logits_are_a_row_per_positions(paths, arch, device, steps, monkeypatch):
    """Past the ring's wrap (1100 positions and 12 more; rings of window + RING_SLACK rows) every logit within
    float32 rounding of the cache of a row per position's (RING_SLACK past the context: no ring), the same tokens.
    On CUDA the decode kernels (rope_attention, rope_kv, grouped) read the ring, eagerly and in graphs."""
    m = load_model(paths[arch], device=device)
    try:
        got, cache = run_model(m.net, False, steps)
        windowed = [il for il, r in enumerate(cache.ring) if r]
        assert windowed and all(cache.k[il].shape[0] == m.cfg.n_swa + kv_cache.RING_SLACK for il in windowed)
        with monkeypatch.context() as patch:
            patch.setattr(kv_cache, "RING_SLACK", 1 << 30)
            want, _ = run_model(m.net, True, "eager")
    finally:
        m.close()
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-5, err
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_bucket_shorter_than_the_ring_reads_the_whole_ring(paths, device, monkeypatch):
    """A static step's bucket (64 rows) shorter than the ring (1028): the decode kernels get every ring row
    (decode_rows), not the bucket's first rows (on the H200 the 256-1024 buckets of a 4-layer gpt-oss were refused
    by the kernels' ring check and ran eagerly). On CUDA the graphed steps after a 40-token prompt give the tokens and,
    within float32 rounding, the logits of the cache of a row per position."""
    m = load_model(paths["gpt-oss"], device=device)
    try:
        got = {}
        for rows in (False, True):
            with monkeypatch.context() as patch:
                if rows:
                    patch.setattr(kv_cache, "RING_SLACK", 1 << 30)
                cache = m.net.new_cache(CTX)
                il = next(i for i, w in enumerate(cache.windows) if w)
                assert bool(cache.ring[il]) != rows
                out = [m.net(torch.tensor(PROMPT[:40]), cache)[-1:]]
                step = StaticDecode(m.net, cache, graphs=device == "cuda", first_bucket=64)
                for _ in range(12):
                    out.append(step(int(out[-1][-1].argmax()))[-1:])
                cache.span = 64
                k, v, _ = cache.decode_rows(il, torch.tensor([52], device=device))
                cache.span = None
                assert k.shape[0] == v.shape[0] == (64 if rows else cache.ring[il])
                got[rows] = torch.cat(out)
    finally:
        m.close()
    err = ((got[False] - got[True]).norm() / got[True].norm()).item()
    assert err < 1e-5, err
    assert torch.equal(got[False].argmax(-1), got[True].argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_prompts_write_the_rings_a_graph_would(paths, arch, monkeypatch):
    """The forwards prompt graphs replay ("padded", run eagerly: what a capture records), from an empty cache (host
    positions) and continuing it (device positions, every ring row read by its position), the padding's rows
    written into the ring past the prompt: the last prompt token's logits and the decode steps after are those
    of the eager forwards over a row per position."""
    m = load_model(paths[arch])
    parts = [PROMPT[:700], PROMPT[700:1090]]  # 700 in the 704 bucket; 390 at 700 in the 416 bucket, span 2048
    try:
        got = []
        cache = m.net.new_cache(CTX)
        prompt = PromptForward(m.net, cache, mode="padded", largest=1024, rule="always")
        assert any(cache.ring) and all(prompt.bucket(len(p), start=s) for p, s in zip(parts, (0, 700)))
        for p in parts:
            got.append(prompt(torch.tensor(p), last=True))
        step = StaticDecode(m.net, cache, graphs=False, first_bucket=64)
        for _ in range(8):
            got.append(step(int(got[-1][-1].argmax()))[-1:])
        with monkeypatch.context() as patch:
            patch.setattr(kv_cache, "RING_SLACK", 1 << 30)
            want, rows = [], m.net.new_cache(CTX)
            for p in parts:
                want.append(m.net(torch.tensor(p), rows, last=True))
            for _ in range(8):
                want.append(m.net(torch.tensor([int(want[-1][-1].argmax())]), rows))
    finally:
        m.close()
    got, want = torch.cat(got), torch.cat(want)
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-5, err
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_plan_counts_the_rings(paths, arch):
    m = load_model(paths[arch])
    try:
        for ctx, rings in ((CTX, True), (m.cfg.n_swa + kv_cache.RING_SLACK, False)):
            cache = m.net.new_cache(ctx)
            assert any(cache.ring) == rings
            assert cache.nbytes == kv_bytes(m.cfg, ctx, "f32"), ctx
            assert cache.rewind_limit == (kv_cache.REWIND_ROWS if rings else None)
    finally:
        m.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_request_goes_back_at_most_the_rewind_limit(paths, device):
    """gpt-oss with rings: a turn continuing the last one keeps its rows; one diverging within REWIND_ROWS of what
    the cache holds keeps the common prefix; one diverging further back keeps nothing (no row of its window is
    left). Each gives the tokens a fresh cache gives. On CUDA through the prompt graphs (continued ones too), the
    decode graphs and their pipeline (a row written ahead)."""
    greedy = SamplingParams(temperature=0.0)
    engines = [Engine(paths["gpt-oss"], ctx=CTX, threads=1, resident=True, prompt_cache=on, prompt_store_bytes=0,
                      device=device) for on in (True, False)]
    try:
        for e in engines:
            e.load()
        on, off = engines
        assert on._cache.rewind_limit == kv_cache.REWIND_ROWS

        def run(ids):
            req = GenerationRequest(list(ids), 4, greedy)
            got = list(on.generate(req, threading.Event()))
            assert got == list(off.generate(GenerationRequest(list(ids), 4, greedy), threading.Event())), len(ids)
            return got, req.cached_tokens

        turn1 = PROMPT[:1000]
        reply, cached = run(turn1)
        assert cached == 0
        _, cached = run(turn1 + reply + [5, 6])
        assert cached == 1000 + len(reply)
        held = list(on._held.tokens)  # the prompt and the reply fed
        _, cached = run(held[:len(held) - 400] + [7, 8])  # within the limit of what the cache holds
        assert cached == len(held) - 400
        held = list(on._held.tokens)
        _, cached = run(held[:len(held) - kv_cache.REWIND_ROWS - 1] + [9])  # further back than the limit
        assert cached == 0
    finally:
        for e in engines:
            e.close()


def test_stored_conversations_continue_over_rings(paths):
    """The prompt store copies a conversation's rings whole with its rows (KVCache.sequence_state): two
    conversations taking turns each continue their own; a prompt diverging inside a stored one continues it
    within REWIND_ROWS of its end, not further back; every request gives the tokens a fresh cache gives."""
    greedy = SamplingParams(temperature=0.0)
    on, off = (Engine(paths["gpt-oss"], ctx=CTX, threads=1, resident=True, prompt_cache=p) for p in (True, False))
    try:
        on.load(), off.load()

        def run(ids):
            req = GenerationRequest(list(ids), 4, greedy)
            got = list(on.generate(req, threading.Event()))
            assert got == list(off.generate(GenerationRequest(list(ids), 4, greedy), threading.Event())), len(ids)
            return got, req.cached_tokens

        a, b = PROMPT[:600], PROMPT[500:1100]
        reply_a, _ = run(a)
        reply_b, cached = run(b)
        assert cached == 0
        _, cached = run(a + reply_a + [5])  # a's rows and rings back from the store
        assert cached == len(a) + len(reply_a) and on.prompt_store_stats()["restores"] == 1
        _, cached = run(b[:300] + [9])  # inside b (stored): 304 back from its end
        assert cached == 300 and on.prompt_store_stats()["restores"] == 2
        _, cached = run(a[:50] + [9])  # inside a (stored again, 609 long): further back than the limit
        assert cached == 0 and on.prompt_store_stats()["restores"] == 2
    finally:
        on.close(), off.close()
