"""The static-shape decode step (the one CUDA graphs capture) against the eager step, and the
--cuda-graphs choice. On the CPU the static step runs without capture: same shapes and device
positions, so what the graph replays is checked here; the replay itself runs on the GPU box.

Not bit-equal: the static step attends over the whole bucket (keys past the position masked to
-inf, weight exactly 0), and a longer softmax sum or matmul reduction may add in another order:
within 1e-6 relative (measured: 1.0e-7 to 3.7e-7 over 12 steps)."""

import json
import subprocess
import threading

import pytest
import torch

from sparkd.engine import cli, cuda_graphs, graph_capture, prompt_graphs
from sparkd.engine.cuda_graphs import StaticDecode, buckets, graph_blocker, use_graphs
from sparkd.engine.prompt_graphs import PromptForward, parse_prompt_graphs, prompt_bucket, prompt_buckets, \
    prompt_forward, prompt_last
from sparkd.engine.errors import EngineError
from sparkd.engine.layers import attention, linear
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import Sampler, SamplingParams
from sparkd.engine.server.metrics import EngineMetrics
from engine_cli import run_engine

# GQA, MLA, sparse MLA, KDA with MLA and AttnRes, DeepSeek V4's windowed attention with compressed entries
ARCHS = ["qwen3moe", "glm4moe", "gpt-oss", "llama", "gemma3", "deepseek2", "glm-dsa", "kimi-k3", "deepseek4"]
PROMPT = [1, 7, 42, 3, 99]
STEPS = 12  # positions 5..16: crosses the 8 and 16 buckets of first_bucket=4
BOUND = 1e-6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    archs = ARCHS
    return {a: write_model(d / f"{a}.gguf", plan(TINY[a], "F32"), seed=3)[0] for a in archs}


def decode(net, step, n: int, ctx: int) -> tuple[torch.Tensor, list[int]]:
    """Greedy decode after PROMPT; step(cache) gives the per-token function."""
    cache = net.new_cache(ctx)
    logits = net(torch.tensor(PROMPT), cache)[-1:]
    one, rows, out = step(cache), [], []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = one(out[-1])
        rows.append(logits[-1])
    return torch.stack(rows), out


def test_buckets_double_up_to_the_context():
    assert buckets(1000, 256) == [256, 512, 1000]
    assert buckets(256, 256) == [256]
    assert buckets(100, 256) == [100]


def test_prompt_buckets_pad_at_most_a_quarter():
    assert [prompt_bucket(n) for n in (1, 64, 65, 128, 129, 512, 513, 2000, 2048)] == \
        [64, 64, 80, 128, 160, 512, 640, 2048, 2048]
    assert all(n <= prompt_bucket(n) <= max(64, 1.25 * n) and prompt_bucket(n) % 16 == 0 for n in range(1, 3000))
    assert prompt_buckets(1024) == sorted({prompt_bucket(n) for n in range(1, 1025)})
    assert prompt_buckets(1024)[:6] == [64, 80, 96, 112, 128, 160] and len(prompt_buckets(1024)) == 17


def test_prompt_graphs_flag_values(models, monkeypatch):
    assert [parse_prompt_graphs(v) for v in ("auto", " Lazy", "off")] == ["auto", "lazy", "off"]
    assert parse_prompt_graphs("512,64, 2048,64") == (64, 512, 2048)
    for bad in ("sometimes", "64,,512", "1", "64,2049", ""):
        with pytest.raises(EngineError, match=rf"could not use --prompt-graphs '{bad}': choose one of auto, lazy, "
                                              r"off or prompt lengths separated by commas, 2 to 2048"):
            parse_prompt_graphs(bad)
    # the longest prompt graph follows the prompt attention: 2048 under sdpa (sinks too: session 42), 1024 where
    # scores are kept (SPARKD_PREFILL_ATTENTION=torch)
    m = load_model(models["gpt-oss"])
    try:
        assert prompt_buckets()[-4:] == [1280, 1536, 1792, 2048] and prompt_last() == 2048
        assert PromptForward(m.net, m.net.new_cache(8)).largest == 2048
    finally:
        m.close()
    monkeypatch.setattr(attention, "PREFILL_ATTENTION", "torch")
    assert prompt_buckets()[-1] == prompt_last() == 1024
    with pytest.raises(EngineError, match=r"could not use --prompt-graphs '64,1025': .* 2 to 1024"):
        parse_prompt_graphs("64,1025")
    with pytest.raises(EngineError, match=r"could not use --prompt-graphs 'always'"):
        Engine(models["gemma3"], prompt_graphs="always")
    with pytest.raises(EngineError, match=r"could not use --prompt-graph-margin -1: it must be 0 or more"):
        Engine(models["gemma3"], prompt_graph_margin=-1)
    logged = []
    engine = Engine(models["gemma3"], ctx=16, prompt_graphs="64", log=logged.append)
    engine.load()
    try:  # the CPU runs prompts eagerly
        assert logged == ["--prompt-graphs 64 ignored: prompts run eagerly here"]
        assert engine.prompt_graph_stats() is None
    finally:
        engine.close()


def test_failed_prompt_capture_runs_eagerly_once(models, monkeypatch):
    """A capture that fails (here: the CPU has no CUDA streams; on the GPU, out of memory below)
    gives its bucket up, logged once: that prompt and later ones of the bucket run eagerly, with
    the eager prompt's bits, and no capture is tried again; other buckets still try theirs."""
    tries = []
    monkeypatch.setattr(prompt_graphs, "capture", lambda *a, **k: tries.append(a) or graph_capture.capture(*a, **k))
    m = load_model(models["qwen3moe"])
    try:
        tokens, logged = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(5)]), []
        cache = m.net.new_cache(24)
        want = m.net(tokens, cache, last=True)
        want_next = m.net(tokens[:3], cache, last=True)
        p = PromptForward(m.net, m.net.new_cache(24), first=8, log=logged.append)
        for _ in range(2):
            p.cache.n_past = 0
            assert torch.equal(p(tokens, last=True), want) and p.cache.n_past == 5
        p.cache.n_past = 0
        assert len(tries) == 1 and list(p.failed) == [8] and p.bucket(5) is None and p.bucket(11) == 16
        assert len(logged) == 1 and logged[0].startswith("prompt graph 8 tokens not captured, its prompts run "
                                                         "eagerly: warm-up failed: ")
        assert p.stats() == {"captured": 0, "failed": 1, "pool_bytes": 0}
        p.warm([11])
        assert len(tries) == 2 and sorted(p.failed) == [8, 16]
        p.cache.n_past = 0
        m.net(tokens, p.cache)  # a continued prompt tries its own key once
        for _ in range(2):
            p.cache.n_past = 5
            assert torch.equal(p(tokens[:3], last=True), want_next) and p.cache.n_past == 8
        assert len(tries) == 3 and list(p.failed)[-1] == (8, 24) and p.bucket(3) is None
        assert logged[-1].startswith("continued prompt graph 8 tokens over 24 rows not captured, its prompts "
                                     "run eagerly: warm-up failed: ")
        with pytest.raises(EngineError, match=r"could not capture prompt graphs for 30 tokens: the context is 24"):
            p.warm([11, 30])
        with pytest.raises(EngineError, match=r"could not use a prompt graph margin of -1 bytes: it must be 0 or more"):
            PromptForward(m.net, p.cache, margin=-1)
    finally:
        m.close()


