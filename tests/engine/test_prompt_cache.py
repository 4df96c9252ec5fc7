"""The prompt cache (prompt_store.PromptCache, serve --prompt-cache): a request continues the KV cache at
the prefix its prompt shares with the last request's tokens, gives the tokens the whole prompt
gives, claims no rows a failed forward may have half written, and on a model with recurrent state
(kimi-k3's KDA) continues only a cache that is wholly a prefix of the new prompt.
The prompt store (prompt_store.py, serve --prompt-cache-mib): conversations taking turns each
continue their own rows, copied back bit for bit; least recently used out for the byte budget; a
failed request stores nothing; recurrent state stored whole, continued only as a whole prefix.
The openai-client tests (two-turn chat, cached_tokens, cancel) are in server/test_openai_client.py."""

from __future__ import annotations

import threading

import pytest
import torch

from bench_script import load_bench_script

from sparkd.engine.errors import EngineError
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.prompt_store import MIB, PromptCache, PromptStore, common_prefix, parse_store_mib
from sparkd.engine.runtime import Engine, GenerationRequest, MemoryPlanError
from sparkd.engine.sampler import SamplingParams
from sparkd.engine.server.metrics import EngineMetrics

GREEDY = SamplingParams(temperature=0.0)
# the bench measures the same gap on the 12-layer model (docs/performance.md, prefix13)
continued_gap = load_bench_script("gpu_box/prompt_cache_bench.py").continued_gap
# A continued prompt's last-token logits against the whole prompt's, over the largest |logit|:
# 0 measured on the CPU (the tiny models) and on the H200's tiny qwen3moe (the GPU test below). On the
# H200 the reply's rows come from the decode step (its own kernels and activation rounding) and the
# last token's from a 1-row forward: 0.013-0.052 on the 12-layer random qwen3-30b-a3b model
# (docs/performance.md, session 13, prefix13); a wrong or stale row gives differences of the logits' size.
BOUND = 1e-3
GPU_BOUND = 0.1


def test_reusable_is_the_common_prefix_less_the_last_token_unless_its_logits_are_kept():
    held = PromptCache()
    assert held.reusable([1, 2, 3]) == 0  # nothing claimed
    held.written(held.begin([]), [1, 2, 3, 4], [1, 2, 3], torch.zeros(5))  # prompt 1,2,3 then fed 4
    assert held.reusable([1, 2, 3, 4, 5]) == 4
    assert held.reusable([1, 2, 9, 4]) == 2  # diverges mid-way
    assert held.reusable([1, 2]) == 1  # shorter: the last token runs again for its logits
    assert held.reusable([1, 2, 3]) == 3  # the same prompt: its kept logits
    assert held.reusable([1, 2, 3, 4]) == 3  # fed 4's logits were not kept
    assert held.reusable([1, 2, 3, 4, 5], rewind_limit=0) == 4  # wholly a prefix
    assert held.reusable([1, 2, 3], rewind_limit=0) == 0  # would rewind past fed 4
    assert held.reusable([1, 2, 3], rewind_limit=1) == 3  # one position back: within a ring's limit
    held.begin(held.tokens)  # rows being written: nothing claimed until written()
    assert held.reusable([1, 2, 3, 4, 5]) == 0


def test_common_prefix_finds_the_first_difference_in_any_chunk():
    a = list(range(1000))
    for k in (0, 1, 255, 256, 257, 511, 999):  # chunk edges of the default 256 and a small chunk
        b = a[:k] + [-1] + a[k + 1:]
        assert common_prefix(a, b) == common_prefix(a, b, chunk=3) == k
    assert common_prefix(a, a) == 1000 and common_prefix(a, a[:700]) == common_prefix(a[:700], a) == 700
    assert common_prefix(a, tuple(a[:300]) + (5,)) == 300 and common_prefix([], a) == 0


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """arch -> (prompt cache on with the store (the default), off, on without the store (-mib 0))
    Engines of a tiny resident model on the CPU."""
    made = {}
    for arch in ("qwen3moe", "kimi-k3"):
        path = write_model(tmp_path_factory.mktemp(arch) / "m.gguf", plan(TINY[arch], "Q8_0"), seed=1)[0]
        made[arch] = [Engine(path, ctx=64, threads=1, resident=True, prompt_cache=on, prompt_store_bytes=store)
                      for on, store in ((True, None), (False, None), (True, 0))]
        for e in made[arch]:
            e.load()
    yield made
    for pair in made.values():
        for e in pair:
            e.close()


