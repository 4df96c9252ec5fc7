"""A resident model's prompt in chunks the memory left after the load holds (prompt_chunks.py): the chunk rule against
the plan's workspace count, and an Engine whose budget leaves less than a long prompt's whole workspace running it in
chunks within its reserve (every tensor tracked op by op, live_bytes.LiveBytes) to the tokens the whole prompt gives.
Before session 39 a resident prompt ran whole: this test's long prompt held [2, 3000, 3000] scores at once."""

import dataclasses
import threading

import pytest
import torch

from live_bytes import LiveBytes
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.prompt_chunks import MIN_CHUNK_TOKENS, chunk_tokens, reserved_workspace, room_bytes
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import SamplingParams
from sparkd.engine.streaming.plan import runtime_rss_bytes, workspace_bytes

CTX, PROMPT = 4096, 3000
MIB = 1 << 20


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    spec = dataclasses.replace(TINY["qwen3moe"], n_ctx=CTX)
    return write_model(tmp_path_factory.mktemp("chunks") / "m.gguf", plan(spec, "Q8_0"), seed=2)[0]


@pytest.fixture(scope="module")
def cfg(path):
    g = GGUFModel.open(path)
    try:
        return config_of(g)
    finally:
        g.close()


def test_the_chunk_is_the_whole_prompt_or_the_largest_power_of_two_the_room_holds(cfg):
    whole = workspace_bytes(cfg, PROMPT, PROMPT)
    assert chunk_tokens(cfg, 0, PROMPT, whole) == PROMPT
    for room in (whole - 1, workspace_bytes(cfg, PROMPT, 256), workspace_bytes(cfg, PROMPT, 100)):
        got = chunk_tokens(cfg, 0, PROMPT, room)
        assert got & (got - 1) == 0 and got < PROMPT  # a power of two
        assert workspace_bytes(cfg, PROMPT, got) <= room < workspace_bytes(cfg, PROMPT, 2 * got)
    assert chunk_tokens(cfg, 0, PROMPT, workspace_bytes(cfg, PROMPT, 256)) == 256
    # the positions the prompt reaches count: the same 1000 tokens after 3000 cached take smaller chunks
    room = workspace_bytes(cfg, 1000, 1000)
    assert chunk_tokens(cfg, 0, 1000, room) == 1000 and chunk_tokens(cfg, 3000, 1000, room) < 1000
    assert chunk_tokens(cfg, 0, PROMPT, 0) == MIN_CHUNK_TOKENS and chunk_tokens(cfg, 0, 5, 0) == 5
    assert reserved_workspace(cfg, CTX, 0) == (MIN_CHUNK_TOKENS, workspace_bytes(cfg, CTX, MIN_CHUNK_TOKENS))
    assert reserved_workspace(cfg, CTX, workspace_bytes(cfg, CTX, 256)) == (256, workspace_bytes(cfg, CTX, 256))


def test_the_room_is_the_budget_less_what_the_process_holds():
    rss = runtime_rss_bytes()
    got = room_bytes("cpu", rss + 500 * MIB, held_bytes=100 * MIB)
    assert 350 * MIB < got <= 400 * MIB  # the process may grow a little between the two reads


def prompt_run(engine: Engine, ids: list[int]) -> tuple[list[int], int]:
    """(the first 4 greedy tokens after ids, the bytes the request held at its peak beyond the loaded model)."""
    held = list(engine.net.parameters()) + list(engine.net.buffers()) + engine._cache.position_rows()
    held += [t for tables in engine.net.rope_tables.values() for t in tables]
    req = GenerationRequest(ids, 4, SamplingParams(temperature=0.0))
    with LiveBytes(held) as live:
        tokens = list(engine.generate(req, threading.Event()))
    return tokens, live.peak


def test_a_long_prompt_on_a_resident_model_runs_in_the_chunks_its_reserve_holds(path, cfg):
    ids = torch.randint(1, 200, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    roomy = Engine(path, ctx=CTX, resident=True, prompt_cache=False)
    roomy.load()
    try:
        assert roomy.memory_plan()["workspace"] == workspace_bytes(cfg, CTX, CTX)  # GBs free: a whole context
        want, whole_peak = prompt_run(roomy, ids)
    finally:
        roomy.close()
    assert whole_peak > workspace_bytes(cfg, PROMPT, PROMPT) / 3  # the whole prompt's scores, at once
    reserve = workspace_bytes(cfg, CTX, 256)  # a budget that leaves room for 256-token chunks at 4096 positions
    lines = []
    tight = Engine(path, ctx=CTX, resident=True, prompt_cache=False, log=lines.append,
                   budget_bytes=runtime_rss_bytes() + reserve + workspace_bytes(cfg, CTX, 300) // 2)
    tight.load()
    try:
        got = tight.memory_plan()["workspace"]
        assert got == reserve, (got, reserve)
        assert any("a prompt filling the 4096 positions runs in chunks of 256 tokens" in x for x in lines), lines
        tokens, peak = prompt_run(tight, ids)
    finally:
        tight.close()
    assert tokens == want
    assert peak <= got < whole_peak, (peak, got, whole_peak)


@pytest.mark.gpu
def test_on_the_gpu_the_room_counts_what_the_allocator_holds_unused():
    """Freed tensors stay in torch's allocator (the device's free memory drops): still room for a prompt's chunk."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    before = room_bytes("cuda", None)
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    held = room_bytes("cuda", None)
    del x
    after = room_bytes("cuda", None)
    assert abs(before - after) < 64 * MIB and abs(before - held - (1 << 30)) < 64 * MIB, (before, held, after)


def test_a_budget_the_load_leaves_no_room_in_warns_and_still_serves(path, cfg):
    """A budget below what the process holds after the load: the smallest chunk's workspace reserved, a WARNING that
    says what to do, and a long prompt still runs (in 16-token chunks) to the tokens the whole prompt gives."""
    ids = torch.randint(1, 200, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    lines = []
    starved = Engine(path, ctx=CTX, resident=True, prompt_cache=False, log=lines.append,
                     budget_bytes=runtime_rss_bytes() // 2)
    roomy = Engine(path, ctx=CTX, resident=True, prompt_cache=False)
    starved.load()
    roomy.load()
    try:
        assert starved.memory_plan()["workspace"] == workspace_bytes(cfg, CTX, MIN_CHUNK_TOKENS)
        assert any(x.startswith(f"WARNING: a prompt of {CTX} tokens needs") and x.endswith(
            "is free after the load; lower --ctx or raise the budget") for x in lines), lines
        assert prompt_run(starved, ids)[0] == prompt_run(roomy, ids)[0]
    finally:
        starved.close()
        roomy.close()