def test_metrics_show_the_prompt_graphs():
    text = EngineMetrics(lambda: None, dict, lambda: {"captured": 3, "failed": 1, "pool_bytes": 5 << 20}).render()
    text = text.decode()
    assert 'sparkd_engine_prompt_graphs{state="captured"} 3.0' in text
    assert 'sparkd_engine_prompt_graphs{state="failed"} 1.0' in text
    assert "sparkd_engine_prompt_graph_pool_bytes 5.24288e+06" in text
    assert "prompt_graph" not in EngineMetrics(lambda: None, dict).render().decode()  # eager prompts: absent


def prompt_then_decode(net, prompt, tokens: list[int], ctx: int, steps: int = 4, head: list[int] = ()):
    """(the prompt's last logits [1, V], the greedy tokens of `steps` eager steps after it, the
    cache's K rows of layer 0 up to the prompt's end); prompt(tokens, cache) runs the prompt's
    forward, after the eager forward of head where given (the prompt then continues the cache)."""
    cache = net.new_cache(ctx)
    if head:
        net(torch.tensor(head), cache)
    logits = prompt(torch.tensor(tokens), cache)
    end = len(head) + len(tokens)
    assert cache.n_past == end
    rows, out = cache.k[0][:end].clone(), []
    nxt = logits
    for _ in range(steps):  # the padding's K/V rows past the prompt must not change these
        out.append(int(nxt[-1].argmax()))
        nxt = net(torch.tensor([out[-1]]), cache)
    return logits, out, rows


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma3"])
def test_padded_prompt_equals_eager_prompt(models, arch):
    """What a prompt graph replays (the prompt padded to its bucket, the last real token's row
    taken by a device index), run eagerly on the CPU: the eager prompt's logits within 1e-6 (float
    matmuls at the bucket's row count may add in another order), the same K rows and the same
    tokens after it."""
    m = load_model(models[arch])
    try:
        for n in (5, 11):  # buckets 8 and 16 (first=8)
            tokens = [(7 * i + 3) % m.cfg.n_vocab for i in range(n)]
            want = prompt_then_decode(m.net, lambda t, c: m.net(t, c, last=True), tokens, 24)
            padded = []
            got = prompt_then_decode(m.net, lambda t, c: padded.append(PromptForward(m.net, c, "padded", first=8))
                                     or padded[-1](t, last=True), tokens, 24)
            assert got[1] == want[1] and got[0].argmax() == want[0].argmax()
            for g, w in ((got[0], want[0]), (got[2], want[2])):
                err = float((g - w).norm() / w.norm())
                assert err < BOUND, f"{arch}, {n} tokens: padded vs eager prompt relative error {err:.2e}"
    finally:
        m.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma3"])
def test_continued_prompt_equals_eager_continuation(models, arch, monkeypatch):
    """What a continued prompt graph replays (the prompt at n_past > 0 padded to its bucket, its
    positions on the device, attention over the span's rows), run eagerly on the CPU against the
    eager continuation: the same bits where the prompt fills its bucket and ends at its span, else
    within 1e-4 (the float GEMMs at the bucket's row count add in another order: ~1e-7, which
    gemma3's tiny random FFN amplifies to 3.9e-5 at 9 tokens padded to 16); the same K rows and tokens
    after it (the padding's rows past the prompt rewritten before they are read); eager where the
    padding would cross the context."""
    m = load_model(models[arch])
    try:
        head = [(5 * i + 2) % m.cfg.n_vocab for i in range(17)]
        for start, n, key in ((8, 8, (8, 16)), (6, 5, (8, 16)), (7, 9, (16, 16)), (12, 6, (8, 24)), (17, 3, None)):
            tokens = [(7 * i + 3) % m.cfg.n_vocab for i in range(n)]
            want = prompt_then_decode(m.net, lambda t, c: m.net(t, c, last=True), tokens, 24, head=head[:start])
            padded = []
            got = prompt_then_decode(m.net, lambda t, c: padded.append(PromptForward(m.net, c, "padded", first=8,
                                                                                     first_span=8))
                                     or padded[-1](t, last=True), tokens, 24, head=head[:start])
            assert padded[-1].spans == [8, 16, 24] and padded[-1]._key(n, True, start) == key
            assert got[1] == want[1] and got[0].argmax() == want[0].argmax()
            if key is None or key == (n, start + n):
                assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), (arch, start, n)
            for g, w in ((got[0], want[0]), (got[2], want[2])):
                err = float((g - w).norm() / w.norm())
                assert err < 1e-4, f"{arch}, {n} tokens at {start}: continued vs eager relative error {err:.2e}"
        p = padded[-1]  # eager: switched off, past largest^2 query x key rows, the prefill attention kernel
        assert PromptForward(m.net, p.cache, "padded", first=8, first_span=8, continued=False)._key(8, True, 8) is None
        assert PromptForward(m.net, p.cache, "padded", first=8, largest=12, first_span=8)._key(6, True, 12) is None
        # a bucket of CONTINUE_SDPA_ROWS or more runs attend_sdpa on CUDA: bucket x span up to largest^2; fewer
        # rows (or SPARKD_CONTINUE_ATTENTION=torch) run attend, its scores bounded by 1024^2
        wide = PromptForward(m.net, m.net.new_cache(4096), "padded")
        assert attention.continue_sdpa(128) and not attention.continue_sdpa(127)
        assert wide.largest == 2048 and wide._key(1024, True, 1024) == (1024, 2048)
        assert wide._key(1024, True, 2048) == (1024, 4096) and wide._key(2048, True, 1024) is None
        assert wide._key(192, True, 3000) == (192, 4096) and wide._key(288, True, 3700) == (320, 4096)
        monkeypatch.setattr(attention, "CONTINUE_SDPA_ROWS", 512)
        assert wide._key(288, True, 3700) is None and wide._key(512, True, 1024) == (512, 2048)
        monkeypatch.setattr(attention, "CONTINUE_ATTENTION", "torch")
        assert not attention.continue_sdpa(2048)
        assert wide._key(1024, True, 1024) is None and wide._key(512, True, 1024) == (512, 2048)
        monkeypatch.setattr(attention, "PREFILL_ATTENTION", "kernel")
        assert p._key(8, True, 8) is None and p._key(8, True, 0) == 8
    finally:
        m.close()