def _run(engine, ids, n=4, cancel=None) -> tuple[list[int], int]:
    req = GenerationRequest(list(ids), n, GREEDY)
    return list(engine.generate(req, cancel or threading.Event())), req.cached_tokens


@pytest.mark.parametrize("arch", ["qwen3moe", "kimi-k3"])
def test_turns_reuse_the_prefix_and_give_the_whole_prompts_tokens(engines, arch, monkeypatch):
    on, off, _ = engines[arch]
    rewind = on._cache.rewind_limit != 0
    assert rewind == (arch != "kimi-k3")
    turn1 = list(range(5, 25))
    reply, cached = _run(on, turn1)
    assert cached == 0 and reply == _run(off, turn1)[0]
    turn2 = turn1 + reply + [7, 8, 9]  # the chat's next turn: the cache holds turn1 + reply
    # (n, prompt, cached with a rewindable cache, with recurrent state)
    cases = [(4, turn2, 24, 24),
             (4, turn2, 23 + 4, 0),  # the same again: prompt + fed reply held, the last token re-run
             (1, turn2, 27, 0),  # ... the kept logits: every row of the prompt and its last token's
             (4, turn1[:12] + [99, 98], 12, 0),  # diverges mid-way
             (4, turn1[:12], 11, 0)]  # shorter: the held cache is longer than it
    monkeypatch.setattr(on, "_store", None)  # the live cache alone (the store's turns: the tests below)
    for n, ids, want, want_recurrent in cases:
        got, cached = _run(on, ids, n)
        assert cached == (want if rewind else want_recurrent), (ids, cached)
        assert got == _run(off, ids, n)[0], ids
    # every request from an empty cache starts from a reset state: turn 1 again, after all that, as at first
    assert _run(off, turn1)[0] == reply


def _break_prompt(engine, monkeypatch):
    """engine's prompt forward writes its rows, then fails (monkeypatch.undo() mends it)."""
    real_prompt = engine._prompt

    def broken_prompt(tokens, last=False):
        real_prompt(tokens, last=last)
        raise RuntimeError("device lost")
    broken_prompt.continues = real_prompt.continues
    monkeypatch.setattr(engine, "_prompt", broken_prompt)


@pytest.mark.parametrize("where", ["prompt", "step"])
def test_a_failed_forward_claims_no_rows(engines, monkeypatch, where):
    for arch in ("qwen3moe", "kimi-k3"):
        _, off, on = engines[arch]  # the live cache alone; with the store: the store's test below
        turn1 = list(range(3, 19))
        _run(on, turn1)
        if where == "prompt":  # the continued prompt fails after writing its rows (and the KDA state)
            _break_prompt(on, monkeypatch)
        else:  # the decode step does
            real = on._step.__class__.__call__

            def broken(self, token):
                real(self, token)
                raise RuntimeError("device lost")
            monkeypatch.setattr(on._step.__class__, "__call__", broken)
            monkeypatch.setattr(on._step, "device_argmax", False)
        with pytest.raises(RuntimeError, match="device lost"):
            _run(on, turn1 + [5, 6, 7, 8])
        monkeypatch.undo()
        assert on._held.tokens is None
        got, cached = _run(on, turn1 + [5, 6])
        assert cached == 0 and got == _run(off, turn1 + [5, 6])[0]


def test_a_cancelled_request_keeps_what_it_wrote(engines):
    on, off, _ = engines["qwen3moe"]
    cancel = threading.Event()
    req = GenerationRequest(list(range(30, 42)), 8, GREEDY)
    tokens = on.generate(req, cancel)
    first = [next(tokens), next(tokens)]
    cancel.set()
    assert list(tokens) == []  # the second token's step ran, then the cancel ended it
    assert on._held.tokens == list(range(30, 42)) + first
    ids = list(range(30, 42)) + first + [11]
    got, cached = _run(on, ids)
    assert cached == 14 and got == _run(off, ids)[0]


