"""DeepSeek V4 (deepseek4) specifics on the generated tiny model: incremental decode across
compressed blocks (CSA every 4, HCA every 128 positions), the memory plan's cache size, and the
clear errors for metadata and shapes the reference does not define."""

import pytest
import torch

from sparkd.engine.errors import ModelError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen import specs
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import deepseek4, load_model
from sparkd.engine.streaming.plan import kv_bytes

ARCH = "deepseek4"
TOKENS = torch.randint(0, 256, (134,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("dsv4") / "t.gguf", plan(TINY[ARCH], "F32"), seed=3)[0]


@pytest.mark.parametrize("chunks", [(125,), (50, 40, 3, 2, 30)], ids=["prompt-then-tokens", "chunks"])
def test_incremental_equals_full_across_an_hca_block(path, chunks):
    """The prompt in chunks, then a token at a time, equals the whole sequence at once: chunks longer and shorter
    than the window (6 rows here) read the rows before them from each layer's window."""
    m = load_model(path)
    try:
        full = m.net(TOKENS, m.net.new_cache(len(TOKENS)))
        cache = m.net.new_cache(len(TOKENS))
        ends = [sum(chunks[:i + 1]) for i in range(len(chunks))]
        steps = [m.net(TOKENS[a:b], cache) for a, b in zip([0] + ends, ends)]
        steps += [m.net(TOKENS[i:i + 1], cache) for i in range(ends[-1], len(TOKENS))]
        hca = cache.compressor_state(2, "attn")
    finally:
        m.close()
    assert hca.entries[0].abs().sum() > 0  # position 127 completed the first 128-block
    err = ((full - torch.cat(steps)).abs().max() / full.abs().max()).item()
    assert err < 1e-5, err


@pytest.mark.parametrize("first", [2, 120])
def test_static_steps_equal_eager_across_an_hca_block(path, first):
    """A CUDA graph's step (StaticDecode, run without graphs here: the same ops a capture records) over 14 positions
    from `first`: each compressor writes its block's entry by device position every step (from 120 the CSA blocks
    completing at 123, 127, ..., the first HCA block at 127), the attention reads its window's rows (from 2 some of
    them before position 0, masked), and the logits are the eager steps' within float32 rounding, the argmax the
    same."""
    from sparkd.engine.cuda_graphs import StaticDecode

    m = load_model(path)
    try:
        got = {}
        for way in ("eager", "static"):
            cache = m.net.new_cache(len(TOKENS))
            m.net(TOKENS[:first], cache)
            step = StaticDecode(m.net, cache, graphs=False, first_bucket=64) if way == "static" else \
                (lambda t, c=cache: m.net(torch.tensor([t]), c))
            got[way] = torch.cat([step(int(t)) for t in TOKENS[first:first + 14]])
    finally:
        m.close()
    err = ((got["static"] - got["eager"]).norm() / got["eager"].norm()).item()
    assert err < 1e-5, err
    assert torch.equal(got["static"].argmax(-1), got["eager"].argmax(-1))


def test_memory_plan_counts_the_whole_cache(path):
    m = load_model(path)
    try:
        assert kv_bytes(m.cfg, 100) == m.net.new_cache(100).nbytes
    finally:
        m.close()


def test_the_cache_keeps_each_layers_window_of_raw_rows_not_a_row_per_position(path):
    """Attention reads a window of raw rows (session 36: the last n_swa, not every position's, as llama.cpp's
    sliding-window cache for them), so only the compressors' entries grow with the context, in the cache and in the
    memory plan alike."""
    m = load_model(path)
    try:
        small, big = m.net.new_cache(64), m.net.new_cache(4096)
        assert [tuple(w.rows.shape) for w in big.windows] == [(m.cfg.n_swa, m.cfg.head_dim_k)] * m.cfg.n_layer
        grow = sum((4096 // s.ratio - 64 // s.ratio) * s.entries.shape[1] * 4 for s in big.states.values())
        assert big.nbytes - small.nbytes == grow > 0
        assert kv_bytes(m.cfg, 4096) - kv_bytes(m.cfg, 64) == grow
    finally:
        m.close()


@pytest.mark.parametrize("P, T", [(40, 16), (1000, 256), (5000, 32)])
def test_a_prompt_chunk_holds_at_most_what_the_plan_counts(path, P, T):
    """The plan's workspace for DeepSeek V4 counts deepseek4.attention_floats (session 36) in place of scores over every
    position: each layer's attention, every tensor it makes tracked op by op, holds at most that plus the q/k/v/o
    term, a CSA layer's indexer near it (the scores over every entry), and the whole forward at most
    workspace_bytes."""
    from live_bytes import LiveBytes
    from sparkd.engine.streaming.plan import workspace_bytes

    m = load_model(path)
    peaks, layers = {}, {}

    def enter(mod, args):
        layers[mod.il] = LiveBytes()
        layers[mod.il].__enter__()

    def leave(mod, args, out):
        layers[mod.il].__exit__(None, None, None)
        peaks[mod.il] = layers[mod.il].peak
    try:
        cfg, cache = m.cfg, m.net.new_cache(P + T)
        tokens = torch.randint(0, 200, (P + T,), generator=torch.Generator().manual_seed(P))
        for a in range(0, P, 512):
            m.net(tokens[a:min(P, a + 512)], cache)
        for b in m.net.blocks:
            b.attn.register_forward_pre_hook(enter)
            b.attn.register_forward_hook(leave)
        whole = LiveBytes()
        with whole:
            m.net(tokens[P:], cache)
    finally:
        m.close()
    bound = (deepseek4.attention_floats(cfg, P + T, T) + 4 * T * cfg.n_head * cfg.head_dim_k) * 4
    assert max(peaks.values()) <= bound, (peaks, bound)
    assert peaks[1] > bound / 2  # the CSA layer: its indexer's scores are most of the count
    assert whole.peak <= workspace_bytes(cfg, P + T, T)


def test_long_prompts_run_in_larger_chunks(tmp_path):
    """DeepSeek V4 Flash at 64k positions on a 100 GiB budget: the workspace rule for other models (scores over every
    position, of 16 heads at a time since session 38) cuts a prompt into chunks of 128 tokens (32 before, all 64
    heads' scores); attention_floats's count (the indexer's scores over every CSA entry the largest) allows 256: half
    the chunks, each reading its experts once."""
    import dataclasses
    from sparkd.engine.streaming import plan as memory_plan

    path = write_model(tmp_path / "flash.gguf", plan(specs.PRESETS["deepseek-v4-flash"], "Q4_K", sparse=True),
                       sparse=True)[0]
    with GGUFModel.open(path) as g:
        cfg = deepseek4.config(dict(g.metadata), str(path))
    cfg = dataclasses.replace(cfg, arch=ARCH)
    budget = 100 << 30
    assert memory_plan.default_batch_tokens(cfg, 65536, budget) == 256
    generic = dataclasses.replace(cfg, arch="deepseek2")  # an architecture without the count
    assert memory_plan.default_batch_tokens(generic, 65536, budget) == 128


def _metadata(path) -> dict:
    with GGUFModel.open(path) as g:
        return dict(g.metadata)


@pytest.mark.parametrize("key, value, message", [
    ("deepseek4.attention.compress_ratios", [0, 8, 128], r"compression ratios \[8\] are not supported"),
    ("deepseek4.attention.compress_ratios", [0, 4], "compress_ratios has 2 entries for 3 layers"),
    ("deepseek4.expert_gating_func", 2, "only sqrt-softplus"),
    ("deepseek4.hyper_connection.count", 2, "requires 4"),
    ("deepseek4.attention.sliding_window", 0, "sliding_window is 0"),
])
def test_unsupported_metadata_is_a_clear_error(path, key, value, message):
    md = _metadata(path)
    md[key] = value
    with pytest.raises(ModelError, match=message):
        deepseek4.config(md, str(path))


@pytest.mark.parametrize("change, message", [
    (dict(hc_mult=2), "hc_mult must be 4"),
    (dict(compress_ratios=(0, 128, 0)), "need a ratio-4"),
    (dict(compress_ratios=(0, 4, 16)), "may only hold"),
    (dict(indexer_head_dim=48), "multiple of 64"),
    (dict(o_groups=3), "not a multiple of the 3 output groups"),
])
def test_generator_refuses_shapes_llama_cpp_cannot_run(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        plan(TINY[ARCH].replace(**change), "F32")
    assert not list(tmp_path.iterdir())


def test_preset_has_the_real_expert_shape():
    s = specs.PRESETS["deepseek-v4-flash"]
    names = {n: sh for n, sh, _ in specs.tensors(s.replace(n_layer=2))}
    assert names["blk.1.ffn_gate_exps.weight"] == (256, 2048, 4096)
    assert names["blk.0.ffn_gate_tid2eid.weight"] == (129280, 6)
    assert "blk.0.indexer.proj.weight" in names and "blk.1.attn_compressor_ape.weight" in names


def _v4_template():
    from tests.oracle.llama_oracle import llama_source_dir
    from sparkd.engine.chat import ChatTemplate
    src = (llama_source_dir() / "models" / "templates" / "deepseek-ai-DeepSeek-V4.jinja").read_text()
    return ChatTemplate(src, "<｜begin▁of▁sentence｜>")


def test_v4_template_thinking_prompt_opens_the_reasoning_block():
    from sparkd.engine.chat import split_reasoning
    t = _v4_template()
    user = [{"role": "user", "content": "hi"}]
    assert t.render(user, thinking=True) == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>"
    assert t.render(user).endswith("<｜Assistant｜></think>")  # thinking off by default
    reply = split_reasoning("step by step</think>The answer.", in_reasoning=True)
    assert (reply.reasoning_content, reply.content) == ("step by step", "The answer.")


def test_v4_template_renders_openai_tool_calls_with_string_arguments():
    # OpenAI clients send arguments as a JSON string; the template parses it with from_json
    t = _v4_template()
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": "x"}'}}
    text = t.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "content": "3"}])
    assert '<｜DSML｜invoke name="add">' in text
    assert '<｜DSML｜parameter name="a" string="false">1</｜DSML｜parameter>' in text
    assert '<｜DSML｜parameter name="b" string="true">x</｜DSML｜parameter>' in text
    assert text.endswith("<tool_result>3</tool_result><｜Assistant｜></think>")


def test_mtp_layers_are_refused(path):
    md = _metadata(path)
    md["deepseek4.nextn_predict_layers"] = 1
    with pytest.raises(ModelError, match="multi-token-prediction"):
        deepseek4.config(md, str(path))


def test_a_snapshot_brings_the_compressor_state_back(path):
    """The prompt store's copy (KVCache.snapshot / restore, prompt_store.py): the layers' windows of raw rows and
    their positions, the compressor rings and the entries the prefix completed (and their count) come back over other
    values, and the prefix then continues as it did, bit for bit; the copy holds those entries only, not each
    table's max_ctx / ratio rows (the rest of the table is rewritten before it is read)."""
    m = load_model(path)
    try:
        cache = m.net.new_cache(64)
        m.net(TOKENS[:9], cache)
        saved = cache.snapshot(9)
        want = m.net(TOKENS[9:16], cache)
        cache.reset()
        for t in cache.position_rows() + cache.sequence_state():  # another sequence's rows, positions and rings
            t.normal_() if t.is_floating_point() else t.random_(-1, 64)
        cache.restore(saved, 0, 9)
        got = m.net(TOKENS[9:16], cache)
        states = list(cache.states.values())
        rows = sum(w.rows.nbytes + w.pos.nbytes for w in cache.windows)  # each layer's window, whatever n
        rings = sum(s.kv.nbytes + s.score.nbytes for s in states)
        entries = [s.entries.shape[1] * 4 * (9 // s.ratio) for s in states]
        whole = sum(t.nbytes for t in cache.sequence_state())
    finally:
        m.close()
    assert torch.equal(got, want)
    assert cache.rewind_limit == 0
    assert cache.prefix_bytes(9) == sum(t.nbytes for t in saved) == rows + rings + sum(entries)
    assert 0 < sum(entries) and cache.prefix_bytes(9) < whole  # a CSA layer's 2 rows of 17, HCA's none of 1
