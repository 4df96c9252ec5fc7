"""The float16 KV cache (--kv-type, layers/kv_cache.py): rows rounded once as they are written, every reader
computing in float32 from the rounded rows.

- The decode kernels (rope_kv, rope_attention, decode_attention's rules) over float16 caches: the row they write
  is their float32 row rounded (the same bits as the float32 cache's row, rounded by torch), and attention is
  attend's over the rounded rows, within the float32 bounds of test_fused_kernels.
- KVCache: the type applies to layers with values and to the layers a model names typed (MLA's latent rows,
  session 31); other rows keep float32; writes round.
- The memory plan counts the rows' bytes; auto is f16 on CUDA, f32 on the CPU; bad types are refused clearly.
- End to end on the CPU: a model decoding over a float16 cache stays within the rounding of float32's logits, and
  `generate --kv-type f16` says which type it used.

Where there is no GPU the kernels run under TRITON_INTERPRET=1 on the CPU (tiny shapes); on the GPU box the same
checks run compiled (marker gpu)."""

import json
import os
import subprocess
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.layers.attention import attend  # noqa: E402
from sparkd.engine.layers.kv_cache import KV_TYPES, KVCache, kv_type_name  # noqa: E402

BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant runs where there "
                       "is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
ATTENTION_BOUND = 4e-6  # test_fused_kernels' float32 bound: the same arithmetic over the rounded rows


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu().double() - want.cpu().double()).norm() / want.cpu().double().norm())


def history(S, Hkv, Dk, Dv, pos, seed=0):
    """float32 caches with rows below pos and NaN from pos on (rows the step writes or must not read)."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(S, Hkv, Dk, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    k[pos:], v[pos:] = float("nan"), float("nan")
    return k, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["grouped", "auto", "serial", "off", "rope_attention"])
def test_f16_cache_decode_matches_attend_over_the_rounded_rows(backend, monkeypatch, rule):
    """rope_kv then decode_attention (each split rule), and rope_attention's one launch, over float16 caches: the
    row written is the float32 cache's row rounded, the other rows untouched, and the output attend's over the
    float16 rows (widened) within the float32 bound; a float32 cache's output differs only by the rounding."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")
    from sparkd.engine.kernels import decode_attention as da
    from sparkd.engine.kernels import grouped_attention as ga
    from sparkd.engine.kernels.rope_attention import rope_attention
    from sparkd.engine.kernels.rope_kv import rope_kv
    from sparkd.engine.layers.rope import RopeConfig, rope_cos_sin

    if rule != "rope_attention":
        monkeypatch.setattr(da, "SPLIT_RULE", rule)
    monkeypatch.setattr(ga, "TILE_VALUES", 16 * 32)  # 16-key blocks: several ranges at this span
    H, Hkv, D, S, pos, window = 8, 2, 32, 96, 70, 0
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, n, D, generator=g) for n in (H, Hkv, Hkv))
    sinks = torch.randn(H, generator=g)
    cos, sin = rope_cos_sin(RopeConfig(n_rot=D, base=10000.0, neox=True), torch.arange(S))
    k32, v32 = history(S, Hkv, D, D, pos)
    dev = [t.to(backend) for t in (q, k, v, cos, sin, sinks)]
    p = torch.tensor([pos], device=backend)

    def step(k_cache, v_cache):
        if rule == "rope_attention":
            return rope_attention(*dev[:5], p, k_cache, v_cache, True, None, 0.3, window, dev[5]), None
        q_roped = rope_kv(*dev[:5], p, k_cache, v_cache, True)
        return da.decode_attention(q_roped, k_cache, v_cache, p, 0.3, window, dev[5]), q_roped

    kc32, vc32 = k32.to(backend), v32.to(backend)
    out32, q_roped = step(kc32, vc32)
    kc16, vc16 = k32.half().to(backend), v32.half().to(backend)
    out16, _ = step(kc16, vc16)
    assert kc16.dtype == vc16.dtype == torch.float16
    assert torch.equal(kc16[pos].cpu(), kc32[pos].cpu().half()) and torch.equal(vc16[pos].cpu(), v[0].half())
    rest = torch.arange(S) != pos
    torch.testing.assert_close(kc16.cpu()[rest], k32.half()[rest], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc16.cpu()[rest], v32.half()[rest], rtol=0, atol=0, equal_nan=True)
    if q_roped is None:  # rope_attention: its rotated q, as rope_kv makes it
        q_roped = rope_kv(*dev[:5], p, kc32.clone(), vc32.clone(), True)
    want = attend(q_roped.cpu(), kc16.cpu()[:pos + 1], vc16.cpu()[:pos + 1], 0.3, torch.tensor([pos]), window,
                  sinks)
    assert rel_err(out16, want) < ATTENTION_BOUND
    assert 0 < rel_err(out16, out32) < 1e-2  # the rows' rounding, nothing more


