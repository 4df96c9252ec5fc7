"""kernels/rope_attention.py (rope, the KV write and decode attention in one launch) against the torch reference
(apply_rope, the row written into the cache, attend) and against the two kernels it replaces (rope_kv then
decode_attention), on random inputs with odd sizes, one range and several, sliding windows, sinks and rows
that must not be read; bad arguments refused with the cache untouched.

Where there is no GPU the kernel runs under TRITON_INTERPRET=1 on the CPU (tiny shapes); on the GPU box the same
checks run compiled (marker gpu). Bounds: test_fused_kernels' (rope_kv 1e-6, attention 4e-6)."""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine.kernels import rope_attention as ra  # noqa: E402
from sparkd.engine.kernels.decode_attention import decode_attention  # noqa: E402
from sparkd.engine.kernels.family import KernelArgumentError  # noqa: E402
from sparkd.engine.kernels.rope_kv import rope_kv  # noqa: E402
from sparkd.engine.layers.attention import attend  # noqa: E402
from sparkd.engine.layers.norm import rms_normalize_torch  # noqa: E402
from sparkd.engine.layers.rope import RopeConfig, apply_rope, rope_cos_sin  # noqa: E402

BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant runs where there "
                       "is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
ROPE_BOUND, ATTENTION_BOUND = 1e-6, 4e-6


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu().double() - want.cpu().double()).norm() / want.cpu().double().norm())


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, NaN where NaN."""
    return torch.equal(a.cpu().isnan(), b.cpu().isnan()) and torch.equal(a.cpu().nan_to_num(7.0),
                                                                          b.cpu().nan_to_num(7.0))


def inputs(H, Hkv, Dk, Dv, n_rot, neox, S, pos, norm, sinks, seed=0):
    """The token's raw q, k, v, the rope tables, a cache of S rows holding history below pos and NaN at pos and
    past it (a row the step must write, never read), the norms and the sinks."""
    g = torch.Generator().manual_seed(seed)
    cos, sin = rope_cos_sin(RopeConfig(n_rot=n_rot, base=10000.0, neox=neox), torch.arange(S))
    q, k, v = (torch.randn(1, n, d, generator=g) for n, d in ((H, Dk), (Hkv, Dk), (Hkv, Dv)))
    k_cache, v_cache = torch.randn(S, Hkv, Dk, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    k_cache[pos:], v_cache[pos:] = float("nan"), float("nan")
    norms = (torch.randn(Dk, generator=g), torch.randn(Dk, generator=g), 1e-6) if norm else None
    sink = torch.randn(H, generator=g) if sinks else None
    return q, k, v, cos, sin, k_cache, v_cache, norms, sink


def reference(q, k, v, cos, sin, pos, k_cache, v_cache, neox, norms, scale, window, sink):
    """Torch: norms, rope, the row at pos, attend → (output, the caches after)."""
    if norms is not None:
        q, k = (rms_normalize_torch(t, norms[2]) * w for t, w in zip((q, k), norms[:2]))
    c, s = cos[pos:pos + 1], sin[pos:pos + 1]
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_cache[pos], v_cache[pos] = apply_rope(k, c, s, neox)[0], v[0]
    keys, values = k_cache[:pos + 1], v_cache[:pos + 1]  # attend reads rows up to the position
    return attend(apply_rope(q, c, s, neox), keys, values, scale, torch.tensor([pos]), window, sink), k_cache, v_cache


def to(backend, *ts):
    return [None if t is None else (t.to(backend) if isinstance(t, torch.Tensor) else t) for t in ts]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("neox, H, Hkv, Dk, Dv, n_rot, S, pos, window, sinks, norm, tile", [
    (True, 4, 2, 16, 16, 16, 16, 0, 0, False, False, 4096),  # the first position: one key, the new one
    (False, 6, 3, 12, 10, 8, 40, 39, 0, True, True, 4096),  # the last row, odd widths, a partial rotation
    (True, 8, 2, 16, 16, 12, 80, 47, 0, True, True, 256),  # 16-key ranges: three hold keys, one fold
    (False, 4, 4, 16, 24, 16, 70, 66, 20, False, False, 256),  # a sliding window: the first ranges hold none
    (True, 6, 1, 32, 32, 32, 64, 33, 100, True, True, 512)])  # a window wider than the sequence
def test_rope_attention_matches_torch_and_the_two_kernels(backend, monkeypatch, neox, H, Hkv, Dk, Dv, n_rot, S, pos,
                                                          window, sinks, norm, tile):
    """The output within attention's bound of torch's and of rope_kv then decode_attention; rope(k) and v written
    at row pos (rope_kv's bound, v exactly), every other row as it was (NaN rows past the position unread);
    the same bits on a second call (the tickets handed back, the row now written)."""
    monkeypatch.setattr(ra, "TILE_VALUES", tile)
    q, k, v, cos, sin, k_cache, v_cache, norms, sink = inputs(H, Hkv, Dk, Dv, n_rot, neox, S, pos, norm, sinks)
    want, want_k, want_v = reference(q, k, v, cos, sin, pos, k_cache, v_cache, neox, norms, 0.3, window, sink)
    dq, dk, dv, dcos, dsin, dkc, dvc, dsink = to(backend, q, k, v, cos, sin, k_cache, v_cache, sink)
    dnorms = None if norms is None else (*to(backend, *norms[:2]), norms[2])
    dpos = torch.tensor([pos], device=backend)
    got = ra.rope_attention(dq, dk, dv, dcos, dsin, dpos, dkc, dvc, neox, dnorms, 0.3, window, dsink)
    assert rel_err(got, want) < ATTENTION_BOUND
    assert rel_err(dkc[pos], want_k[pos]) < ROPE_BOUND and torch.equal(dvc[pos].cpu(), v[0])
    rest = torch.arange(S) != pos
    assert same(dkc.cpu()[rest], k_cache[rest]) and same(dvc.cpu()[rest], v_cache[rest])
    assert torch.equal(ra.rope_attention(dq, dk, dv, dcos, dsin, dpos, dkc, dvc, neox, dnorms, 0.3, window, dsink),
                       got)
    kc2, vc2 = to(backend, k_cache, v_cache)
    q2 = rope_kv(dq, dk, dv, dcos, dsin, dpos, kc2, vc2, neox, dnorms)
    assert rel_err(got, decode_attention(q2, kc2, vc2, dpos, 0.3, window, dsink)) < ATTENTION_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_attention_over_a_longer_cache_keeps_its_bits(backend, monkeypatch):
    """An eager step attends over every row of the cache (decode_rows): more ranges, past the position, return
    at once, so the result and the row written are the static step's over its bucket."""
    monkeypatch.setattr(ra, "TILE_VALUES", 256)  # 16-key ranges
    q, k, v, cos, sin, k_cache, v_cache, norms, sink = inputs(4, 2, 16, 16, 16, True, 96, 37, True, True, seed=1)
    args = to(backend, q, k, v, cos, sin, torch.tensor([37]))
    norms = (*to(backend, *norms[:2]), norms[2])
    bucket = to(backend, k_cache[:48], v_cache[:48])
    whole = to(backend, k_cache, v_cache)
    got = ra.rope_attention(*args, *bucket, True, norms, 0.3, 0, sink.to(backend))
    assert torch.equal(ra.rope_attention(*args, *whole, True, norms, 0.3, 0, sink.to(backend)), got)
    assert same(whole[0][:48], bucket[0]) and same(whole[1][:48], bucket[1])


@pytest.mark.parametrize("bad, match", [
    (dict(q=torch.randn(1, 3, 16)), "multiple of Hkv"),
    (dict(pos=torch.tensor([1.0])), "pos must be one integer"),
    (dict(k_cache=torch.zeros(8, 2, 12)), "cache rows"),
    (dict(cos=torch.zeros(8, 9)), r"n_rot <= Dk"),
    (dict(v=torch.randn(1, 2, 16).double()), "float32"),
    (dict(sinks=torch.zeros(3)), r"sinks must be float32 \[H\]")])
def test_rope_attention_refuses_bad_arguments(bad, match):
    """Each bad argument: the clear error naming the kernel, and neither cache touched."""
    args = dict(q=torch.randn(1, 4, 16), k=torch.randn(1, 2, 16), v=torch.randn(1, 2, 16), cos=torch.zeros(8, 8),
                sin=torch.zeros(8, 8), pos=torch.tensor([1]), k_cache=torch.randn(8, 2, 16),
                v_cache=torch.randn(8, 2, 16), neox=True, norms=None, scale=0.3, window=0, sinks=None)
    args.update(bad)
    if "cos" in bad:
        args["sin"] = bad["cos"]
    before = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(KernelArgumentError, match=r"could not run rope_attention .*" + match):
        ra.rope_attention(**args)
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])