def test_continued_logits_are_within_the_bound(engines):
    on, _, _ = engines["qwen3moe"]
    ids = torch.tensor([(7 * i + 3) % 400 + 10 for i in range(40)])
    assert continued_gap(on, ids, 25) <= BOUND


def _turns(engine, convs: list[list[int]], rounds: int, first: int = 0, n: int = 4) -> list[list[tuple]]:
    """Conversations (numbered from first) taking turns: each round, each conversation's next prompt
    (its last prompt + reply + 3 new tokens) -> per round [(reply, cached, the prompt's last logits)]."""
    out, prompts = [], [list(c) for c in convs]
    for r in range(rounds):
        row = []
        for i, ids in enumerate(prompts):
            got, cached = _run(engine, ids, n)
            row.append((got, cached, engine._held.logits))
            prompts[i] = ids + got + [40 + 3 * r + first + i, 7, 9]
        out.append(row)
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "kimi-k3"])
def test_conversations_taking_turns_each_continue_their_own(engines, arch):
    """Two conversations (sharing a 6-token system prompt) alternate: with the store both continue
    their whole last turn from round 2 on, with the logits and tokens the one-cache path gives for the
    same turn (the conversation alone, one request after the other: bit for bit on the CPU); without it
    (-mib 0) each turn reruns all but the shared prefix. kimi-k3's KDA state is stored whole at the
    conversation's end, so its turns continue too; a prompt diverging inside a stored kimi-k3
    conversation restores nothing (the state of a shorter prefix is not kept)."""
    store, off, single = engines[arch]
    rewind = store._cache.rewind_limit != 0
    system = [3, 1, 4, 1, 5, 9]
    convs = [system + list(range(10, 22)), system + list(range(30, 40))]
    for e in (store, single):
        e._cache.reset(), e._held.begin([])  # no rows from other tests
    saved = store.prompt_store_stats()
    both, one = _turns(store, convs, 3), _turns(single, convs, 3)
    for r in (1, 2):
        for i in (0, 1):
            got, cached, logits = both[r][i]
            prev_reply, prev_len = both[r - 1][i][0], len(convs[i]) + (r - 1) * 7
            assert cached == prev_len + len(prev_reply), (r, i)
            assert one[r][i][1] == (len(system) if rewind else 0)  # the other conversation is in the way
            if r == 1:
                continue
            # the one cache, no other conversation between (after conversation 0's first prompt for 1: its
            # system prompt rows came from there, and a prompt's chunks decide the bits)
            single._cache.reset(), single._held.begin([])
            if i:
                _run(single, convs[0])
            alone = _turns(single, [convs[i]], r + 1, i)[r][0]
            assert alone[1] == cached and got == alone[0] and torch.equal(logits, alone[2]), (r, i)
    stats = store.prompt_store_stats()
    assert stats["restores"] - saved["restores"] == 4 and stats["evictions"] == saved["evictions"]
    for i, c in enumerate(convs):  # a newer copy drops an older one it covers (its prefix), unless recurrent
        assert sum(e.held.tokens[:len(c)] == c for e in store._store._entries) == (1 if rewind else 3 - i)
    # the stored rows give what the whole prompt gives
    last = convs[0] + both[0][0][0] + [40, 7, 9] + both[1][0][0] + [43, 7, 9]
    assert _run(store, last + [5, 5])[0] == _run(off, last + [5, 5])[0]
    diverged = convs[1][:10] + [99]  # inside conversation 1 (in the store now)
    got, cached = _run(store, diverged)
    assert cached == (10 if rewind else 0) and got == _run(off, diverged)[0]


