"""A prompt chunk's transient memory against the plan's workspace (streaming/plan.workspace_bytes): every tensor a
forward makes, tracked op by op (live_bytes.LiveBytes; the cache's rows, the weights and the rope tables are not the
forward's), at most what the plan counts, for every architecture whose attention the default count
(plan.attention_floats) covers, at long contexts in small chunks (where the keys and values widened to each query
head outweigh the scores: session 37 found GQA's 1.3-1.5x over the plan's count there) and at a short one in a large
chunk. On the GPU box the same forwards run on CUDA (the kernels, SDPA, MLA's expanded heads from 128 tokens) against
the device's peak allocation."""

import dataclasses

import pytest
import torch

from live_bytes import LiveBytes
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model
from sparkd.engine.streaming.plan import attention_floats, workspace_bytes

ARCHS = ["qwen3moe", "gpt-oss", "gemma3", "llama", "glm4moe", "deepseek2", "glm-dsa", "kimi-k3"]
CHUNKS = [(1000, 16), (3000, 8), (200, 256)]  # (cached positions, the chunk's tokens)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("ws")
    return {a: write_model(d / f"{a}.gguf", plan(dataclasses.replace(TINY[a], n_ctx=4096), "F32"), seed=1)[0]
            for a in ARCHS}


def chunk_peak(path, P: int, T: int, device: str):
    """(the model's config, the bytes a forward of T tokens after P cached positions holds at its peak)."""
    m = load_model(path, device=device)
    try:
        cache = m.net.new_cache(P + T)
        tokens = torch.randint(1, 200, (P + T,), generator=torch.Generator().manual_seed(P))
        for a in range(0, P, 512):
            m.net(tokens[a:min(P, a + 512)], cache)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            m.net(tokens[P:], cache)
            torch.cuda.synchronize()
            return m.cfg, torch.cuda.max_memory_allocated() - before
        held = cache.position_rows() + cache.sequence_state() + list(m.net.parameters()) + list(m.net.buffers())
        held += [t for tables in m.net.rope_tables.values() for t in tables]
        with LiveBytes(held) as live:
            m.net(tokens[P:], cache)
        return m.cfg, live.peak
    finally:
        m.close()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("P, T", CHUNKS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_prompt_chunk_holds_at_most_the_plans_workspace(paths, arch, P, T, device):
    cfg, peak = chunk_peak(paths[arch], P, T, device)
    assert peak <= workspace_bytes(cfg, P + T, T, cuda=device == "cuda"), (peak, arch, P, T)


def test_the_keys_widened_to_each_head_are_counted(paths):
    """What session 37 added (GQA's repeated keys and values, 4 [ctx, H, D] and the widened rows): without it the
    long-context chunk of qwen3moe holds more than the plan counted."""
    cfg, peak = chunk_peak(paths["qwen3moe"], 3000, 8, "cpu")
    widened = attention_floats(cfg, 3008, 8) - 3 * cfg.n_head * 8 * 3008
    assert widened > 0
    assert workspace_bytes(cfg, 3008, 8) - int(widened * 4 * 1.5) < peak <= workspace_bytes(cfg, 3008, 8)


def test_what_every_chunk_holds_does_not_shrink_the_chunks(paths):
    """default_batch_tokens leaves GQA's repeated keys (repeated_floats: held by a chunk of any size at that context)
    out of the share it fits the chunk's workspace into: a budget whose share holds a 64-token chunk's workspace less
    them gives 64-token chunks, though the whole workspace is over the share."""
    from sparkd.engine.streaming.plan import F32_BYTES, WORKSPACE_SHARE, default_batch_tokens, repeated_floats

    with GGUFModel.open(paths["qwen3moe"]) as g:
        cfg, ctx = config_of(g), 4096
    fixed = int(repeated_floats(cfg, ctx) * F32_BYTES * 1.5)
    budget = int((workspace_bytes(cfg, ctx, 64) - fixed) / WORKSPACE_SHARE) + 1
    assert workspace_bytes(cfg, ctx, 64) > budget * WORKSPACE_SHARE
    assert default_batch_tokens(cfg, ctx, budget) == 64
