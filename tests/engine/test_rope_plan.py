"""The memory plan's rope tables (streaming/plan.rope_bytes): the cos and sin of every position up to the context that
the caches share (KVCache.rope_table), one pair a rope the layers take. Left out of the plan before session 38:
DeepSeek V4 Flash's two ropes at 1M positions hold 0.54 GB (bench/plan_shapes.py)."""

import dataclasses

import pytest
import torch

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model
from sparkd.engine.streaming.plan import Budget, make_plan, rope_bytes

CTX = 300


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "gemma3", "deepseek2", "deepseek4", "kimi-k3"])
def test_the_plan_counts_the_rope_tables_a_forward_makes(tmp_path, arch):
    """Every table the caches hold after a forward at CTX positions, against the plan's term (Gemma 3 and DeepSeek
    V4 take two ropes, Kimi K3's nope-only MLA none, the others one)."""
    path = write_model(tmp_path / "m.gguf", plan(dataclasses.replace(TINY[arch], n_ctx=4096), "F32"), seed=1)[0]
    m = load_model(path)
    try:
        m.net(torch.tensor([1, 2, 3]), m.net.new_cache(CTX))
        tables = [t for pair in m.net.rope_tables.values() for t in pair]
        assert rope_bytes(m.cfg, CTX) == sum(t.nbytes for t in tables)
        assert len(tables) == {"gemma3": 4, "deepseek4": 4, "kimi-k3": 0}.get(arch, 2)
    finally:
        m.close()


def test_the_plan_holds_the_rope_tables_in_its_total(tmp_path):
    """make_plan's term, in the host's total on the CPU (and in describe), growing with the context."""
    path = write_model(tmp_path / "m.gguf", plan(dataclasses.replace(TINY["gemma3"], n_ctx=1 << 16), "F32"), seed=1)[0]
    with GGUFModel.open(path) as g:
        cfg = config_of(g)
        short, long = (make_plan(g, cfg, Budget(1 << 34, "test"), ctx, runtime_bytes=0) for ctx in (1024, 1 << 16))
    assert long.rope_bytes == 64 * short.rope_bytes > 0
    assert long.total_bytes - dataclasses.replace(long, rope_bytes=0).total_bytes == long.rope_bytes
    assert "rope tables" in long.describe() and long.as_dict()["rope_bytes"] == long.rope_bytes
