"""Streaming output equals fully-resident output: the same logits (bit for bit) and the same greedy
tokens, on every architecture, at cache sizes from the plan's minimum (top-k) to everything, with
and without prefetch, for every policy, after a resize, and through the buffered fallback."""

import pytest
import torch

from sparkd.engine.models import load_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.streaming.prefetch import attach_prefetch

from conftest import open_stream

PROMPT = torch.tensor([1, 5, 9, 300, 22, 17, 40, 41, 42, 7, 8, 100])
N_DECODE = 6


def run(net) -> tuple[torch.Tensor, list[int]]:
    """Prompt logits, then greedy decode; returns all logits rows and the tokens."""
    cache = net.new_cache(64)
    rows = [net(PROMPT, cache)]
    out = []
    for _ in range(N_DECODE):
        out.append(int(rows[-1][-1].argmax()))
        rows.append(net(torch.tensor(out[-1:]), cache))
    return torch.cat(rows), out


@pytest.fixture(scope="module")
def reference(tiny_models):
    ref = {}
    for key, path in tiny_models.items():
        m = load_model(path)
        try:
            ref[key] = run(m.net)
        finally:
            m.close()
    return ref


def check_same(reference, key, m, store):
    try:
        logits, tokens = run(m.net)
    finally:
        m.close()
        store.close()
    ref_logits, ref_tokens = reference[key]
    assert tokens == ref_tokens
    assert torch.equal(logits, ref_logits), (logits - ref_logits).abs().max()


@pytest.mark.parametrize("quant", ["Q8_0", "F32"])
@pytest.mark.parametrize("arch", sorted(TINY))
@pytest.mark.parametrize("extra_slots", [0, 3, 1000])  # the minimum (top-k), a few more, all
def test_streaming_equals_resident(tiny_models, reference, arch, quant, extra_slots):
    slots = TINY[arch].n_expert_used + extra_slots
    m, store = open_stream(tiny_models[arch, quant], slots)
    misses_possible = slots < store.plan.n_experts_total
    check_same(reference, (arch, quant), m, store)
    st = store.stats
    assert st.requests == st.hits + st.misses and st.misses > 0
    if not misses_possible:
        assert st.evictions == 0


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo"])
def test_every_policy_gives_the_same_output(tiny_models, reference, policy):
    m, store = open_stream(tiny_models["qwen3moe", "Q8_0"], 3, policy=policy)
    check_same(reference, ("qwen3moe", "Q8_0"), m, store)
    assert store.stats.evictions > 0


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "gpt-oss"])
def test_prefetch_changes_nothing_but_the_counters(tiny_models, reference, arch):
    m, store = open_stream(tiny_models[arch, "Q8_0"], TINY[arch].n_expert_used + 1, prefetch=4)
    hooks = attach_prefetch(m.net, store)
    check_same(reference, (arch, "Q8_0"), m, store)
    st = store.stats
    assert st.prefetch_predicted > 0
    assert st.prefetch_useful + st.prefetch_wasted <= st.prefetch_predicted
    assert hooks


def test_resize_shrink_and_grow_keeps_output(tiny_models, reference):
    m, store = open_stream(tiny_models["llama", "Q8_0"], 12)
    cache = m.net.new_cache(64)
    m.net(PROMPT, cache)
    slot = store.plan.slot_bytes
    assert store.resize(2 * slot) == 2 * slot
    assert len(store.policy) <= 2 and store.capacity == 2
    assert store.resize(12 * slot) == 12 * slot
    m.close()
    store.close()
    m, store = open_stream(tiny_models["llama", "Q8_0"], 12)
    store.resize(2 * slot)  # run the whole reference at the shrunken size
    check_same(reference, ("llama", "Q8_0"), m, store)


def test_resize_refuses_below_top_k_and_beyond_the_plan(tiny_models):
    from sparkd.engine.errors import EngineError
    m, store = open_stream(tiny_models["qwen3moe", "Q8_0"], 4)
    try:
        with pytest.raises(EngineError, match="must hold at least top-2 experts"):
            store.resize(store.plan.slot_bytes)
        with pytest.raises(EngineError, match="restart with a larger --budget"):
            store.resize(5 * store.plan.slot_bytes)
        assert store.capacity == 4
    finally:
        m.close()
        store.close()


@pytest.mark.root
def test_buffered_fallback_where_o_direct_is_refused_warns_once_and_matches(tiny_models, reference, tmp_path):
    # ramfs refuses O_DIRECT (tmpfs accepts it since Linux 6.6)
    import shutil
    import subprocess
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount ramfs here")
    warnings = []
    try:
        copy = mnt / "m.gguf"
        shutil.copy(tiny_models["qwen3moe", "Q8_0"], copy)
        m, store = open_stream(copy, 3, warn=warnings.append)
        assert not store.reader.direct
        check_same(reference, ("qwen3moe", "Q8_0"), m, store)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert len(warnings) == 1 and "O_DIRECT is refused" in warnings[0] and "DONTNEED" in warnings[0]
