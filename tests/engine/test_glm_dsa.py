"""glm-dsa (GLM-5 family): the lightning indexer's top-k selection, shared-selection layers, the
skipped NextN block, the memory plan's indexer-key cache, bad metadata, and greedy decode against
llama.cpp. (Logits vs llama.cpp, incremental vs full and streaming run from TINY elsewhere.)"""

import pytest
import torch

from sparkd.engine.models import glm_dsa, load_model  # first: layers.rope <-> models.config cycle
from sparkd.engine.errors import ModelError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.lightning_indexer import LightningIndexer, SharedSelection, select_top_k
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import PRESETS, TINY
from sparkd.engine.streaming.plan import kv_bytes

ARCH = "glm-dsa"
TOKENS = torch.tensor([1, 5, 9, 300, 22, 17, 40, 41, 42, 7, 8, 100])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("glmdsa") / "tiny.gguf", plan(TINY[ARCH], "F32"), seed=3)[0]


def test_select_top_k_keeps_the_best_visible_positions():
    scores = torch.tensor([[9.0, 1.0, 5.0, 7.0, 8.0],
                           [3.0, 1.0, 2.0, 0.0, 4.0]])
    keep = select_top_k(scores, torch.tensor([3, 4]), top_k=2)  # queries at positions 3 and 4
    # position 3 sees 0..3 (its best two: 0 and 3); position 4 sees all (4 and 0)
    assert keep.tolist() == [[True, False, False, True, False],
                             [True, False, False, False, True]]


def test_select_top_k_keeps_everything_visible_when_context_is_shorter_than_k():
    keep = select_top_k(torch.randn(3, 3), torch.arange(3), top_k=8)
    assert keep.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_sparse_selection_changes_exactly_the_positions_past_top_k(tiny):
    m = load_model(tiny)
    try:
        k = m.cfg.extra["indexer"].top_k
        assert k < len(TOKENS)
        sparse = m.net(TOKENS, m.net.new_cache(16))
        for block in m.net.blocks:
            block.attn.selector = None
        dense = m.net(TOKENS, m.net.new_cache(16))
    finally:
        m.close()
    # up to position k-1 every visible position is selected; from k on the indexer drops some
    assert torch.allclose(sparse[:k], dense[:k], rtol=0, atol=1e-5)
    per_pos = (sparse[k:] - dense[k:]).abs().amax(-1)
    assert (per_pos > 1e-3).all(), per_pos


def test_shared_layers_reuse_the_previous_full_layers_selection(tiny):
    m = load_model(tiny)
    try:
        full = m.cfg.extra["indexer"].full
        assert full == (True, True, False)  # TINY: idx_lead 1, period 2
        selectors = [b.attn.selector for b in m.net.blocks]
        assert [type(s) for s in selectors] == [LightningIndexer, LightningIndexer, SharedSelection]
        cache = m.net.new_cache(16)
        m.net(TOKENS, cache)
        assert set(cache.side) == {("dsa_keys", 0), ("dsa_keys", 1)}  # shared layers cache no keys
        assert torch.equal(cache.scratch["dsa_keep"], selectors[2](None, None, None, cache))
    finally:
        m.close()


def test_nextn_block_is_in_the_file_but_not_the_trunk(tiny):
    g = GGUFModel.open(tiny)
    try:
        assert g.metadata[f"{ARCH}.block_count"] == TINY[ARCH].n_layer + 1
        assert "blk.3.nextn.eh_proj.weight" in g.tensors
        cfg = glm_dsa.config(g.metadata)
    finally:
        g.close()
    assert cfg.n_layer == TINY[ARCH].n_layer


def test_memory_plan_counts_the_indexer_key_cache(tiny):
    m = load_model(tiny)
    try:
        s = TINY[ARCH]
        cache = m.net.new_cache(40)
        assert kv_bytes(m.cfg, 40) == cache.nbytes
        assert cache.nbytes == 40 * 4 * (s.n_layer * (s.kv_lora_rank + s.qk_rope) + 2 * s.idx_head_dim)
    finally:
        m.close()