def test_prompt_continues_unless_only_the_whole_prompt_replays(models):
    m = load_model(models["qwen3moe"])
    try:
        cache = m.net.new_cache(24)
        p = PromptForward(m.net, cache, first=8, largest=16, first_span=8)
        # whole 20 > largest: continue; whole 12 and continued 8 at 4 both replay: continue
        assert p.continues(20, 12) and p.continues(12, 4)
        # both replay, but the cache holds less than CONTINUE_MIN_SHARE (1/5) of the prompt: whole, unless "always"
        assert prompt_graphs.CONTINUE_MIN_SHARE == 1 / 5 and not p.continues(11, 2) and p.continues(10, 2)
        assert PromptForward(m.net, cache, first=8, largest=16, first_span=8, rule="always").continues(13, 2)
        with pytest.raises(EngineError, match=r"could not continue prompts by rule 'never': choose one of share, always"):
            PromptForward(m.net, cache, rule="never")
        p.continued = False  # SPARKD_CONTINUE_GRAPHS=0: only the whole prompt replays (prefix13's rule)
        assert not p.continues(12, 4) and p.continues(20, 12)
        assert not PromptForward(m.net, cache, "eager").replays(12) and PromptForward(m.net, cache, "eager").continues(12, 4)
    finally:
        m.close()


def test_prompt_forward_runs_eagerly_where_no_graph_serves(models):
    m = load_model(models["qwen3moe"])
    try:
        cache = m.net.new_cache(12)
        p = PromptForward(m.net, cache, "padded", first=8, largest=10)
        assert [p.bucket(n) for n in (1, 2, 8, 9, 10, 11)] == [None, 8, 8, 12, 12, None]  # 9 and 10: 16 > ctx 12
        assert p.bucket(5, last=False) is None and PromptForward(m.net, cache, "eager").bucket(5) is None
        cache.n_past = 1  # continued: the bucket over the context's span (12 rows x 8 <= largest^2)
        assert p.bucket(5) == 8 and p.replays(5, start=1) is False  # "padded": no graph replays
        cache.n_past = 5
        assert p.bucket(5) is None  # its padding would cross the context (13 rows)
        with pytest.raises(EngineError, match=r"could not run prompts in mode 'fast': choose one of graphs, padded, eager"):
            PromptForward(m.net, cache, "fast")
        assert prompt_forward(m.net, cache, graphs=False).mode == "eager"
    finally:
        m.close()


def test_prompt_forward_follows_the_switch_and_names_mla(models, monkeypatch):
    loaded = {a: load_model(models[a]) for a in ("gemma3", "deepseek2")}
    try:
        net = loaded["gemma3"].net
        assert prompt_forward(net, net.new_cache(8), graphs=True).mode == "graphs"
        monkeypatch.setenv("SPARKD_PREFILL_GRAPHS", "off")
        assert prompt_forward(net, net.new_cache(8), graphs=True).mode == "eager"
        monkeypatch.delenv("SPARKD_PREFILL_GRAPHS")
        logged, net = [], loaded["deepseek2"].net
        assert prompt_forward(net, net.new_cache(8), graphs=True, log=logged.append).mode == "eager"
        assert logged == ["prompts run eagerly: layer 0: MLAttention (prompt graphs run GQA attention only)"]
    finally:
        for m in loaded.values():
            m.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_static_step_equals_eager_step(models, arch):
    m = load_model(models[arch])
    try:
        want, want_ids = decode(m.net, lambda c: lambda t: m.net(torch.tensor([t]), c), STEPS, 32)
        got, got_ids = decode(m.net, lambda c: StaticDecode(m.net, c, graphs=False, first_bucket=4), STEPS, 32)
    finally:
        m.close()
    assert got_ids == want_ids
    err = float((got - want).norm() / want.norm())
    assert err < BOUND, f"{arch}: static vs eager decode logits relative error {err:.2e}"


def test_static_step_refuses_past_the_context(models):
    m = load_model(models["gemma3"])
    try:
        cache = m.net.new_cache(6)
        m.net(torch.tensor(PROMPT), cache)
        step = StaticDecode(m.net, cache, graphs=False, first_bucket=4)
        step(1)
        with pytest.raises(EngineError, match=r"could not extend the KV cache to 7 positions: context is 6"):
            step(2)
        assert cache.n_past == 6 and cache.span is None
    finally:
        m.close()


def test_no_draws_are_prepared_where_the_host_draws(models):
    """prepare_draws without graphs (the CPU): nothing captured, and False: generate warms the host
    sampler instead, which draws the first token there."""
    m = load_model(models["gemma3"])
    try:
        cache = m.net.new_cache(8)
        step = StaticDecode(m.net, cache, graphs=False, first_bucket=4)
        assert step.prepare_draws(SamplingParams(temperature=0.8, seed=1), 8) is False
        assert not step._draws and not step.drawing
    finally:
        m.close()


