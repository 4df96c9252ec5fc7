"""The fused decode kernels (RMSNorm, rope + KV write, decode attention, router top-k) against
their torch references (layers/norm.py, rope.py + kv_cache.py, attention.attend, moe.Router),
on random inputs with odd sizes, masked positions and bucket boundaries, and the static decode
step with every fused kernel on against the torch step.

Where there is no GPU the kernels run under TRITON_INTERPRET=1 on the CPU (tiny shapes); on the
GPU box the same checks run compiled (marker gpu). Bounds (relative Frobenius error) from
measurement under the interpreter (20 random draws each): rms_norm and rope_kv bit-equal (0),
decode_attention <= 3.5e-7 (online softmax adds in another order), router weights <= 1.2e-7 with
the ids equal, static step logits <= 4.5e-7 over six archs. The bounds leave ~10x headroom for
the GPU, whose exp is approximate and whose compiler may fuse multiply-adds.
"""

import os

import pytest
from bench_script import load_bench_script
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton: 3.9.0 "
                                              "runs the interpreter next to the CPU torch)")

from sparkd.engine.cuda_graphs import StaticDecode, graph_blocker
from sparkd.engine.errors import EngineError
from sparkd.engine.kernels import fused
from sparkd.engine.kernels.decode_attention import decode_attention
from sparkd.engine.kernels.family import KernelArgumentError
from sparkd.engine.kernels.float_gemm import float_gemm
from sparkd.engine.kernels.prefill_attention import prefill_attention
from sparkd.engine.kernels.rms_norm import add_rms_norm, rms_norm
from sparkd.engine.kernels.rope_kv import rope_kv
from sparkd.engine.kernels.router_topk import gate_topk, router_topk
from sparkd.engine.layers import attention
from sparkd.engine.layers.attention import attend, attend_sdpa
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.moe import Router
from sparkd.engine.layers.norm import rms_normalize_torch
from sparkd.engine.layers.rope import RopeConfig, apply_rope, rope_cos_sin
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

# float16 operands (SPARKD_SDPA_PRECISION=half): the softmax's weights rounded to float16 before the values' product
HALF_ATTENTION = 2e-3
BOUND = {"rms_norm": 1e-6, "rope_kv": 1e-6, "attention": 4e-6, "router": 1e-6, "step": 5e-6, "float_gemm": 1e-6}
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant "
                       "runs where there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu().double() - want.cpu().double()).norm() / want.cpu().double().norm())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 7), (3, 64), (2, 5, 33), (1, 1000)])
def test_rms_norm_matches_torch(backend, shape):
    x = torch.randn(shape) * 3
    w = torch.randn(shape[-1])
    want = rms_normalize_torch(x, 1e-6) * w
    got = rms_norm(x.to(backend), w.to(backend), 1e-6)
    assert got.shape == x.shape and got.device.type == backend
    assert rel_err(got, want) < BOUND["rms_norm"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 7), (3, 100)])
def test_add_rms_norm_returns_the_sum_and_its_norm(backend, shape):
    x, h, w = torch.randn(shape), torch.randn(shape), torch.randn(shape[-1])
    total, normed = add_rms_norm(x.to(backend), h.to(backend), w.to(backend), 1e-6)
    assert torch.equal(total.cpu(), x + h)
    assert rel_err(normed, rms_normalize_torch(x + h, 1e-6) * w) < BOUND["rms_norm"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_reads_strided_rows(backend):
    kv = torch.randn(3, 40)  # MLA normalises the latent part of each row: a strided view
    w = torch.randn(32)
    got = rms_norm(kv.to(backend)[:, :32], w.to(backend), 1e-5)
    assert rel_err(got, rms_normalize_torch(kv[:, :32], 1e-5) * w) < BOUND["rms_norm"]


def test_rms_norm_refuses_bad_arguments():
    with pytest.raises(KernelArgumentError, match=r"could not run rms_norm: .* must be float32"):
        rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), 1e-6)
    with pytest.raises(KernelArgumentError, match=r"weight as long as x's last dim"):
        rms_norm(torch.randn(2, 8), torch.randn(7), 1e-6)
    with pytest.raises(KernelArgumentError, match=r"could not run add_rms_norm: .* must match"):
        add_rms_norm(torch.randn(2, 8), torch.randn(1, 8), torch.randn(8), 1e-6)


def rope_reference(q, k, v, cos, sin, pos, k_cache, v_cache, neox, norms=None):
    if norms is not None:
        q, k = (rms_normalize_torch(t, norms[2]) * w for t, w in zip((q, k), norms[:2]))
    c, s = cos[pos:pos + 1], sin[pos:pos + 1]
    k_cache, v_cache = k_cache.clone(), None if v_cache is None else v_cache.clone()
    k_cache[pos] = apply_rope(k, c, s, neox)[0]
    if v is not None:
        v_cache[pos] = v
    return apply_rope(q, c, s, neox), k_cache, v_cache


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("neox, H, Hkv, Dk, Dv, n_rot, pos, norm", [
    (True, 4, 2, 16, 16, 16, 0, False), (False, 6, 3, 12, 10, 8, 9, True), (True, 5, 1, 20, 24, 12, 11, True),
    (False, 2, 2, 8, 0, 8, 5, False)])  # Dv 0: no value rows (MLA's cache)