def test_glm_5_2_preset_and_default_indexer_types():
    s = PRESETS["glm-5.2"]
    assert (s.n_layer, s.n_expert, s.n_expert_used, s.idx_top_k) == (78, 256, 8, 2048)
    assert tuple(s.full_layers()) == glm_dsa.glm_5_2_full_layers(78)
    assert glm_dsa.glm_5_2_full_layers(10) == (True, True, True, False, False, False,
                                                True, False, False, False)


def _metadata(**changes):
    from sparkd.engine.modelgen.glm_dsa import metadata
    md = {k: v for k, v, _ in metadata(TINY[ARCH])}
    md.update(changes)
    return {k: v for k, v in md.items() if v is not None}


def test_indexer_types_key_absent_follows_the_trained_context():
    assert glm_dsa.config(_metadata(**{f"{ARCH}.attention.indexer.types": None})).extra["indexer"].full \
        == (True, True, True)
    long = glm_dsa.config(_metadata(**{f"{ARCH}.attention.indexer.types": None,
                                       f"{ARCH}.context_length": 1 << 20, f"{ARCH}.block_count": 7}))
    assert long.extra["indexer"].full == (True, True, True, False, False, False)  # GLM-5.2's pattern


@pytest.mark.parametrize("types", [[True, False], [False, True, True]])
def test_bad_indexer_types_are_a_clear_error(types):
    with pytest.raises(ModelError, match=r"indexer.types must give 3 layers starting with a full"):
        glm_dsa.config(_metadata(**{f"{ARCH}.attention.indexer.types": types}))


def test_missing_mla_key_is_a_clear_error():
    with pytest.raises(ModelError, match="key_length_mla is missing"):
        glm_dsa.config(_metadata(**{f"{ARCH}.attention.key_length_mla": None}))


def test_generator_rejects_an_indexer_head_llama_cpp_cannot_rotate():
    with pytest.raises(ValueError, match="idx_head_dim 48 must be a multiple of 64"):
        plan(TINY[ARCH].replace(idx_head_dim=48), "F32")


@pytest.mark.oracle
@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_greedy_decode_identical_to_llama_cpp(tmp_path, quant):
    from tests.oracle.compare import greedy
    from tests.oracle.llama_oracle import llama_generate
    path = write_model(tmp_path / f"{quant}.gguf", plan(TINY[ARCH], quant), seed=11)[0]
    prompt = [int(t) for t in TOKENS]
    m = load_model(path)
    try:
        ours = greedy(m.net, prompt, 16)
    finally:
        m.close()
    assert ours == llama_generate(path, prompt, 16, stop_at_eog=False)


@pytest.mark.oracle
def test_glm_chat_template_reasoning_goes_to_reasoning_content():
    # llama.cpp vendors no GLM-5 template; GLM-5 uses GLM-4.7's format (<|assistant|><think>)
    from sparkd.engine.chat import ChatTemplate, split_reasoning
    from tests.oracle.llama_oracle import llama_source_dir
    t = ChatTemplate((llama_source_dir() / "models" / "templates" / "GLM-4.7-Flash.jinja").read_text())
    chat = [{"role": "user", "content": "2+2?"}]
    prompt = t.render(chat)
    assert prompt.endswith("<|user|>2+2?<|assistant|><think>")
    reply = split_reasoning("Add them.</think>4", in_reasoning=prompt.endswith("<think>"))
    assert (reply.reasoning_content, reply.content) == ("Add them.", "4")
    assert t.render(chat, enable_thinking=False).endswith("<|assistant|></think>")
    turn = chat + [{"role": "assistant", "content": "4", "reasoning_content": "Add them."},
                   {"role": "user", "content": "3+3?"}]
    assert "<|assistant|></think>4<|user|>3+3?<|assistant|><think>" in t.render(turn)