def test_the_engine_captures_draw_graphs_at_load_only_with_graphs(models, monkeypatch):
    """Engine.load asks the decode step for every path's draw graphs (capture_draws) where the step is
    captured, and only there: not on the CPU (no graphs), not under SPARKD_LOAD_DRAW_GRAPHS=0. With
    graphs forced on here every capture fails (the CPU has none): the steps run eagerly, nothing held.
    The chains' warm (warm_sampling) runs at a graph load only where no draw graph was captured: each
    capture's warm-up already ran its chain."""
    asked, warmed, captured = [], [], []
    real, real_warm = StaticDecode.capture_draws, StaticDecode.warm_sampling
    monkeypatch.setattr(StaticDecode, "capture_draws", lambda self: asked.append(self) or real(self) + captured)
    monkeypatch.setattr(StaticDecode, "warm_sampling", lambda self: warmed.append(self) or real_warm(self))

    def load(graphs: bool, switch: str | None) -> Engine:
        if switch is None:
            monkeypatch.delenv(cuda_graphs.LOAD_DRAW_GRAPHS_ENV, raising=False)
        else:
            monkeypatch.setenv(cuda_graphs.LOAD_DRAW_GRAPHS_ENV, switch)
        monkeypatch.setattr(cuda_graphs, "use_graphs", lambda *args, **kwargs: graphs)
        engine = Engine(models["qwen3moe"], ctx=16, prompt_graphs="off")
        engine.load()
        engine.close()
        return engine

    load(False, None)
    assert asked == [] and warmed == []
    load(True, "0")
    assert asked == [] and len(warmed) == 1
    engine = load(True, None)
    assert len(asked) == 1 and asked[0] is engine._step and asked[0].sampler is not None
    assert not engine._step._draws and not any(isinstance(key, tuple) for key in engine._step.failed)
    assert len(warmed) == 2 and warmed[1] is engine._step  # nothing captured: the warm runs the chains
    captured.append((256, "full", 0.001, 0))  # as a GPU load reports a capture
    load(True, None)
    assert len(asked) == 2 and len(warmed) == 2


def test_failed_step_capture_runs_the_step_eagerly_once(models):
    """A decode capture that fails (here: the CPU has no CUDA graphs; on the GPU, out of memory
    below) gives its bucket up, logged once: the steps and draws give the bits and tokens of the
    same static step without graphs, and no bucket is tried twice. Its draws run eagerly, no draw
    graph tried (one would read the eager step's logits tensor of its capture)."""
    m = load_model(models["qwen3moe"])
    try:
        want, want_ids = decode(m.net, lambda c: StaticDecode(m.net, c, graphs=False, first_bucket=4), STEPS, 32)
        logged, steps = [], []
        got, got_ids = decode(m.net, lambda c: steps.append(StaticDecode(m.net, c, True, 4, log=logged.append))
                              or steps[0], STEPS, 32)
        assert torch.equal(got, want) and got_ids == want_ids
        assert sorted(steps[0].failed) == [8, 16, 32] and not steps[0]._graphs
        assert [line.split(" not captured")[0] for line in logged] == [
            f"decode graph of {span} positions" for span in (8, 16, 32)]
        assert all(", run eagerly from now on: " in line for line in logged)
        hot = SamplingParams(temperature=1.5, seed=11)
        draws = {}
        for graphs in (False, True):
            cache = m.net.new_cache(32)
            m.net(torch.tensor(PROMPT), cache)
            step = StaticDecode(m.net, cache, graphs, 4, log=logged.append)
            assert step.begin_sampling(hot, PROMPT)
            draws[graphs] = [step.next_token(3) for _ in range(6)]
        assert draws[True] == draws[False]
        assert not step._draws and not any(line.startswith("draw graph") for line in logged)
    finally:
        m.close()


def test_graph_blocker_names_the_layer(models):
    loaded = {a: load_model(models[a]) for a in ("gemma3", "glm-dsa", "kimi-k3", "qwen3moe", "deepseek2", "deepseek4")}
    try:
        assert graph_blocker(loaded["gemma3"].net) is None
        assert graph_blocker(loaded["gemma3"].net, streaming=True).startswith("routed experts are streamed")
        # experts dequantized by torch (the CPU store) are not the MoE kernels; deepseek2's, glm-dsa's and kimi-k3's
        # layer 0 is dense (glm-dsa's sparse attention selects on the device, kimi-k3's KDA updates its state in
        # place, deepseek4's compressors write their entries by device position: no reason of their own)
        for arch in ("qwen3moe", "deepseek4"):
            assert graph_blocker(loaded[arch].net).startswith("layer 0: its routed experts run the torch path"), arch
        for arch in ("deepseek2", "glm-dsa", "kimi-k3"):
            assert graph_blocker(loaded[arch].net).startswith("layer 1: its routed experts run the torch path"), arch
        with pytest.raises(EngineError, match=r"could not use --cuda-graphs on: layer 0: its routed experts run the "):
            use_graphs("on", loaded["deepseek4"].net, "cuda")
        logged = []
        assert not use_graphs("auto", loaded["deepseek4"].net, "cuda", log=logged.append)
        assert logged == [f"CUDA graphs off, decoding eagerly: {graph_blocker(loaded['deepseek4'].net)}"]
        assert use_graphs("auto", loaded["gemma3"].net, "cuda")
        assert not use_graphs("auto", loaded["gemma3"].net, "cpu")
        assert not use_graphs("off", loaded["gemma3"].net, "cuda")
        with pytest.raises(EngineError, match=r"could not use --cuda-graphs on: the device is the CPU"):
            use_graphs("on", loaded["gemma3"].net, "cpu")
        with pytest.raises(EngineError, match=r"could not use --cuda-graphs 'yes': choose one of auto, on, off"):
            use_graphs("yes", loaded["gemma3"].net, "cuda")
    finally:
        for m in loaded.values():
            m.close()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_engine(*args, timeout=120)


@pytest.mark.parametrize("cmd", ["generate", "logits"])
def test_cli_flag_errors(models, tmp_path, cmd):
    extra = ["--out", str(tmp_path / "l.npy")] if cmd == "logits" else ["-n", "2"]
    bad = run_cli(cmd, str(models["gemma3"]), "--tokens", "1,2", "--cuda-graphs", "maybe", *extra)
    assert bad.returncode == 2 and "argument --cuda-graphs: invalid choice: 'maybe'" in bad.stderr
    on = run_cli(cmd, str(models["gemma3"]), "--tokens", "1,2", "--cuda-graphs", "on", *extra)
    assert on.returncode == 2
    assert "could not use --cuda-graphs on: the device is the CPU (use --device cuda)" in on.stderr
    assert not (tmp_path / "l.npy").exists()