def test_the_store_evicts_least_recently_used_by_bytes(engines):
    """A budget of two conversations' rows: the third conversation pushes out the oldest, whose next
    turn then runs whole; an entry over the whole budget is not stored."""
    on, off, _ = engines["qwen3moe"]
    n_vocab = on.cfg.n_vocab
    convs = [list(range(10 + 20 * i, 26 + 20 * i)) for i in range(3)]  # 16 tokens + 4 fed: 20 rows each
    one = on._cache.prefix_bytes(20) + 4 * n_vocab
    on._store = PromptStore(2 * one + one // 2)
    try:
        on._held.begin([])
        replies = [_run(on, c)[0] for c in convs]  # 0 then 1 saved; at 2's start 0 and 1 stored
        assert on.prompt_store_stats() == {"bytes": 2 * one, "entries": 2, "saves": 2, "restores": 0, "evictions": 0}
        _run(on, convs[1] + replies[1])  # restores 1; saves 2 and evicts 0 (least recently used)
        stats = on.prompt_store_stats()
        assert stats["evictions"] == 1 and stats["bytes"] == 2 * one and stats["restores"] == 1
        got, cached = _run(on, convs[0] + replies[0] + [5])
        assert cached == 0 and got == _run(off, convs[0] + replies[0] + [5])[0]  # evicted: ran whole
        on._store = PromptStore(one - 1)
        _run(on, convs[2])
        assert on.prompt_store_stats()["entries"] == 0  # did not fit
    finally:
        on._store = PromptStore(on.memory_plan()["prompt_store"])


def test_a_failed_request_stores_nothing(engines, monkeypatch):
    on, off, _ = engines["qwen3moe"]
    on._held.begin([])
    _run(on, list(range(3, 19)))
    _break_prompt(on, monkeypatch)
    failed = list(range(50, 62))
    with pytest.raises(RuntimeError, match="device lost"):
        _run(on, failed)  # gives up the first conversation: saved (its rows were claimed)
    monkeypatch.undo()
    saves = on.prompt_store_stats()["saves"]
    got, cached = _run(on, failed + [1])  # the failed rows: not continued, not stored
    assert cached == 0 and got == _run(off, failed + [1])[0]
    assert on.prompt_store_stats()["saves"] == saves
    assert not any(e.held.tokens[:12] == failed for e in on._store._entries)


def test_off_and_no_store_keep_the_single_cache(engines, tmp_path):
    on, off, single = engines["qwen3moe"]
    assert single._store is None and single.prompt_store_stats() is None and single.memory_plan()["prompt_store"] == 0
    assert off._store is None and off.memory_plan()["prompt_store"] == 0
    assert on.memory_plan()["prompt_store"] == 2048 * MIB  # auto without a budget
    with pytest.raises(EngineError, match="could not use a prompt store of -1 bytes: it must be 0 or more"):
        Engine(tmp_path / "m.gguf", prompt_store_bytes=-1)
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=1)[0]
    need = Engine(path, ctx=64, resident=True, prompt_store_bytes=0)
    need.load()
    total = sum(v for k, v in need.memory_plan().items() if k != "workspace")  # measured after the load
    need.close()
    with pytest.raises(MemoryPlanError, match=r"\+ prompt store 1\.0 MiB = .* lower --ctx or --prompt-cache-mib"):
        Engine(path, ctx=64, resident=True, budget_bytes=total + MIB // 2, prompt_store_bytes=MIB).load()
    fits = Engine(path, ctx=64, resident=True, budget_bytes=total + 1000)  # auto: only what the budget leaves
    fits.load()
    assert fits.memory_plan()["prompt_store"] == 1000
    fits.close()


def test_metrics_show_the_prompt_store():
    stats = {"bytes": 5 << 20, "entries": 2, "saves": 7, "restores": 4, "evictions": 1}
    text = EngineMetrics(lambda: None, dict, store_stats=lambda: stats).render().decode()
    for line in ("sparkd_engine_prompt_store_bytes 5.24288e+06", "sparkd_engine_prompt_store_entries 2.0",
                 "sparkd_engine_prompt_store_saves_total 7.0", "sparkd_engine_prompt_store_restores_total 4.0",
                 "sparkd_engine_prompt_store_evictions_total 1.0"):
        assert line in text
    assert "prompt_store" not in EngineMetrics(lambda: None, dict).render().decode()  # no store: absent


@pytest.mark.gpu
def test_on_the_gpu_turns_give_the_whole_prompts_tokens(tmp_path):
    """CUDA resident with graphs (StaticDecode, PromptForward): turn 2 continues the graph-written
    cache through a continued prompt graph (its 4 new tokens padded to 64, attention over 128 rows),
    and gives the tokens --prompt-cache off gives (the whole prompt's graph); the logits within the
    bound."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    on, off = (Engine(path, ctx=128, device="cuda", resident=True, cuda_graphs="on", prompt_cache=c)
               for c in (True, False))
    for e in (on, off):
        e.load()
    try:
        turn1 = [(5 * i + 1) % 300 + 2 for i in range(40)]
        reply, _ = _run(on, turn1, 8)
        assert reply == _run(off, turn1, 8)[0]
        turn2 = turn1 + reply + [17, 18, 19, 20]
        got, cached = _run(on, turn2, 8)
        assert cached == 48 and got == _run(off, turn2, 8)[0]
        assert (64, 128) in on._prompt._graphs and not on._prompt.failed
        assert _run(on, turn2, 8) == (got, 52)  # the same request again: every row and the kept logits
        gap = continued_gap(on, torch.tensor(turn2), 40)
        print(f"continued logits gap {gap:.3g}")
        assert gap <= GPU_BOUND
    finally:
        on.close()
        off.close()


@pytest.mark.gpu
def test_on_the_gpu_conversations_taking_turns_continue_their_own(tmp_path):
    """CUDA resident with graphs: the store's device copies restored in place (the graphs hold the
    cache's addresses) continue through continued prompt graphs, with the tokens --prompt-cache off
    gives and the logits the one cache gives for the same turns (the conversation alone)."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    store, off, single = (Engine(path, ctx=256, device="cuda", resident=True, cuda_graphs="on", prompt_cache=c,
                                 prompt_store_bytes=b) for c, b in ((True, None), (False, None), (True, 0)))
    for e in (store, off, single):
        e.load()
    try:
        convs = [[(5 * i + 1) % 300 + 2 for i in range(40)], [(7 * i + 2) % 300 + 2 for i in range(33)]]
        both = _turns(store, convs, 3, n=8)
        for r in (1, 2):
            for i in (0, 1):
                got, cached, logits = both[r][i]
                assert cached >= len(convs[i]) + (r - 1) * 11, (r, i)  # the last turn and its fed reply
                single._cache.reset(), single._held.begin([])
                alone = _turns(single, [convs[i]], r + 1, i, n=8)[r][0]
                gap = float((logits - alone[2]).abs().max() / alone[2].abs().max())
                print(f"round {r} conversation {i}: cached {cached}, logits gap to the one cache {gap:.3g}")
                assert alone[1] == cached and got == alone[0] and gap <= GPU_BOUND, (r, i)
                whole = _turns(off, [convs[i]], r + 1, i, n=8)[r][0]
                assert got == whole[0] and whole[1] == 0
        assert store.prompt_store_stats()["restores"] == 4 and not store._prompt.failed
        assert all(t.is_cuda for e in store._store._entries for t in e.saved)
    finally:
        for e in (store, off, single):
            e.close()


def test_serve_prompt_cache_flag(capsys):
    from sparkd.engine.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "m.gguf"]).prompt_cache == "on"
    assert parser.parse_args(["serve", "m.gguf", "--prompt-cache", "off"]).prompt_cache == "off"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "m.gguf", "--prompt-cache", "maybe"])
    assert exit_.value.code == 2 and "--prompt-cache: invalid choice: 'maybe'" in capsys.readouterr().err
    assert parser.parse_args(["serve", "m.gguf"]).prompt_cache_mib == "auto"
    assert parse_store_mib("auto") is None and parse_store_mib("0") == 0 and parse_store_mib("512") == 512 * MIB
    for bad in ("-1", "1.5", "lots"):
        with pytest.raises(EngineError, match=rf"could not use --prompt-cache-mib {bad}: it takes MiB \(0 or more; "
                                              r"0: the live cache only\) or auto"):
            parse_store_mib(bad)
    from sparkd.engine.server.serve import _check
    with pytest.raises(EngineError, match="could not use --prompt-cache-mib 64 with --prompt-cache off"):
        _check(parser.parse_args(["serve", "m.gguf", "--prompt-cache", "off", "--prompt-cache-mib", "64"]))