def test_kv_cache_rounds_the_rows_of_typed_layers_only():
    """kv_dtype is the GQA layers' K/V type; a layer without values keeps the cache's float32 unless the model names
    it typed (MLA's latent rows); append and update round what they write; nbytes counts the rows as held."""
    shapes = [(2, 8, 8), (1, 12, 0)]  # a GQA layer, an MLA-style latent layer
    half, full = KVCache(6, shapes, kv_dtype=torch.float16), KVCache(6, shapes)
    assert [t.dtype for t in half.k] == [torch.float16, torch.float32] and half.v[0].dtype == torch.float16
    assert half.v[1] is None and full.k[0].dtype == torch.float32
    assert full.nbytes - half.nbytes == 2 * 6 * 2 * 8 * 2  # K and V of layer 0 at 2 bytes a value less
    latent = KVCache(6, shapes, kv_dtype=torch.float16, typed=[False, True])
    assert [t.dtype for t in latent.k] == [torch.float32, torch.float16] and latent.v[0].dtype == torch.float32
    assert full.nbytes - latent.nbytes == 6 * 12 * 2
    k, v = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    keys, values = half.update(0, 0, k, v)[:2]
    assert torch.equal(keys, k.half()) and torch.equal(values, v.half())
    half.span = 6  # static decode: append writes by index
    keys, values, _ = half.append(0, torch.tensor([4]), k[:1], v[:1])
    assert keys.dtype == torch.float16 and torch.equal(keys[4], k[0].half()) and torch.equal(values[4], v[0].half())


@pytest.mark.parametrize("choice, device, want", [("auto", "cuda", "f16"), ("auto", "cpu", "f32"),
                                                   ("f32", "cuda", "f32"), ("f16", "cpu", "f16")])
def test_kv_type_name_resolves_auto_by_the_device(choice, device, want):
    assert kv_type_name(choice, device) == want and want in KV_TYPES


def test_kv_type_name_refuses_unknown_types():
    with pytest.raises(EngineError, match=r"could not use --kv-type 'q8_0': choose auto, f32, f16"):
        kv_type_name("q8_0", "cpu")


def test_engine_refuses_an_unknown_kv_type_before_loading(tmp_path):
    """The server's Engine checks the type when it is made: the clear error, and no model file opened."""
    from sparkd.engine.runtime import Engine

    with pytest.raises(EngineError, match=r"could not use --kv-type 'bf16'"):
        Engine(tmp_path / "absent.gguf", kv_type="bf16")
    assert Engine(tmp_path / "absent.gguf", device="cuda").kv_type == "f16"  # auto, resolved without a GPU


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY

    where = tmp_path_factory.mktemp("kv16")
    return {arch: write_model(where / f"{arch}.gguf", plan(TINY[arch], "F32"), seed=1)[0]
            for arch in ("qwen3moe", "deepseek2", "kimi-k3")}