def test_serve_flag(models):
    bad = run_cli("serve", str(models["gemma3"]), "--cuda-graphs", "always")
    assert bad.returncode == 2 and "argument --cuda-graphs: invalid choice: 'always'" in bad.stderr
    bad = run_cli("serve", str(models["gemma3"]), "--prompt-graphs", "64,4096")
    assert bad.returncode == 2 and "could not use --prompt-graphs '64,4096': choose one of auto" in bad.stderr
    engine = Engine(models["gemma3"], ctx=16, cuda_graphs="on")
    with pytest.raises(EngineError, match=r"could not use --cuda-graphs on: the device is the CPU"):
        engine.load()
    assert not engine.loaded


@pytest.mark.gpu
def test_generate_cli_tokens_equal_with_and_without_graphs(tmp_path):
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    runs = {mode: run_cli("generate", str(path), "--tokens", "1,7,42", "-n", "12", "--device", "cuda",
                          "--resident", "--json", "--cuda-graphs", mode) for mode in ("on", "off")}
    for mode, r in runs.items():
        assert r.returncode == 0, f"--cuda-graphs {mode}: {r.stderr[-2000:]}"
    res = {mode: json.loads(r.stdout.strip().splitlines()[-1]) for mode, r in runs.items()}
    assert res["on"]["tokens"] == res["off"]["tokens"] and res["on"]["tokens"]
    assert (res["on"]["decode_step"], res["off"]["decode_step"]) == ("graphs", "eager")


@pytest.mark.gpu
def test_engine_generate_equal_with_and_without_graphs(tmp_path):
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    tokens = {}
    for mode in ("on", "off"):
        engine = Engine(path, ctx=64, device="cuda", resident=True, cuda_graphs=mode)
        engine.load()
        try:
            req = GenerationRequest([1, 7, 42], 12, SamplingParams(temperature=0.0))
            tokens[mode] = list(engine.generate(req, threading.Event()))
        finally:
            engine.close()
    assert tokens["on"] == tokens["off"] and tokens["on"]


# the models replayed on the GPU: (their plan, the bound of the replay's logits against the plain eager decode's)
REPLAYED = {
    "qwen3moe-Q8_0": (lambda: plan(TINY["qwen3moe"], "Q8_0"), 1e-2),
    "qwen3moe-Q4_K": (lambda: plan(TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256), "Q4_K"), 1e-2),
    "kimi-k3": (lambda: plan(TINY["kimi-k3"], "F32", [("_exps", "Q8_0")]), 1e-4),
    "deepseek4": (lambda: plan(TINY["deepseek4"], "F32", [("_exps", "Q8_0")]), 1e-4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(REPLAYED))
def test_graph_replay_equals_eager_on_cuda(tmp_path, model):
    """The captured graphs give the same bits as the same static step run eagerly, over a run that
    crosses bucket boundaries (first_bucket=4: spans 8, 16, 32); and the greedy tokens of the
    plain eager decode. Qwen3's logits only within 1e-2: eager T=1 attends in torch, the static step
    through the fused decode_attention kernel (another summation order), and one Q8_K rounding of
    an activation flipped by that last bit moves the logits ~2e-3 (Q4_K, seen on the H200). Kimi K3's step (KDA's
    recurrent state updated in place, nope-only MLA, AttnRes, SiTU experts) and DeepSeek V4's (hyper-connections,
    windowed attention over compressed entries from the device position, hash routing, clamped SwiGLU experts),
    captured since session 33, their float trunks within 1e-4."""
    make_plan, bound = REPLAYED[model]
    path = write_model(tmp_path / "m.gguf", make_plan(), seed=3)[0]
    m = load_model(path, device="cuda")
    try:
        assert use_graphs("on", m.net, "cuda")
        want, want_ids = decode(m.net, lambda c: lambda t: m.net(torch.tensor([t]), c), 24, 32)
        static, static_ids = decode(m.net, lambda c: StaticDecode(m.net, c, False, 4), 24, 32)
        graphed = []
        got, got_ids = decode(m.net, lambda c: graphed.append(StaticDecode(m.net, c, True, 4)) or graphed[0], 24, 32)
    finally:
        m.close()
    assert sorted(graphed[0]._graphs) == [8, 16, 32]
    assert got_ids == static_ids == want_ids
    assert torch.equal(got, static), "graph replay differs from the same static step run eagerly"
    err = float((got - want).norm() / want.norm())
    assert err < bound, f"graph replay vs eager relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows, attend", [("kernel", "kernel"), ("torch", "torch"), ("torch", "sdpa")])
def test_prompt_graph_replays_the_padded_forward_on_cuda(tmp_path, quant, rows, attend, monkeypatch):
    """A prompt's graph replay gives the bits of the same padded forward run eagerly (so do the
    decode steps after it: the same K/V rows), over bucket boundaries, and with the prompt's row-wise
    attention and float GEMM kernels (rows "kernel": SPARKD_PREFILL_ATTENTION and SPARKD_PREFILL_FLOAT_GEMM
    =kernel, attn11) the eager prompt's bits at every length. With torch attention and cuBLAS float
    GEMMs (rows "torch", the defaults) a padded
    prompt's logits are not the eager prompt's bits: cuBLAS picks its kernel and summation order by
    the row count (H200, 5 tokens padded to 64: the router's F32 gate of the tiny Q8_0 model, the F16
    attention output of the tiny Q4_K one, 3.5e-2 apart in the logits; bench/gpu_box/prompt_pad_diff.py
    finds the first op); within 2e-2 of them relative, the same pick. attend "sdpa" (the default
    attention since session 14) with the torch float GEMMs: as "torch"."""
    monkeypatch.setattr(attention, "PREFILL_ATTENTION", attend)
    monkeypatch.setattr(linear, "PREFILL_FLOAT_GEMM", rows)
    shape = TINY["qwen3moe"] if quant == "Q8_0" else TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    path = write_model(tmp_path / "q.gguf", plan(shape, quant), seed=3)[0]
    m = load_model(path, device="cuda")
    try:
        assert use_graphs("on", m.net, "cuda")
        ctx, forwards = 256, []
        for n in (2, 5, 64, 70, 200):  # buckets 64, 64, 64, 80, 224
            tokens = [(7 * i + 3) % m.cfg.n_vocab for i in range(n)]
            runs = {}
            for mode in ("eager", "padded", "graphs"):
                cache = m.net.new_cache(ctx)
                forwards.append(PromptForward(m.net, cache, mode))
                logits = forwards[-1](torch.tensor(tokens), last=True)
                step = StaticDecode(m.net, cache, graphs=True)
                runs[mode] = logits, [step.next_token(int(logits[-1].argmax())) for _ in range(6)]
            (got, got_ids), (padded, padded_ids), (want, want_ids) = runs["graphs"], runs["padded"], runs["eager"]
            assert torch.equal(got, padded) and got_ids == padded_ids, f"{n} tokens: replay vs padded forward"
            if n == 64 or rows == "kernel":
                assert torch.equal(got, want) and got_ids == want_ids, f"{n} tokens, {rows}: graph vs eager"
            err = float((got - want).norm() / want.norm())
            assert err < 2e-2 and got.argmax() == want.argmax(), f"{n} tokens: graph vs eager prompt, error {err:.2e}"
    finally:
        m.close()
    assert sorted(forwards[-1]._graphs) == [224] and not any(f.failed for f in forwards)


