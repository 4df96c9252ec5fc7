"""The prompt cache (runtime.PromptCache, serve --prompt-cache): a request continues the KV cache at
the prefix its prompt shares with the last request's tokens, gives the tokens the whole prompt
gives, claims no rows a failed forward may have half written, and on a model with recurrent state
(kimi-k3's KDA) continues only a cache that is wholly a prefix of the new prompt.
The openai-client tests (two-turn chat, cached_tokens, cancel) are in server/test_openai_client.py."""

from __future__ import annotations

import threading

import pytest
import torch

from bench_script import load_bench_script

from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.runtime import Engine, GenerationRequest, PromptCache
from sparkd.engine.sampler import SamplingParams

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
    assert held.reusable([1, 2, 3, 4, 5], rewindable=False) == 4  # wholly a prefix
    assert held.reusable([1, 2, 3], rewindable=False) == 0  # would rewind past fed 4
    held.begin(held.tokens)  # rows being written: nothing claimed until written()
    assert held.reusable([1, 2, 3, 4, 5]) == 0


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """arch -> (prompt cache on, off) Engines of a tiny resident model on the CPU."""
    made = {}
    for arch in ("qwen3moe", "kimi-k3"):
        path = write_model(tmp_path_factory.mktemp(arch) / "m.gguf", plan(TINY[arch], "Q8_0"), seed=1)[0]
        pair = []
        for on in (True, False):
            e = Engine(path, ctx=64, threads=1, resident=True, prompt_cache=on)
            e.load()
            pair.append(e)
        made[arch] = pair
    yield made
    for pair in made.values():
        for e in pair:
            e.close()


def _run(engine, ids, n=4, cancel=None) -> tuple[list[int], int]:
    req = GenerationRequest(list(ids), n, GREEDY)
    return list(engine.generate(req, cancel or threading.Event())), req.cached_tokens


@pytest.mark.parametrize("arch", ["qwen3moe", "kimi-k3"])
def test_turns_reuse_the_prefix_and_give_the_whole_prompts_tokens(engines, arch):
    on, off = engines[arch]
    rewind = on._cache.rewindable
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
    for n, ids, want, want_recurrent in cases:
        got, cached = _run(on, ids, n)
        assert cached == (want if rewind else want_recurrent), (ids, cached)
        assert got == _run(off, ids, n)[0], ids
    # every request from an empty cache starts from a reset state: turn 1 again, after all that, as at first
    assert _run(off, turn1)[0] == reply


@pytest.mark.parametrize("where", ["prompt", "step"])
def test_a_failed_forward_claims_no_rows(engines, monkeypatch, where):
    for arch in ("qwen3moe", "kimi-k3"):
        on, off = engines[arch]
        turn1 = list(range(3, 19))
        _run(on, turn1)
        if where == "prompt":  # the continued prompt fails after writing its rows (and the KDA state)
            real_prompt = on._prompt

            def broken_prompt(tokens, last=False):
                real_prompt(tokens, last=last)
                raise RuntimeError("device lost")
            broken_prompt.continues = real_prompt.continues
            monkeypatch.setattr(on, "_prompt", broken_prompt)
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
    on, off = engines["qwen3moe"]
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
    on, _ = engines["qwen3moe"]
    ids = torch.tensor([(7 * i + 3) % 400 + 10 for i in range(40)])
    assert continued_gap(on, ids, 25) <= BOUND


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


def test_serve_prompt_cache_flag(capsys):
    from sparkd.engine.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "m.gguf"]).prompt_cache == "on"
    assert parser.parse_args(["serve", "m.gguf", "--prompt-cache", "off"]).prompt_cache == "off"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "m.gguf", "--prompt-cache", "maybe"])
    assert exit_.value.code == 2 and "--prompt-cache: invalid choice: 'maybe'" in capsys.readouterr().err
