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
from torch.nn import functional as F

from live_bytes import LiveBytes
from test_fused_kernels import HALF_ATTENTION
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers import attention
from sparkd.engine.layers.attention import MQA_HEADS, attend, attend_sdpa, hidden_keys
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model
from sparkd.engine.streaming.plan import workspace_bytes

ARCHS = ["qwen3moe", "gpt-oss", "gemma3", "llama", "glm4moe", "deepseek2", "glm-dsa", "kimi-k3"]
CHUNKS = [(1000, 16), (3000, 8), (200, 256), (1500, 384)]  # (cached positions, the chunk's tokens)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("ws")
    return {a: write_model(d / f"{a}.gguf", plan(dataclasses.replace(TINY[a], n_ctx=4096), "F32"), seed=1)[0]
            for a in ARCHS}


def run_peak(run, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(run()'s result, the bytes it held at its peak beyond its inputs): CUDA's peak allocation where the inputs are
    on the GPU, else every tensor its ops make (LiveBytes: the inputs, and views of them, are not the run's)."""
    if any(t.is_cuda for t in inputs):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        got = run()
        return got, torch.cuda.max_memory_allocated() - before
    with LiveBytes(inputs) as live:
        got = run()
    return got, live.peak


def chunk_peak(path, P: int, T: int, device: str):
    """(the model's config, the bytes a forward of T tokens after P cached positions holds at its peak)."""
    m = load_model(path, device=device)
    try:
        cache = m.net.new_cache(P + T)
        tokens = torch.randint(1, 200, (P + T,), generator=torch.Generator().manual_seed(P))
        for a in range(0, P, 512):
            m.net(tokens[a:min(P, a + 512)], cache)
        held = cache.position_rows() + cache.sequence_state() + list(m.net.parameters()) + list(m.net.buffers())
        held += [t for tables in m.net.rope_tables.values() for t in tables]
        return m.cfg, run_peak(lambda: m.net(tokens[P:], cache), held)[1]
    finally:
        m.close()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("P, T", CHUNKS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_prompt_chunk_holds_at_most_the_plans_workspace(paths, arch, P, T, device):
    cfg, peak = chunk_peak(paths[arch], P, T, device)
    assert peak <= workspace_bytes(cfg, P + T, T, cuda=device == "cuda"), (peak, arch, P, T)


def repeated_attention(q, k, v, scale, start, sinks=None, sdpa=False):
    """attend's and attend_sdpa's GQA before session 38: the keys and values repeated to each query head, one product
    a head (attend's einsums; SDPA over [1, H, S, D])."""
    group = q.shape[1] // k.shape[1]
    k, v = k.to(q.dtype).repeat_interleave(group, dim=1), v.to(q.dtype).repeat_interleave(group, dim=1)
    T, S = q.shape[0], k.shape[0]
    hidden = hidden_keys(start, T, S, 0, q.device)
    if sdpa:
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           attn_mask=~hidden, scale=scale)
        return o[0].transpose(0, 1)
    scores = torch.einsum("thd,shd->hts", q, k).mul_(scale).masked_fill_(hidden, float("-inf"))
    if sinks is not None:
        sink = sinks[:, None, None].expand(q.shape[1], T, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", probs, v)


GQA = [(1, 3000, 8, 8, 64), (1, 517, 4, 4, 128), (8, 3000, 8, 8, 64), (5, 77, 2, 6, 64), (64, 600, 4, 1, 128)]


@pytest.mark.parametrize("T, S, Hkv, group, D", GQA)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gqa_attention_reads_each_kv_head_in_place(T, S, Hkv, group, D, device, monkeypatch):
    """attend over grouped KV heads: the bits of one product a query head over the rows repeated to it (on CUDA within
    float32's rounding: cuBLAS picks kernels by shape), without those copies (session 37's plan counted 4 [S, H, D] of
    them: 2.1 GB each on gpt-oss-120b at 131072 positions). Bits: a decode step's product over the group's rows at
    once rounds otherwise (the grouped einsum that moved a CPU oracle's greedy decode). Memory: at most what
    plan.attention_floats counts a layer: scores, mask and probabilities of one query head a group ([Hkv, T, S], one
    group index at a time) and the widened rows. On CUDA attend_sdpa too (torch's memory-efficient kernel over the
    rows broadcast with stride 0), within its count: no scores and no repeated rows, the queries' and the output's
    copies and a mask at most; in float32 within float32's rounding of the product over repeated rows, in half (the
    default) within HALF_ATTENTION of it."""
    g = torch.Generator().manual_seed(T * S)
    q, k, v = (torch.randn(n, h, D, generator=g).to(device) for n, h in ((T, Hkv * group), (S, Hkv), (S, Hkv)))
    sinks = torch.randn(Hkv * group, generator=g).to(device)
    # attention_floats: a group index's scores thrice, the rows widened (CUDA's products copy them once more); on CUDA
    # the caching allocator's blocks (512 bytes at least) on top
    widened = (3 if device == "cuda" else 2) * Hkv * S * D
    slop = 256 << 10 if device == "cuda" else 0
    counted = (3 * Hkv * T * S + widened) * 4 + slop
    # (SPARKD_SDPA_PRECISION where it matters, the run, its product over repeated rows, the bytes counted, how close
    # it must be: None for the same bits; on CUDA cuBLAS picks its kernels by the batch's shape, the same products
    # rounded in another order)
    close = None if device == "cpu" else 1e-5
    runs = [(None, lambda: attend(q, k, v, 0.125, S - T), repeated_attention(q, k, v, 0.125, S - T), counted, close),
            (None, lambda: attend(q, k, v, 0.125, S - T, sinks=sinks),
             repeated_attention(q, k, v, 0.125, S - T, sinks), counted, close)]
    if device == "cuda":  # SDPA: no scores, no rows repeated to each query head; half (the default) within its bound
        want = repeated_attention(q, k.half(), v.half(), 0.125, S - T, sdpa=True)
        sdpa_bound = (widened + 2 * T * Hkv * group * D + T * S) * 4 + slop
        runs += [(precision, lambda: attend_sdpa(q, k.half(), v.half(), 0.125, S - T), want, sdpa_bound, within)
                 for precision, within in (("float32", 1e-5), ("half", HALF_ATTENTION))]
    for precision, run, want, bound, within in runs:
        if precision:
            monkeypatch.setattr(attention, "SDPA_PRECISION", precision)
        got, peak = run_peak(run, [q, k, v, sinks])
        if within is None:
            assert torch.equal(got, want)
        else:
            assert float((got - want).norm() / want.norm()) < within, precision
        assert peak <= bound, (peak, bound)


def test_what_every_chunk_holds_does_not_shrink_the_chunks(paths):
    """default_batch_tokens leaves GQA's widened keys (widened_floats: held by a chunk of any size at that context)
    out of the share it fits the chunk's workspace into: a budget whose share holds a 64-token chunk's workspace less
    them gives 64-token chunks, though the whole workspace is over the share."""
    from sparkd.engine.streaming.plan import F32_BYTES, WORKSPACE_SHARE, default_batch_tokens, widened_floats

    with GGUFModel.open(paths["qwen3moe"]) as g:
        cfg, ctx = config_of(g), 4096
    fixed = int(widened_floats(cfg, ctx) * F32_BYTES * 1.5)  # (the CPU's count)
    budget = int((workspace_bytes(cfg, ctx, 64) - fixed) / WORKSPACE_SHARE) + 1
    assert workspace_bytes(cfg, ctx, 64) > budget * WORKSPACE_SHARE
    assert default_batch_tokens(cfg, ctx, budget) == 64


@pytest.mark.parametrize("T, S, H", [(1, 3000, 128), (8, 2000, 128), (5, 77, 20), (3, 40, 8)])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_mqa_attention_scores_a_block_of_heads_at_a_time(T, S, H, device):
    """attend over one KV head (MLA's latent rows: keys of 576, values their first 512): MQA_HEADS query heads' scores
    at a time, the bits of all heads' at once (session 32's product, the reference here), holding
    plan.attention_floats' [MQA_HEADS, T, S] three times at most besides the output and a block's copies (all heads'
    scores before session 38: at 128 heads 8 times as many)."""
    g = torch.Generator().manual_seed(T * S)
    q, k = torch.randn(T, H, 576, generator=g).to(device), torch.randn(S, 1, 576, generator=g).to(device)
    v, sinks = k[..., :512], torch.randn(H, generator=g).to(device)
    hidden = hidden_keys(S - T, T, S, 0, q.device)
    for with_sinks in (False, True):
        scores = torch.einsum("thd,sd->hts", q, k[:, 0]).mul_(0.1).masked_fill_(hidden, float("-inf"))
        if with_sinks:
            scores = torch.cat([scores, sinks[:, None, None].expand(H, T, 1)], dim=-1)
        want = torch.einsum("hts,sd->thd", torch.softmax(scores, dim=-1)[..., :S], v[:, 0])
        got, peak = run_peak(lambda: attend(q, k, v, 0.1, S - T, sinks=sinks if with_sinks else None), [q, k, sinks])
        if device == "cpu":
            assert torch.equal(got, want)
        else:  # cuBLAS picks its kernels by the batch's shape (16 heads, not 128): another order of the same sums
            assert float((got - want).norm() / want.norm()) < 1e-5
        heads = min(H, MQA_HEADS)  # a block's scores thrice, the output, a block's queries and values copied
        assert peak <= (3 * heads * T * (S + 1) + T * H * 512 + 2 * T * heads * (576 + 512)) * 4, (peak, with_sinks)