@pytest.mark.gpu
@pytest.mark.parametrize("quant, rows", [("Q8_0", 128), ("Q4_K", 128), ("Q8_0", 64), ("Q4_K", 64)])
def test_continued_graph_replays_the_padded_forward_on_cuda(tmp_path, quant, rows, monkeypatch):
    """A prompt that continues the cache replays its continued graph (bucket, span) with the bits of
    the same padded forward run eagerly (logits, the K/V rows up to its end, the decode steps after
    it), over spans 256 and 512 and buckets 64 and 80; the eager continuation's bits where it fills
    its bucket and ends at its span (192 + 64 = 256), else within 2e-2 of them, the same pick. Its
    attention: attend (CONTINUE_SDPA_ROWS 128, the default, over these buckets) or attend_sdpa with
    the positions' mask (from 64 rows on: every graph here, and the eager continuations of 64 and 70)."""
    monkeypatch.setattr(attention, "CONTINUE_SDPA_ROWS", rows)
    shape = TINY["qwen3moe"] if quant == "Q8_0" else TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    path = write_model(tmp_path / "q.gguf", plan(shape, quant), seed=3)[0]
    m = load_model(path, device="cuda")
    try:
        assert use_graphs("on", m.net, "cuda")
        ctx, forwards = 512, []
        head = torch.tensor([(5 * i + 2) % m.cfg.n_vocab for i in range(300)])
        for start, n, key in ((40, 5, (64, 256)), (192, 64, (64, 256)), (100, 70, (80, 256)), (300, 30, (64, 512))):
            tokens = [(7 * i + 3) % m.cfg.n_vocab for i in range(n)]
            runs = {}
            for mode in ("eager", "padded", "graphs"):
                cache = m.net.new_cache(ctx)
                PromptForward(m.net, cache, "eager")(head[:start], last=True)
                forwards.append(PromptForward(m.net, cache, mode))
                assert mode == "eager" or forwards[-1]._key(n, True, start) == key
                logits = forwards[-1](torch.tensor(tokens), last=True)
                rows = torch.cat([cache.k[0][:start + n], cache.v[0][:start + n]]).cpu()
                step = StaticDecode(m.net, cache, graphs=True)
                runs[mode] = logits, [step.next_token(int(logits[-1].argmax())) for _ in range(6)], rows
            (got, got_ids, got_rows), (padded, padded_ids, padded_rows), (want, want_ids, _) = \
                runs["graphs"], runs["padded"], runs["eager"]
            assert torch.equal(got, padded) and got_ids == padded_ids and torch.equal(got_rows, padded_rows), \
                f"{n} tokens at {start}: replay vs padded forward"
            if key == (n, start + n):
                assert torch.equal(got, want) and got_ids == want_ids, f"{n} tokens at {start}: graph vs eager"
            err = float((got - want).norm() / want.norm())
            print(f"{quant}: {n} tokens at {start}, key {key}: continued graph vs eager relative error {err:.2e}")
            assert err < 2e-2 and got.argmax() == want.argmax(), f"{n} tokens at {start}: graph vs eager, {err:.2e}"
            assert list(forwards[-1]._graphs) == [key] and not forwards[-1].failed
    finally:
        m.close()


@pytest.mark.gpu
@pytest.mark.parametrize("top_k, top_p, path", [(0, 1.0, "full"), (40, 1.0, "fused"), (0, 0.95, "topp"),
                                                 (100, 0.95, "torch")])
def test_prepared_draws_give_the_same_tokens_on_cuda(tmp_path, top_k, top_p, path):
    """generate's draw graphs captured before its timed region (prepare_draws: every bucket prepare
    captured) give the tokens of those captured on each bucket's first draw: the same seed, the same
    tokens, and the decode captures nothing more."""
    m = tiny_cuda_model(tmp_path)
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, seed=5)
    runs = {}
    try:
        for early in (False, True):
            cache = m.net.new_cache(32)
            logits = m.net(torch.tensor(PROMPT), cache, last=True).cpu()
            step = StaticDecode(m.net, cache, graphs=True, first_bucket=4)
            step.prepare(len(PROMPT) + STEPS)
            if early:
                assert step.prepare_draws(params, len(PROMPT) + STEPS)  # this request draws on the device
                assert set(step._draws) == {(span, path) for span in (4, 8, 16, 32)}, step._draws.keys()
            drawn = set(step._draws)
            runs[early] = cli._decode(step, Sampler(params), logits, PROMPT, STEPS, None, frozenset(), None)[0]
            assert step.cache.n_past == len(PROMPT) + STEPS and not step.failed
            if early:
                assert set(step._draws) == drawn
    finally:
        m.close()
    assert runs[True] == runs[False] and len(runs[True]) == STEPS


@pytest.mark.gpu
def test_a_bucket_whose_step_runs_eagerly_draws_eagerly_on_cuda(tmp_path, monkeypatch):
    """Every step capture failing (the draw graphs' would succeed on CUDA): no draw graph is captured
    over an eager step's logits tensor, which its replays would keep reading while each eager step
    writes a new one; the seed's tokens are those of the step without graphs."""
    m = tiny_cuda_model(tmp_path)
    params = SamplingParams(temperature=0.8, seed=5)
    runs = {}

    def no_room(span):
        raise RuntimeError("no room")
    try:
        for graphs in (False, True):
            cache = m.net.new_cache(32)
            logits = m.net(torch.tensor(PROMPT), cache, last=True).cpu()
            step = StaticDecode(m.net, cache, graphs=graphs, first_bucket=4)
            monkeypatch.setattr(step, "_capture", no_room)
            runs[graphs] = cli._decode(step, Sampler(params), logits, PROMPT, STEPS, None, frozenset(), None)[0]
            if graphs:
                assert not step._graphs and not step._draws and sorted(step.failed) == [8, 16, 32]
    finally:
        m.close()
    assert runs[True] == runs[False] and len(runs[True]) == STEPS