def test_rope_kv_matches_torch(backend, neox, H, Hkv, Dk, Dv, n_rot, pos, norm):
    C = 12
    cos, sin = rope_cos_sin(RopeConfig(n_rot=n_rot, base=10000.0, neox=neox), torch.arange(C))
    q, k = torch.randn(1, H, Dk) * 3, torch.randn(1, Hkv, Dk)
    v = torch.randn(1, Hkv, Dv) if Dv else None
    norms = (torch.randn(Dk), torch.randn(Dk), 1e-6) if norm else None  # qwen3's per-head q/k norms
    k_cache = torch.full((C, Hkv, Dk), float("nan"))  # rows other than pos must stay as they were
    v_cache = torch.full((C, Hkv, Dv), float("nan")) if Dv else None
    want_q, want_k, _ = rope_reference(q, k, v, cos, sin, pos, k_cache, v_cache, neox, norms)
    dev = [None if t is None else t.to(backend) for t in (q, k, v, cos, sin, k_cache, v_cache)]
    dev_norms = None if norms is None else (norms[0].to(backend), norms[1].to(backend), norms[2])
    got_q = rope_kv(*dev[:5], torch.tensor([pos], device=backend), dev[5], dev[6], neox, dev_norms)
    assert rel_err(got_q, want_q) < BOUND["rope_kv"]
    assert rel_err(dev[5][pos], want_k[pos]) < BOUND["rope_kv"]
    assert dev[5].cpu().isnan().sum() == (C - 1) * Hkv * Dk
    if Dv:
        assert torch.equal(dev[6][pos].cpu(), v[0])
        assert dev[6].cpu().isnan().sum() == (C - 1) * Hkv * Dv


def test_rope_kv_refuses_bad_arguments():
    cos = torch.zeros(4, 4)
    with pytest.raises(KernelArgumentError, match=r"could not run rope_kv .* n_rot <= Dk"):
        rope_kv(torch.randn(1, 2, 6), torch.randn(1, 1, 6), None, cos, cos, torch.tensor([0]),
                torch.zeros(4, 1, 6), None, True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H, Hkv, Dk, Dv, S, pos, window, sinks", [
    (4, 2, 16, 16, 16, 0, 0, False),  # first position: one key
    (4, 2, 16, 16, 16, 15, 0, True),  # last row of the span
    (6, 2, 24, 20, 80, 63, 0, False),  # at a key-block boundary
    (6, 3, 24, 24, 80, 64, 0, True),  # just past one
    (3, 3, 5, 7, 70, 66, 4, False),  # sliding window, odd dims
    (8, 1, 16, 16, 64, 40, 100, True)])  # window wider than the sequence
def test_decode_attention_matches_attend(backend, H, Hkv, Dk, Dv, S, pos, window, sinks):
    q, k, v = torch.randn(1, H, Dk), torch.randn(S, Hkv, Dk), torch.randn(S, Hkv, Dv)
    sink = torch.randn(H) if sinks else None
    p = torch.tensor([pos])
    want = attend(q, k, v, 0.3, p, window, sink)
    k[pos + 1:], v[pos + 1:] = 1e4, float("nan")  # rows past the position must not be read
    dev = [t.to(backend) for t in (q, k, v, p)]
    got = decode_attention(*dev[:3], dev[3], 0.3, window, None if sink is None else sink.to(backend))
    assert rel_err(got, want) < BOUND["attention"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H, Hkv, S, pos, window, sinks, keys, fold", [
    (4, 2, 80, 79, 0, True, 32, 2),  # ranges of one 32-key block, the last one partial; the fold two at a time
    pytest.param(6, 3, 70, 66, 40, False, 64, 32, marks=pytest.mark.gpu),  # a sliding window: the first range empty
    pytest.param(8, 2, 2048, 1500, 0, True, 64, 32, marks=pytest.mark.gpu),  # the default: 24 ranges in one fold step
    pytest.param(8, 2, 4096, 4000, 0, False, 64, 32, marks=pytest.mark.gpu)])  # 63 ranges: two fold steps