def _row_bytes(cache) -> int:
    return sum(t.nbytes for t in cache.position_rows())


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "kimi-k3"])
def test_plan_counts_the_rows_as_the_cache_holds_them(tiny_models, arch):
    """kv_bytes (the memory plan's term) is the cache's nbytes at either type: GQA rows and MLA's latent rows
    (deepseek2; kimi-k3's MLA layers since session 36) at the type's size, the rest (kimi-k3's KDA state) float32."""
    from sparkd.engine.models import load_model
    from sparkd.engine.streaming.plan import kv_bytes

    m = load_model(tiny_models[arch], device="cpu")
    try:
        caches = {name: m.net.new_cache(40, KV_TYPES[name]) for name in KV_TYPES}
        got = {name: (kv_bytes(m.cfg, 40, name), c.nbytes) for name, c in caches.items()}
    finally:
        m.close()
    assert all(plan == held for plan, held in got.values())
    assert (got["f32"][0] - got["f16"][0]) * 2 == _row_bytes(caches["f32"]) > 0


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "kimi-k3"])
def test_decode_over_a_f16_cache_stays_within_its_rounding(tiny_models, arch):
    """A prompt and four greedy steps on the CPU over float16 and float32 caches: logits within the rows' rounding
    (the same tokens picked); the float16 cache holds half the K/V (MLA: latent) bytes."""
    from sparkd.engine.models import load_model

    m = load_model(tiny_models[arch], device="cpu")
    try:
        runs = {}
        for name in ("f32", "f16"):
            cache = m.net.new_cache(16, KV_TYPES[name])
            ids, logits = [1, 5, 9, 2], [m.net(torch.tensor([1, 5, 9, 2]), cache)[-1]]
            for _ in range(4):
                ids.append(int(logits[-1].argmax()))
                logits.append(m.net(torch.tensor(ids[-1:]), cache)[-1])
            runs[name] = (ids, torch.stack(logits), _row_bytes(cache))
    finally:
        m.close()
    (ids32, l32, b32), (ids16, l16, b16) = runs["f32"], runs["f16"]
    assert ids16 == ids32
    assert 0 < rel_err(l16, l32) < 1e-2
    assert b16 * 2 == b32 > 0


def test_generate_reports_the_kv_type_and_refuses_bad_ones(tiny_models):
    """`generate --kv-type f16 --json` decodes and reports f16 (auto on the CPU: f32); a bad type is argparse's
    clear refusal before anything loads."""
    def generate(*extra):
        return subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "generate", str(tiny_models["qwen3moe"]),
                               "--tokens", "1,5,9", "-n", "3", "--resident", "--json", *extra], capture_output=True,
                              text=True, timeout=300)

    runs = {t: generate("--kv-type", t) for t in ("f16", "auto")}
    for r in runs.values():
        assert r.returncode == 0, r.stderr
    got = {t: json.loads(r.stdout.splitlines()[-1]) for t, r in runs.items()}
    assert got["f16"]["kv_type"] == "f16" and got["auto"]["kv_type"] == "f32"
    assert 2 * got["f16"]["cache_bytes"] == got["auto"]["cache_bytes"] > 0  # qwen3moe: K/V rows only
    assert len(got["f16"]["tokens"]) == 3
    assert got["auto"]["decode_step"] == "eager"  # the CPU: no graphs
    bad = generate("--kv-type", "q8")
    assert bad.returncode == 2 and "invalid choice: 'q8'" in bad.stderr


def test_plan_command_plans_the_rows_type(tiny_models):
    """`plan --kv-type f16 --json`: the kv term at half f32's bytes, the type named; auto on the CPU plans f32."""
    def planned(kv_type):
        r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "plan", str(tiny_models["qwen3moe"]), "--ctx",
                            "64", "--budget", "4G", "--kv-type", kv_type, "--json"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    f16, auto = planned("f16"), planned("auto")
    assert (f16["kv_type"], auto["kv_type"]) == ("f16", "f32")
    assert f16["kv_bytes"] * 2 == auto["kv_bytes"] > 0


def test_a_cache_that_takes_no_kv_type_is_named_as_it_is(tmp_path):
    """DeepSeek V4's cache (windows of raw rows, compressor state) stays f32 whatever --kv-type asks: `plan --kv-type
    f16 --json` and `generate --kv-type f16 --json` name f32 (they named the type asked for), at the same bytes."""
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY

    path = str(write_model(tmp_path / "v4.gguf", plan(TINY["deepseek4"], "F32"), seed=1)[0])

    def run(*args):  # plan prints one JSON document, generate its result on the last line
        r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", *args], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout if args[0] == "plan" else r.stdout.splitlines()[-1])

    planned = {t: run("plan", path, "--ctx", "64", "--budget", "4G", "--kv-type", t, "--json") for t in ("f16", "f32")}
    assert planned["f16"]["kv_type"] == planned["f32"]["kv_type"] == "f32"
    assert planned["f16"]["kv_bytes"] == planned["f32"]["kv_bytes"] > 0
    generated = run("generate", path, "--tokens", "1,5,9", "-n", "2", "--resident", "--json", "--kv-type", "f16")
    assert generated["kv_type"] == "f32" and generated["tokens"]