@pytest.mark.gpu
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (40, 1.0), (0, 0.95)])
def test_generate_and_the_engine_draw_the_same_tokens_on_cuda(tmp_path, top_k, top_p):
    """A seeded temperature request gives `generate` and the server (Engine.generate) the same tokens
    on CUDA, the first one (drawn on the device from the prompt's logits: StaticDecode.pick_from) too."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    prompt, n = [1, 7, 42], 12
    r = run_cli("generate", str(path), "--tokens", ",".join(map(str, prompt)), "-n", str(n), "--device", "cuda",
                "--resident", "--json", "--cuda-graphs", "on", "--temp", "0.8", "--top-k", str(top_k),
                "--top-p", str(top_p), "--seed", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    cli_tokens = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]
    engine = Engine(path, ctx=len(prompt) + n, device="cuda", resident=True, cuda_graphs="on")
    engine.load()
    try:
        req = GenerationRequest(prompt, n, SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, seed=5))
        tokens = list(engine.generate(req, threading.Event()))
        assert engine._step.drawing
    finally:
        engine.close()
    assert tokens == cli_tokens and tokens


@pytest.mark.gpu
def test_draw_graphs_captured_at_load_give_the_same_tokens_on_cuda(tmp_path, monkeypatch):
    """The server's engine captures every path's draw graph at load (full, candidates, torch chain in the
    bucket prepare captured; a log line with their time and memory); seeded requests of each path then
    give the tokens they give with the graphs captured on their first draw (SPARKD_LOAD_DRAW_GRAPHS=0),
    and no request captures one more."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    requests = [SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, seed=5)
                for top_k, top_p in ((0, 1.0), (40, 1.0), (0, 0.95))]
    tokens = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(cuda_graphs.LOAD_DRAW_GRAPHS_ENV, switch)
        logged = []
        engine = Engine(path, ctx=64, device="cuda", resident=True, cuda_graphs="on", log=logged.append)
        engine.load()
        try:
            step = engine._step
            at_load = set(step._draws)
            if switch == "1":
                paths = step.sampler.paths  # full, fused, torch (and any path a later sampler adds)
                assert {"full", "fused", "torch"} <= set(paths) and at_load == {(64, p) for p in paths}, at_load
                line = [x for x in logged if x.startswith(f"draw graphs at load: {len(paths)} held (")]
                assert line and "0 given up" in line[0] and all(f"64/{p} " in line[0] for p in paths), logged
                print(line[0])
            else:
                assert not at_load and not any(x.startswith("draw graphs at load") for x in logged)
            tokens[switch] = [list(engine.generate(GenerationRequest([1, 7, 42], 12, params), threading.Event()))
                              for params in requests]
            assert step.drawing and not step.failed
            if switch == "1":
                assert set(step._draws) == at_load  # no request captured one
        finally:
            engine.close()
    assert tokens["1"] == tokens["0"] and all(len(t) == 12 for t in tokens["1"])


def tiny_cuda_model(tmp_path, quant: str = "Q8_0"):
    return load_model(write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], quant), seed=3)[0], device="cuda")


def eager_reference(net, tokens: torch.Tensor, ctx: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """The eager prompt's last logits, the static decode's greedy tokens after it, the K/V rows."""
    cache = net.new_cache(ctx)
    logits = net(tokens, cache, last=True)
    step = StaticDecode(net, cache, graphs=True)
    ids = [step.next_token(int(logits[-1].argmax())) for _ in range(6)]
    return logits, ids, torch.cat([cache.k[0][:len(tokens)], cache.v[0][:len(tokens)]]).cpu()


def primed(net, tokens: torch.Tensor, ctx: int) -> None:
    """Capture tokens' bucket once and drop it, so what a capture makes for the process (tables kept
    for the model's life, cuBLAS's workspace for the warm-up and capture streams) exists before
    memory is compared."""
    PromptForward(net, net.new_cache(ctx))(tokens, last=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_prompt_capture_out_of_memory_falls_back_on_cuda(tmp_path, monkeypatch):
    """A real out-of-memory during a bucket's capture: right after the warm-up (graph_capture's
    ready), the process is held to the memory it has reserved (set_per_process_memory_fraction),
    so the capture's pool cannot grow; the log line gives the room back before the eager run. The
    prompt runs eagerly with the bits (logits, K/V rows, the tokens after it) of a run without the
    try; when the failure is logged, allocated memory is what it was before and reserved no more;
    the bucket is not tried again, and another bucket still captures and replays the padded
    forward's bits."""
    total = torch.cuda.get_device_properties(0).total_memory

    def squeezed(device, pool, warm, run, generator=None, ready=None):
        def squeeze():
            ready()
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved(device) / total, device)
        tries.append(device)
        return graph_capture.capture(device, pool, warm, run, generator, squeeze)

    def log(line):
        torch.cuda.set_per_process_memory_fraction(1.0)
        at_log.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        logged.append(line)

    tries, logged, at_log = [], [], []
    m = tiny_cuda_model(tmp_path)
    try:
        tokens = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(40)])
        want = eager_reference(m.net, tokens, 256)
        primed(m.net, tokens, 256)
        cache = m.net.new_cache(256)
        p = PromptForward(m.net, cache, log=log)
        monkeypatch.setattr(prompt_graphs, "capture", squeezed)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        logits = p(tokens, last=True)
        monkeypatch.setattr(prompt_graphs, "capture", graph_capture.capture)
        print(f"failed capture: allocated {before[0]} -> {at_log[0][0]}, reserved {before[1]} -> {at_log[0][1]} "
              f"bytes: {logged}")
        step = StaticDecode(m.net, cache, graphs=True)
        got = logits, [step.next_token(int(logits[-1].argmax())) for _ in range(6)], \
            torch.cat([cache.k[0][:40], cache.v[0][:40]]).cpu()
        assert len(logged) == 1 and logged[0].startswith(
            "prompt graph 64 tokens not captured, its prompts run eagerly: capture failed: ")
        assert at_log[0][0] == before[0] and at_log[0][1] <= before[1], "the failed capture's memory was not given back"
        assert torch.equal(got[0], want[0]) and got[1] == want[1] and torch.equal(got[2], want[2])
        cache.n_past = 0
        assert torch.equal(p(tokens, last=True), want[0]) and len(tries) == 1 and len(logged) == 1
        other = torch.tensor([(5 * i + 1) % m.cfg.n_vocab for i in range(70)])
        cache.n_past = 0
        replayed = p(other, last=True)
        cache.n_past = 0
        padded = PromptForward(m.net, cache, "padded")(other, last=True)
        assert torch.equal(replayed, padded) and sorted(p._graphs) == [80] and p.failed.keys() == {64}
        assert logged[1].startswith("prompt graph 80 tokens: captured in ")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        m.close()