def test_decode_attention_split_over_keys(backend, monkeypatch, H, Hkv, S, pos, window, sinks, keys, fold):
    """The keys cut into ranges (decode_attention.key_range) and the ranges' partial softmaxes added by
    the head's last program: attend's result; the same bits on a second run (the tickets were reset) and
    over a cache twice as long (an eager step's span: more ranges, empty, returning at once); step26's
    serial fold within the bound too, and with its bits where one range holds the keys (auto then
    stores that range's values without a fold); one walk with the switch off."""
    from sparkd.engine.kernels import decode_attention as da

    monkeypatch.setattr(da, "SPLIT_RULE", "auto")
    monkeypatch.setattr(da, "RANGE_KEYS", keys)
    monkeypatch.setattr(da, "FOLD_RANGES", fold)
    q, k, v = torch.randn(1, H, 32), torch.randn(S, Hkv, 32), torch.randn(S, Hkv, 24)
    sink = torch.randn(H) if sinks else None
    want = attend(q, k, v, 0.3, torch.tensor([pos]), window, sink)
    k[pos + 1:], v[pos + 1:] = 1e4, float("nan")  # rows past the position must not be read
    dev = [t.to(backend) for t in (q, k, v, torch.tensor([pos]))]
    sd = None if sink is None else sink.to(backend)
    short = torch.tensor([keys // 2], device=backend)  # its keys in the first range
    got, got_short = decode_attention(*dev, 0.3, window, sd), decode_attention(*dev[:3], short, 0.3, 0, sd)
    assert rel_err(got, want) < BOUND["attention"]
    assert torch.equal(decode_attention(*dev, 0.3, window, sd), got)
    longer = [torch.cat([t, torch.full_like(t, float("nan"))]) for t in dev[1:3]]
    assert torch.equal(decode_attention(dev[0], *longer, dev[3], 0.3, window, sd), got)
    monkeypatch.setattr(da, "SPLIT_RULE", "serial")
    assert da.key_range() == keys and da.fold_ranges() == 0
    assert rel_err(decode_attention(*dev, 0.3, window, sd), want) < BOUND["attention"]
    assert torch.equal(decode_attention(*dev[:3], short, 0.3, 0, sd), got_short)
    monkeypatch.setattr(da, "SPLIT_RULE", "off")
    assert da.key_range() == 0
    assert rel_err(decode_attention(*dev, 0.3, window, sd), want) < BOUND["attention"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H, Hkv, Dv, S, pos, window, sinks, ranges, shared", [
    (16, 2, 24, 40, 20, 0, True, 32, False),  # the keys in one range: its program stores the output, the fold returns
    (16, 2, 24, 600, 599, 0, True, 32, False),  # 38 blocks in 19 ranges of two blocks, the last one partial
    (16, 2, 20, 600, 450, 100, False, 4, False),  # a sliding window: the ranges start at its first block
    (16, 2, 20, 600, 450, 100, True, 4, False),  # and a sink: it joins the window's first range
    (40, 2, 24, 300, 290, 0, True, 8, False),  # 20 query heads a KV head: two head blocks, the second with 4 rows
    (3, 3, 24, 200, 150, 0, False, 8, False),  # no grouping: a head a block
    (16, 1, 24, 40, 20, 0, False, 32, True),  # MLA: the values are the keys' first 24 columns; one range
    (16, 1, 24, 600, 599, 0, False, 32, True),  # 19 ranges
    (40, 1, 24, 300, 290, 0, False, 8, True)])  # three head blocks over the one latent "KV head"
@pytest.mark.parametrize("rows", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_decode_attention_grouped_ranges(backend, monkeypatch, H, Hkv, Dv, S, pos, window, sinks, ranges, shared,
                                         rows):
    """The "grouped" rule (kernels/grouped_attention, the default): a program per KV head's query heads and range
    of keys, then a launch that adds the ranges. attend's result (over float16 rows, --kv-type f16: over the same
    rows widened, the float16 products' path); the same bits on a second run and over a cache twice as long (an
    eager step's span); the inputs untouched. shared: MLA's values read inside its latent keys (one load; float32
    latent rows run "auto")."""
    from sparkd.engine.kernels import decode_attention as da
    from sparkd.engine.kernels import grouped_attention as ga

    assert da.SPLIT_RULE == "grouped"
    monkeypatch.setattr(ga, "RANGES", ranges)
    monkeypatch.setattr(ga, "PROGRAMS", 0)  # exactly `ranges` a head block
    monkeypatch.setattr(ga, "FOLD_VALUES", 16 * ranges)  # the fold's 32 columns in two tiles of 16
    monkeypatch.setattr(ga, "TILE_VALUES", 16 * 32)  # 16-key blocks at 32 wide: many blocks at small spans
    q, k = torch.randn(1, H, 32), torch.randn(S, Hkv, 32).to(rows)
    v = k[..., :Dv] if shared else torch.randn(S, Hkv, Dv).to(rows)  # MLA: the values are a view of the keys
    sink = torch.randn(H) if sinks else None
    want = attend(q, k, v, 0.3, torch.tensor([pos]), window, sink)
    k[pos + 1:], v[pos + 1:] = 1e4, float("nan")  # rows past the position must not be read
    dev = [t.to(backend) for t in (q, k, v, torch.tensor([pos]))]
    if shared:
        dev[2] = dev[1][..., :Dv]
    assert ga.shares_keys(*dev[1:3]) == shared
    assert ga.fits(*dev[:3]) == (not shared or rows == torch.float16)  # float32 latent rows: "auto"
    kept = [t.clone() for t in dev]
    sd = None if sink is None else sink.to(backend)
    got = decode_attention(*dev, 0.3, window, sd)
    assert rel_err(got, want) < BOUND["attention"]
    for a, b in zip(dev, kept):  # the inputs untouched
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(decode_attention(*dev, 0.3, window, sd), got)
    longer = [torch.cat([t, torch.full_like(t, float("nan"))]) for t in dev[1:3]]
    if shared:
        longer[1] = longer[0][..., :Dv]
    assert torch.equal(decode_attention(dev[0], *longer, dev[3], 0.3, window, sd), got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_attention_grouped_leaves_wide_heads_to_auto(backend, monkeypatch):
    """Heads wider than grouped_attention.MAX_WIDTH run the "auto" kernel: its bits."""
    from sparkd.engine.kernels import decode_attention as da
    from sparkd.engine.kernels import grouped_attention as ga

    q, k, v = (torch.randn(*s, device=backend) for s in ((1, 8, 32), (100, 2, 32), (100, 2, 24)))
    p = torch.tensor([90], device=backend)
    monkeypatch.setattr(ga, "MAX_WIDTH", 16)
    assert not ga.fits(q, k, v)
    got = decode_attention(q, k, v, p, 0.3)
    monkeypatch.setattr(da, "SPLIT_RULE", "auto")
    assert torch.equal(decode_attention(q, k, v, p, 0.3), got)
    assert rel_err(got, attend(q.cpu(), k.cpu(), v.cpu(), 0.3, p.cpu())) < BOUND["attention"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_attention_reads_mla_values_inside_the_keys(backend):
    S, R, P = 20, 24, 8  # values are the first R dims of each key row (a strided view)
    q, k = torch.randn(1, 4, R + P), torch.randn(S, 1, R + P)
    want = attend(q, k, k[..., :R], 0.2, torch.tensor([13]))
    kd = k.to(backend)
    got = decode_attention(q.to(backend), kd, kd[..., :R], torch.tensor([13], device=backend), 0.2)
    assert rel_err(got, want) < BOUND["attention"]


def test_decode_attention_refuses_bad_arguments():
    with pytest.raises(KernelArgumentError, match=r"could not run decode_attention .* multiple of Hkv"):
        decode_attention(torch.randn(1, 3, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.tensor([1]), 1.0)
    with pytest.raises(KernelArgumentError, match=r"could not run decode_attention .* q must be \[1, H, Dk\]"):
        decode_attention(torch.randn(2, 4, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.tensor([1]), 1.0)
    with pytest.raises(KernelArgumentError, match=r"could not run decode_attention .* pos must be one integer"):
        decode_attention(torch.randn(1, 4, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.tensor([1.0]), 1.0)


def on_gpu_only(*cases):
    return [pytest.param("cuda", *c, marks=pytest.mark.gpu) for c in cases]


@pytest.mark.parametrize("backend, H, Hkv, Dk, Dv, start, T, pad, window, sinks", [
    pytest.param("cpu", 4, 2, 16, 16, 3, 70, 10, 0, True, id="interpret", marks=BACKENDS[0].marks),
    *on_gpu_only((4, 2, 16, 16, 3, 70, 10, 0, True), (32, 4, 128, 128, 0, 600, 40, 0, False),
                 (8, 2, 64, 64, 5, 100, 28, 16, True), (6, 3, 24, 20, 0, 130, 30, 0, False),
                 (4, 4, 256, 256, 0, 70, 10, 0, False), (16, 2, 128, 128, 0, 1000, 24, 0, False))])
def test_prefill_attention_matches_attend_and_ignores_padding(backend, H, Hkv, Dk, Dv, start, T, pad, window, sinks):
    """Within the bound of attend; a query row's bits do not depend on queries (and their keys) after it:
    the same prompt padded by `pad` rows at its end gives its real rows bit for bit."""
    S = start + T + pad
    q, k, v = torch.randn(T + pad, H, Dk), torch.randn(S, Hkv, Dk), torch.randn(S, Hkv, Dv)
    q[T:], k[start + T:], v[start + T:] = 1e3, -1e3, 1e4  # the padding: large, finite
    sink = torch.randn(H) if sinks else None
    want = attend(q[:T], k[:start + T], v[:start + T], 0.3, start, window, sink)
    dev = [t.to(backend) for t in (q, k, v)]
    sk = None if sink is None else sink.to(backend)
    got = prefill_attention(dev[0][:T], dev[1][:start + T], dev[2][:start + T], start, 0.3, window, sk)
    assert rel_err(got, want) < BOUND["attention"]
    padded = prefill_attention(*dev, start, 0.3, window, sk)
    assert torch.equal(padded[:T], got)


@pytest.mark.parametrize("backend, H, Hkv, Dk, Dv, T, start, window", [
    pytest.param("cpu", 4, 2, 16, 8, 9, 0, 0, id="cpu"), pytest.param("cpu", 4, 2, 16, 8, 9, 0, 3, id="cpu-window"),
    pytest.param("cpu", 4, 2, 16, 8, 9, 5, 0, id="cpu-continued"),
    *on_gpu_only((32, 4, 128, 128, 512, 0, 0), (32, 4, 128, 128, 2048, 0, 0), (8, 2, 64, 64, 100, 0, 16),
                 (6, 3, 24, 20, 130, 0, 0), (4, 4, 256, 256, 70, 0, 0), (32, 4, 128, 128, 256, 1536, 0),
                 (32, 4, 128, 128, 1024, 1024, 0), (8, 2, 64, 64, 100, 300, 16), (64, 8, 64, 64, 600, 0, 128),
                 (64, 8, 64, 64, 256, 700, 0))])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_attend_sdpa_matches_attend(backend, H, Hkv, Dk, Dv, T, start, window, sinks, monkeypatch):
    """The prompt's default attention (SPARKD_PREFILL_ATTENTION=sdpa) within the bound of attend in float64: from
    position 0 (the kernel's own causal mask, a sliding window's mask) and continuing the cache at start (the
    mask from a host start: SDPA's bottom-right causal mask, the boolean mask's bits (SPARKD_CONTINUE_ATTENTION=
    sdpa-mask); from the same queries' positions on the device, as a continued graph gives them: the host start's
    bits over the same keys, within the bound over 16 keys more past the queries; with a forward's shared mask
    too). With sinks (gpt-oss, session 41: with_sink_key's key), against attend's sinks; sinks of 3 standard
    deviations take a large share of each softmax, so a sink read wrong or left out fails the bound."""
    S = start + T
    q, k, v = torch.randn(T, H, Dk), torch.randn(S + 16, Hkv, Dk), torch.randn(S + 16, Hkv, Dv)
    sk = 3 * torch.randn(H) if sinks else None
    want = attend(q.double(), k[:S].double(), v[:S].double(), 0.3, start, window,
                  None if sk is None else sk.double())
    q, k, v = (t.to(backend) for t in (q, k, v))
    sk = None if sk is None else sk.to(backend)
    got = attend_sdpa(q, k[:S], v[:S], 0.3, start, window, sinks=sk)
    assert got.shape == want.shape and rel_err(got, want) < BOUND["attention"]
    if sinks:  # the sinks matter at these sizes: attention without them is far from attend's
        assert rel_err(attend_sdpa(q, k[:S], v[:S], 0.3, start, window), want) > 10 * BOUND["attention"]
    if start:
        with monkeypatch.context() as m:
            m.setattr(attention, "CONTINUE_ATTENTION", "sdpa-mask")
            assert torch.equal(attend_sdpa(q, k[:S], v[:S], 0.3, start, window, sinks=sk), got)
        pos = torch.arange(start, S, device=backend)
        assert torch.equal(attend_sdpa(q, k[:S], v[:S], 0.3, pos, window, sinks=sk), got)
        masks = {}  # a forward's (KVCache.masks): the second layer takes the first's mask
        assert all(torch.equal(attend_sdpa(q, k[:S], v[:S], 0.3, pos, window, masks, sinks=sk), got) for _ in "ab")
        assert len(masks) == 1
        assert rel_err(attend_sdpa(q, k, v, 0.3, pos, window, sinks=sk), want) < BOUND["attention"]


@pytest.mark.parametrize("T, start, window, sinks", [(300, 0, 0, True), (300, 0, 16, True), (100, 50, 16, False)])
def test_attend_sdpa_over_float16_operands(T, start, window, sinks):
    """What SPARKD_SDPA_PRECISION=half runs on CUDA (attend_sdpa over the queries times the scale in float16, at scale
    1, over float16 keys and values: the sink key, the window's blocks, the bottom-right mask), on the CPU's math
    kernel: within HALF_ATTENTION of attend in float64 over the unrounded queries, in float16."""
    q, k, v = torch.randn(T, 8, 64), torch.randn(start + T, 2, 64).half(), torch.randn(start + T, 2, 64).half()
    sk = 3 * torch.randn(8) if sinks else None
    want = attend(q.double(), k.double(), v.double(), 0.125, start, window, None if sk is None else sk.double())
    got = attend_sdpa((q * 0.125).half(), k, v, 1.0, start, window, sinks=sk)
    print(f"half operands on the CPU: {rel_err(got.float(), want):.2e} of float64")
    assert got.dtype == torch.float16 and rel_err(got.float(), want) < HALF_ATTENTION


@pytest.mark.gpu
@pytest.mark.parametrize("H, Hkv, Dk, Dv, T, start, window", [
    (32, 4, 128, 128, 512, 0, 0), (64, 8, 64, 64, 600, 0, 128), (64, 8, 64, 64, 256, 700, 0),
    (8, 2, 64, 64, 100, 300, 16)])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_attend_sdpa_half_over_float16_rows(H, Hkv, Dk, Dv, T, start, window, sinks, monkeypatch):
    """SPARKD_SDPA_PRECISION=half (the default since session 45): the queries times the scale in float16 over a
    float16 cache's rows as they are, within HALF_ATTENTION of attend in float64 (the queries unrounded), a float32
    result, not float32's bits; a float32 cache keeps the float32 path's bits."""
    S = start + T
    q = torch.randn(T, H, Dk, device="cuda")
    k, v = torch.randn(S, Hkv, Dk, device="cuda").half(), torch.randn(S, Hkv, Dv, device="cuda").half()
    sk = 3 * torch.randn(H, device="cuda") if sinks else None
    want = attend(q.double(), k.double(), v.double(), 0.3, start, window, None if sk is None else sk.double())
    monkeypatch.setattr(attention, "SDPA_PRECISION", "float32")
    wide = attend_sdpa(q, k, v, 0.3, start, window, sinks=sk)
    monkeypatch.setattr(attention, "SDPA_PRECISION", "half")
    got = attend_sdpa(q, k, v, 0.3, start, window, sinks=sk)
    print(f"half {rel_err(got, want):.2e}, float32 {rel_err(wide, want):.2e} of float64")
    assert got.dtype == torch.float32 and rel_err(got, want) < HALF_ATTENTION and not torch.equal(got, wide)
    assert rel_err(wide, want) < BOUND["attention"]
    assert torch.equal(attend_sdpa(q, k.float(), v.float(), 0.3, start, window, sinks=sk), wide)


@pytest.mark.parametrize("backend, H, Hkv, Dk, Dv, T, start, window, block", [
    pytest.param("cpu", 4, 2, 16, 8, 37, 0, 3, 4, id="cpu"), pytest.param("cpu", 6, 3, 24, 20, 50, 2, 5, 5, id="cpu-5"),
    pytest.param("cpu", 8, 2, 16, 16, 13, 7, 4, 4, id="cpu-continued"),
    *on_gpu_only((64, 8, 64, 64, 2000, 0, 128, 256), (64, 8, 64, 64, 1000, 127, 128, 256),
                 (8, 2, 64, 64, 700, 0, 300, 256), (16, 8, 256, 256, 1500, 0, 512, 256))])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_window_blocks_match_attend(backend, H, Hkv, Dk, Dv, T, start, window, block, sinks, monkeypatch):
    """A sliding window's prompt in blocks of queries over the keys their windows reach (attention.
    attend_window_blocks, session 42; WINDOW_BLOCK `block`, the windows narrower and wider than it): within the bound
    of attend in float64, sinks too; each real row's bits whatever the padding past the prompt (a prompt graph's
    bucket); the masks made once a forward."""
    monkeypatch.setattr(attention, "WINDOW_BLOCK", block)
    S, pad = start + T, 20
    q, k, v = torch.randn(T + pad, H, Dk), torch.randn(S + pad, Hkv, Dk), torch.randn(S + pad, Hkv, Dv)
    sk = 3 * torch.randn(H) if sinks else None
    want = attend(q[:T].double(), k[:S].double(), v[:S].double(), 0.3, start, window,
                  None if sk is None else sk.double())
    q, k, v = (t.to(backend) for t in (q, k, v))
    sk = None if sk is None else sk.to(backend)
    masks = {}
    got = attend_sdpa(q[:T], k[:S], v[:S], 0.3, start, window, masks, sinks=sk)
    assert got.shape == want.shape and rel_err(got, want) < BOUND["attention"]
    assert [key for key in masks if key[0] == "blocks"] == [("blocks", max(block, window), window - 1, int(sinks))]
    assert torch.equal(attend_sdpa(q, k, v, 0.3, start, window, masks, sinks=sk)[:T], got)
    assert len(masks) == 2  # the padded prompt took the blocks' mask and the first block's


def test_prefill_attention_refuses_bad_arguments():
    q, k = torch.randn(3, 4, 8), torch.randn(5, 2, 8)
    with pytest.raises(KernelArgumentError, match=r"could not run prefill_attention .* S = start \+ T"):
        prefill_attention(q, k, k, 1, 1.0)
    with pytest.raises(KernelArgumentError, match=r"could not run prefill_attention .* float32"):
        prefill_attention(q.half(), k.half(), k.half(), 2, 1.0)
    with pytest.raises(KernelArgumentError, match=r"could not run prefill_attention .* sinks must be float32 \[H\]"):
        prefill_attention(q, k, k, 2, 1.0, sinks=torch.zeros(3))


@pytest.mark.parametrize("backend, M, K, N, pad, dtype, bias", [
    pytest.param("cpu", 40, 48, 70, 24, torch.float16, True, id="interpret", marks=BACKENDS[0].marks),
    *on_gpu_only((40, 48, 70, 24, torch.float16, True), (600, 2048, 128, 40, torch.float32, False),
                 (5, 256, 256, 59, torch.float16, False), (200, 512, 300, 24, torch.bfloat16, True))])
def test_float_gemm_matches_linear_and_ignores_padding(backend, M, K, N, pad, dtype, bias):
    """Within the bound of F.linear (float32 products); a row's bits do not depend on the rows after it."""
    x, w = torch.randn(M + pad, K), torch.randn(N, K).to(dtype)
    b = torch.randn(N) if bias else None
    want = torch.nn.functional.linear(x[:M].double(), w.double(), None if b is None else b.double())
    dev = [x.to(backend), w.to(backend), None if b is None else b.to(backend)]
    got = float_gemm(dev[0][:M], *dev[1:])
    assert rel_err(got, want) < BOUND["float_gemm"]
    assert torch.equal(float_gemm(*dev)[:M], got)


def test_float_gemm_refuses_bad_arguments():
    with pytest.raises(KernelArgumentError, match=r"could not run float_gemm .* x must be \[M, K\] and w \[N, K\]"):
        float_gemm(torch.randn(3, 8), torch.randn(4, 9))
    with pytest.raises(KernelArgumentError, match=r"could not run float_gemm .* x must be float32"):
        float_gemm(torch.randn(3, 8).half(), torch.randn(4, 8))


ROUTERS = [  # (E, top_k, gating, norm_w, scale, bias)
    (8, 2, "softmax", False, 0.0, False), (60, 8, "softmax", True, 0.0, False),
    (33, 4, "sigmoid", True, 2.5, True), (7, 7, "softmax_weight", False, 0.0, False),
    (20, 16, "sqrt_softplus", True, 1.5, False), (128, 1, "sigmoid", False, 0.0, True)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("E, top_k, gating, norm_w, scale, bias", ROUTERS)
def test_router_topk_matches_router(backend, E, top_k, gating, norm_w, scale, bias):
    logits = torch.randn(3, E) * 4
    logits[0, :min(2, top_k)] = 30.0  # a tie both sides select, and softplus's linear range
    sel_bias = torch.rand(E) if bias else None
    router = Router(Linear(torch.eye(E)), top_k, gating, norm_w, scale, sel_bias)  # logits in, as they are
    before = fused.configure("none")
    try:
        want_w, want_ids = router(logits)
    finally:
        fused.configure(before)
    got_w, got_ids = router_topk(logits.to(backend), top_k, gating, norm_w, scale, 6.103515625e-5,
                                 None if sel_bias is None else sel_bias.to(backend))
    # tied logits may come in either order: compare each token's (id, weight) pairs as sets
    got_ids, got_w = got_ids.cpu(), got_w.cpu()
    assert torch.equal(got_ids.sort(-1).values, want_ids.sort(-1).values)
    order = got_ids.argsort(-1), want_ids.argsort(-1)
    assert rel_err(got_w.gather(-1, order[0]), want_w.gather(-1, order[1])) < BOUND["router"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_router_topk_softplus_of_very_negative_logits(backend):
    """sqrt-softplus far below 0, where log(1 + exp(x)) rounds to 0 and torch's log1p does not:
    every weight within the router bound of torch's, none of them 0."""
    logits = -torch.linspace(5.0, 60.0, 24).reshape(2, 12)
    router = Router(Linear(torch.eye(12)), 4, "sqrt_softplus", False, 0.0, None)
    before = fused.configure("none")
    try:
        want_w, want_ids = router(logits)
    finally:
        fused.configure(before)
    got_w, got_ids = router_topk(logits.to(backend), 4, "sqrt_softplus", False, 0.0, 6.103515625e-5)
    assert torch.equal(got_ids.cpu(), want_ids)
    assert bool((got_w.cpu() > 0).all())
    assert float(((got_w.cpu() - want_w) / want_w).abs().max()) < BOUND["router"]


SEL = {"softmax": lambda x: torch.softmax(x, -1), "sigmoid": torch.sigmoid, "softmax_weight": lambda x: x}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("E, top_k, gating, norm_w", [
    (6, 4, "softmax_weight", False),
    pytest.param(6, 2, "softmax", False, marks=pytest.mark.gpu), pytest.param(60, 8, "sigmoid", True, marks=pytest.mark.gpu),
    pytest.param(160, 8, "softmax", True, marks=pytest.mark.gpu),
    pytest.param(160, 16, "softmax_weight", False, marks=pytest.mark.gpu)])
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning", "ignore:invalid value:RuntimeWarning")  # numpy's, interpreted
def test_router_topk_non_finite_logits(backend, E, top_k, gating, norm_w):
    """NaN and +-inf logits with E not a power of two: distinct ids in [0, E) (argmax's NaN
    compares once let a padding lane >= E win, an id the decode step reads experts at), the
    scores the reference picks (torch.topk ranks NaN first; ties in any order) and its weights."""
    nan, inf = float("nan"), float("inf")
    logits = torch.randn(5, E)
    logits[0, E - 1] = nan               # the last live lane, next to the padding
    logits[1] = nan
    logits[2, 3], logits[2, 0] = inf, -inf
    logits[3] = -inf
    logits[4, :E - 2] = -inf             # picks among -inf lanes, which equal the taken ones' mark
    router = Router(torch.nn.Identity(), top_k, gating, norm_w, 0.0, None)  # eye's 0 * inf would be NaN
    before = fused.configure("none")
    try:
        want_w, want_ids = router(logits)
    finally:
        fused.configure(before)
    got = [router_topk(logits.to(backend), top_k, gating, norm_w, 0.0, 6.103515625e-5)]
    # the decode router: one token's gate GEMV and selection (a NaN in x makes every logit NaN)
    got.append(gate_topk(torch.eye(E, device=backend), logits[:1].to(backend), top_k, gating, norm_w, 0.0,
                         6.103515625e-5))
    sel = SEL[gating](logits)
    for (got_w, got_ids), rows in zip(got, (slice(None), slice(0, 1))):
        got_w, got_ids = got_w.cpu(), got_ids.cpu()
        assert bool(((got_ids >= 0) & (got_ids < E)).all()), got_ids
        assert all(len(set(r)) == top_k for r in got_ids.tolist()), got_ids
        if rows.stop is None:  # gate_topk's logits are all NaN (0 * NaN), not the reference's
            torch.testing.assert_close(sel.gather(-1, got_ids).sort(-1).values,
                                       sel.gather(-1, want_ids).sort(-1).values, rtol=0, atol=0, equal_nan=True)
            torch.testing.assert_close(got_w.sort(-1).values, want_w.sort(-1).values, rtol=BOUND["router"],
                                       atol=0, equal_nan=True)
        else:
            assert bool(got_w.isnan().all()), got_w


def test_router_topk_refuses_bad_arguments():
    with pytest.raises(KernelArgumentError, match=r"could not run router_topk .* top_k 17"):
        router_topk(torch.randn(1, 32), 17, "softmax", False, 0.0, 6e-5)


def test_switch_parses_and_refuses():
    assert fused.parse("all") == frozenset(fused.KERNELS)
    assert fused.parse("none") == fused.parse("") == frozenset()
    assert fused.parse(" rms_norm, router ") == {"rms_norm", "router"}
    with pytest.raises(EngineError, match=r"could not switch fused kernels 'norm': unknown norm"):
        fused.parse("norm")
    before = fused.configure("router")
    try:
        assert not fused.active("router", torch.zeros(1))  # CPU tensors keep the torch code
        fused.configure("router", on_cpu=True)
        assert fused.active("router", torch.zeros(1)) and not fused.active("rms_norm", torch.zeros(1))
    finally:
        fused.configure(before)
    assert fused.configure(before) == before


# -- the static decode step, every fused kernel on, against the torch step ---------------------

ARCHS = ["qwen3moe", "gpt-oss", "gemma3", "deepseek2"]  # GQA + router, sinks + softmax_weight, window, MLA
PROMPT, STEPS = [1, 7, 42, 3, 99], 6  # positions 5..10 cross the 8 bucket of first_bucket=4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {a: write_model(d / f"{a}.gguf", plan(TINY[a], "F32"), seed=3)[0] for a in ARCHS}


def greedy(net, spec: str, device: str, make_step, steps: int = STEPS):
    """(logits rows, token ids, the step) of greedy decoding after PROMPT with fused kernels
    `spec`; make_step(cache) gives the per-token function."""
    before = fused.configure(spec, on_cpu=device == "cpu")
    try:
        cache = net.new_cache(32)
        logits = net(torch.tensor(PROMPT), cache)[-1:]
        step, rows, ids = make_step(cache), [], []
        for _ in range(steps):
            ids.append(int(logits[-1].argmax()))
            logits = step(ids[-1])
            rows.append(logits[-1])
        return torch.stack(rows), ids, step
    finally:
        fused.configure(before)


def static(net, graphs: bool):
    return lambda cache: StaticDecode(net, cache, graphs=graphs, first_bucket=4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_static_step_equals_torch_step(models, backend, arch):
    m = load_model(models[arch], device=backend)
    try:
        want, want_ids, _ = greedy(m.net, "none", backend, static(m.net, graphs=False))
        # on CUDA the fused step is captured and replayed where the model allows it
        graphs = backend == "cuda" and graph_blocker(m.net) is None
        got, got_ids, _ = greedy(m.net, "all", backend, static(m.net, graphs))
    finally:
        m.close()
    assert got_ids == want_ids
    assert rel_err(got, want) < BOUND["step"], f"{arch}: fused vs torch static step"


@pytest.mark.skipif(ON_GPU, reason="counts the CPU dispatch of the interpreted step; the GPU box "
                                   "counts a graph replay in decode_profile.py")
def test_fused_step_launches_one_kernel_per_norm_rope_attention_router(models, monkeypatch):
    """qwen3moe: q/k norms fold into rope_kv, and rope_kv into the attention (rope_attention); no torch norm,
    rope, softmax or top-k is left. Without rope_attention, or over a span past fused.ROPE_ATTENTION_SPAN,
    rope_kv and decode_attention ("grouped": its ranges, then their fold) launch apart."""
    counts = load_bench_script("gpu_box/launch_count.py")
    m = load_model(models["qwen3moe"])
    apart = ",".join(k for k in fused.KERNELS if k != "rope_attention")
    try:
        n_layer = len(m.net.blocks)
        none, every, two = (counts.static_step_counts(m.net, spec, on_cpu=True) for spec in ("none", "all", apart))
        monkeypatch.setattr(fused, "ROPE_ATTENTION_SPAN", 2)  # spans over it: the two launches
        long = counts.static_step_counts(m.net, "all", on_cpu=True)
    finally:
        m.close()
    assert long["ops"] == two["ops"]
    triton_ops = {k: v for k, v in every["ops"].items() if k.startswith("triton:")}
    # per layer: attn and ffn norms, q/k norms + rope + KV write + attention, router (its gate GEMV
    # included: layers/moe.DECODE_PARTS "router"); plus the output norm
    assert triton_ops == {"triton:_rms_norm_rows": 2 * n_layer + 1, "triton:_rope_attention": n_layer,
                          "triton:_gate_topk": n_layer}
    assert {k: v for k, v in two["ops"].items() if k.startswith("triton:")} == {
        "triton:_rms_norm_rows": 2 * n_layer + 1, "triton:_rope_kv": n_layer, "triton:_grouped_attention": n_layer,
        "triton:_grouped_attention_fold": n_layer,
        "triton:_gate_topk": n_layer}
    gone = ("pow", "rsqrt", "_softmax", "topk", "index_copy_", "repeat_interleave", "masked_fill")
    assert all(none["ops"].get(op) for op in ("pow", "rsqrt", "_softmax", "topk", "index_copy_"))
    assert not [op for op in every["ops"] if op in gone]
    assert every["total"] < none["total"] / 2


@pytest.mark.gpu
def test_fused_graph_replay_equals_torch_eager_on_cuda(tmp_path):
    """The captured step with every fused kernel against the eager CUDA step with none, on a Q8_0
    model whose experts run the MoE kernels (graph-safe), over buckets 8, 16 and 32. Within 1e-5
    as test_cuda_graphs' replay test: the MoE kernels add by atomics."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    m = load_model(path, device="cuda")
    try:
        assert graph_blocker(m.net) is None
        want, want_ids, _ = greedy(m.net, "none", "cuda", lambda c: lambda t: m.net(torch.tensor([t]), c), 24)
        got, got_ids, step = greedy(m.net, "all", "cuda", static(m.net, graphs=True), 24)
    finally:
        m.close()
    assert sorted(step._graphs) == [8, 16, 32]
    assert got_ids == want_ids
    assert rel_err(got, want) < 1e-5
