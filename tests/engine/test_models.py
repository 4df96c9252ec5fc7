"""Each architecture on a generated tiny model: loads, runs, incremental decode equals a full
recompute, logits finite; quantized variants load through the same path."""

import pytest
import torch

from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

TOKENS = torch.tensor([1, 5, 9, 300, 22, 17, 40, 41, 42, 7, 8, 100])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {a: write_model(d / f"{a}.gguf", plan(TINY[a], "F32"), seed=3)[0] for a in TINY}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_incremental_equals_full_recompute(models, arch):
    m = load_model(models[arch])
    try:
        assert m.cfg.arch == arch
        full = m.net(TOKENS, m.net.new_cache(32))
        cache = m.net.new_cache(32)
        steps = [m.net(TOKENS[:5], cache)] + [m.net(TOKENS[i:i + 1], cache) for i in range(5, len(TOKENS))]
        inc = torch.cat(steps)
    finally:
        m.close()
    assert full.shape == (len(TOKENS), TINY[arch].n_vocab)
    assert torch.isfinite(full).all()
    assert full.std() > 0.1  # not a degenerate network
    err = ((full - inc).abs().max() / full.abs().max()).item()
    assert err < 1e-5, f"{arch}: incremental vs full relative error {err}"


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q2_K", "F16", "BF16"])
def test_quantized_model_close_to_its_own_dequantized_weights(tmp_path, quant):
    # the quantized file runs; its logits are finite and differ from a different seed's
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], quant), seed=4)[0]
    m = load_model(path)
    try:
        out = m.net(TOKENS, m.net.new_cache(32))
    finally:
        m.close()
    assert torch.isfinite(out).all() and out.std() > 0.1


def test_deepseek2_caches_only_the_latent(models):
    m = load_model(models["deepseek2"])
    try:
        cache = m.net.new_cache(16)
        s = TINY["deepseek2"]
        assert all(v is None for v in cache.v)
        assert cache.k[0].shape == (16, 1, s.kv_lora_rank + s.qk_rope)
    finally:
        m.close()


def test_kv_cache_overflow_is_a_clear_error(models):
    from sparkd.engine.errors import EngineError
    m = load_model(models["qwen3moe"])
    try:
        with pytest.raises(EngineError, match="could not extend the KV cache to 12 positions: context is 4"):
            m.net(TOKENS, m.net.new_cache(4))
    finally:
        m.close()


def test_caches_of_a_model_share_its_rope_tables(models):
    """A prompt's new cache reuses the tables of its context (no host sin/cos per prompt), the
    values a cache of its own makes; another context gets its own."""
    from sparkd.engine.layers.kv_cache import KVCache

    m = load_model(models["qwen3moe"])
    try:
        rope = m.net.blocks[0].attn.rope
        a, b, c = (m.net.new_cache(n).rope_table(rope) for n in (16, 16, 8))
        alone = KVCache(16, m.net.kv_shapes).rope_table(rope)
    finally:
        m.close()
    assert a[0] is b[0] and a[1] is b[1] and c[0].shape[0] == 8
    assert torch.equal(a[0], alone[0]) and torch.equal(a[1], alone[1])


def test_a_forward_makes_each_windows_mask_once(models, monkeypatch):
    """The attention masks are made once a forward and window (KVCache.masks), not once a layer: gemma3's
    sliding-window layers share one, its global layer has its own, for a prompt and its continuation; the
    logits are those of every layer making its own, bit for bit, and none is kept past the forward."""
    from sparkd.engine.layers import attention

    m = load_model(models["gemma3"])
    try:
        windows = [b.attn.window for b in m.net.blocks]
        assert len(windows) > len(set(windows)) > 1  # a window shared by layers, and another

        def run():
            cache = m.net.new_cache(32)
            return [m.net(TOKENS[:5], cache), m.net(TOKENS[5:], cache)], cache

        made, make = [], attention.hidden_keys
        monkeypatch.setattr(attention, "hidden_keys", lambda *a: made.append(a[3]) or make(*a))
        shared, cache = run()
        assert sorted(made) == sorted(2 * list(set(windows))) and cache.masks is None
        shared_mask = attention.forward_mask
        monkeypatch.setattr(attention, "forward_mask", lambda masks, *a: shared_mask(None, *a))
        made.clear()
        own = run()[0]
    finally:
        m.close()
    assert len(made) == 2 * len(windows)
    assert all(torch.equal(a, b) for a, b in zip(shared, own, strict=True))