@pytest.mark.gpu
def test_step_capture_out_of_memory_falls_back_on_cuda(tmp_path, monkeypatch):
    """A real out-of-memory in a decode bucket's capture (the process held to the memory it has
    reserved after the warm-up, as for the prompt above): that bucket's steps run eagerly with the
    bits of the same static step without graphs, the failure is logged once with the memory given
    back, and the next bucket is captured and replayed."""
    total = torch.cuda.get_device_properties(0).total_memory

    def squeezed(device, pool, warm, run, generator=None, ready=None):
        def squeeze():
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved(device) / total, device)
        monkeypatch.setattr(cuda_graphs, "capture", graph_capture.capture)  # only the first capture
        return graph_capture.capture(device, pool, warm, run, generator, squeeze)

    def log(line):
        torch.cuda.set_per_process_memory_fraction(1.0)
        at_log.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        logged.append(line)

    def made(cache):  # memory measured with the cache, the prompt's rows and the step in place, before a capture
        steps.append(StaticDecode(m.net, cache, True, 4, log=log))
        torch.cuda.synchronize()
        before.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        return steps[0]

    logged, at_log, steps, before = [], [], [], []
    m = tiny_cuda_model(tmp_path)
    try:
        want, want_ids = decode(m.net, lambda c: StaticDecode(m.net, c, graphs=False, first_bucket=4), 24, 32)
        decode(m.net, lambda c: StaticDecode(m.net, c, True, 4), 2, 32)  # the process's one-off tables first
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        monkeypatch.setattr(cuda_graphs, "capture", squeezed)
        got, got_ids = decode(m.net, made, 24, 32)
        print(f"failed step capture: (allocated, reserved) {before[0]} -> {at_log[0]} bytes: {logged}")
        assert logged[0].startswith("decode graph of 8 positions not captured, run eagerly")
        assert [line.split(":")[0] for line in logged[1:]] == ["decode graph of 16 positions", "decode graph of 32 "
                                                               "positions"]  # each capture logged (session 20)
        assert at_log[0][0] == before[0][0] and at_log[0][1] <= before[0][1], "the failed capture's memory was kept"
        assert torch.equal(got, want) and got_ids == want_ids
        assert list(steps[0].failed) == [8] and sorted(steps[0]._graphs) == [16, 32]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        m.close()


@pytest.mark.gpu
def test_prompt_graph_margin_keeps_the_device_free_on_cuda(tmp_path):
    """A margin the device cannot keep: no bucket is captured (logged once, with the numbers), no
    memory is kept, and the prompts give the eager bits."""
    m = tiny_cuda_model(tmp_path)
    try:
        tokens = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(40)])
        want = eager_reference(m.net, tokens, 256)[0]
        primed(m.net, tokens, 256)
        logged, cache = [], m.net.new_cache(256)
        p = PromptForward(m.net, cache, margin=torch.cuda.get_device_properties(0).total_memory >> 20 << 20,
                          log=logged.append)
        before = torch.cuda.memory_allocated()
        for _ in range(2):
            cache.n_past = 0
            assert torch.equal(p(tokens, last=True), want)
        assert torch.cuda.memory_allocated() == before and not p._graphs and list(p.failed) == [64]
        assert len(logged) == 1 and "not captured, its prompts run eagerly: it would leave " in logged[0]
        assert logged[0].endswith(f"free device memory, under the {p._room.margin >> 20} MiB margin")
    finally:
        m.close()


@pytest.mark.gpu
def test_engine_captures_prompt_graphs_at_load_on_cuda(tmp_path):
    """--prompt-graphs 5,70 captures the buckets 64 and 80 at load (a log line each, the pool on
    /metrics); a 64-token prompt (its bucket's size: the eager bits) gives the tokens of
    --prompt-graphs lazy (which captures 64 on the request) and off; auto captures every bucket up
    to the context."""
    path = write_model(tmp_path / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    tokens, stats = {}, {}
    for choice in ("5,70", "lazy", "off", "auto"):
        logged = []
        engine = Engine(path, ctx=200, device="cuda", resident=True, cuda_graphs="on", prompt_graphs=choice,
                        log=logged.append)
        engine.load()
        try:
            if choice == "5,70":
                assert [line.split(":")[0] for line in logged if line.startswith("prompt graph ")] == \
                    ["prompt graph 80 tokens", "prompt graph 64 tokens"]  # the longest first
                assert any(line.startswith("prompt graphs at load: 2 held, 0 given up") for line in logged)
                text = EngineMetrics(lambda: None, dict, engine.prompt_graph_stats).render().decode()
                assert 'sparkd_engine_prompt_graphs{state="captured"} 2.0' in text
            req = GenerationRequest([(7 * i + 3) % 500 for i in range(64)], 8, SamplingParams(temperature=0.0))
            tokens[choice] = list(engine.generate(req, threading.Event()))
            stats[choice] = engine.prompt_graph_stats()
        finally:
            engine.close()
    print(f"prompt graph stats by --prompt-graphs: {stats}")
    assert stats["5,70"]["captured"] == 2 and stats["5,70"]["pool_bytes"] > 0
    assert stats["lazy"]["captured"] == 1 and stats["off"] is None
    assert stats["auto"]["captured"] == 8  # 64, 80, 96, 112, 128, 160, 192 and 200 (the context caps 224)
    assert tokens["5,70"] == tokens["lazy"] == tokens["off"] == tokens["auto"] and tokens["off"]
