"""The streamed decode step with graph segments (streaming/graph_step.py): each layer's attention,
norms and router as one segment over static inputs give the same logits bits and greedy tokens as
the eager step (EagerDecode), run eagerly (the CPU interpreter stands in for the device) and, on
the GPU box, replayed from captured CUDA graphs (marker gpu). The stage profile times the replays.
"""

import dataclasses
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.make_model import plan as model_plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.streaming import graph_step  # noqa: E402
from sparkd.engine.streaming.eager_step import EagerDecode  # noqa: E402

PROMPT, STEPS = [1, 5, 9], 2
PREFETCH = 16  # slots: more than the guesses in flight, so none is skipped for want of a slot
COUNTERS = ("requests", "hits", "misses", "prefetch_predicted", "prefetch_useful", "prefetch_wasted")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("seg") / "m.gguf", model_plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]


@pytest.fixture(scope="module")
def arch_model(tmp_path_factory):
    """arch → its tiny Q8_0 model, made on first use."""
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = write_model(tmp_path_factory.mktemp(arch) / "m.gguf", model_plan(TINY[arch], "Q8_0"),
                                     seed=5)[0]
        return made[arch]
    return get


# shared experts beside the routed ones after a dense first layer: MLA with group-limited routing, and GQA
LEAD_DENSE = ["deepseek2", "glm4moe"]


def _segments(experts: bool, graphs: bool = False, steps: list | None = None):
    """make_step for _decode: a SegmentDecode, checked to be what streaming_step would choose (segment_blocker
    finds nothing), kept in steps."""
    def make(net, cache):
        assert graph_step.segment_blocker(net) is None
        step = graph_step.SegmentDecode(net, cache, graphs, experts)
        if steps is not None:
            steps.append(step)
        return step
    return make


def _streamed(path, backend: str, prefetch: int = 0):
    """prefetch: that many prefetch slots (--prefetch) and a host cache of top-k slots, so that
    the guesses are read and used or dropped."""
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming
    from sparkd.engine.streaming.vram import VramExperts

    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False, device=backend,
                         prefetch_slots=prefetch)
    sm = open_streaming(path, opts)
    if prefetch:
        sm.store.resize(sm.plan.min_slots * sm.plan.slot_bytes)
    if backend == "cpu":  # the interpreter: experts through the kernels, a CPU tensor as "VRAM"
        sm.store.kernel_device = "cpu"
    if sm.store.vram is None:
        sm.store.vram = VramExperts(3, sm.plan.slot_bytes, backend)
    return sm


def _decode(path, backend: str, make_step, profile: bool = False, prefetch: int = 0, stats: dict | None = None):
    """(logits rows of the prompt and each step, greedy ids by next_token, the profile's report);
    the store's counters into `stats` where given, and its prefetch calls in order (layer, ids)."""
    from sparkd.engine.kernels import fused
    from sparkd.engine.streaming.profile import StageProfile

    before = fused.configure("all", on_cpu=backend == "cpu")
    sm = _streamed(path, backend, prefetch)
    try:
        net = sm.model.net
        calls, store_prefetch = [], sm.store.prefetch
        sm.store.prefetch = lambda layer, ids: calls.append((layer, list(ids))) or store_prefetch(layer, ids)
        cache = net.new_cache(len(PROMPT) + 2 * STEPS)
        step = make_step(net, cache)
        rows = [net(torch.tensor(PROMPT), cache)[-1:]]
        prof = StageProfile(net, step) if profile else None
        for _ in range(STEPS):  # the logits row back (a temperature request)
            rows.append(step(int(rows[-1][-1].argmax())))
        ids = [int(rows[-1][-1].argmax())]
        for _ in range(STEPS):  # greedy: the pick made where the logits are
            ids.append(step.next_token(ids[-1]))
        report = prof.report(0.0) if prof else None
        if prof:
            prof.remove()
        if stats is not None:
            stats.update({k: getattr(sm.store.stats, k) for k in COUNTERS}, prefetch_calls=calls)
        return torch.cat(rows).cpu(), ids, report
    finally:
        sm.close()
        fused.configure(before)


@pytest.fixture(scope="module")
def eager_cpu(model):
    pytest.importorskip("triton", reason="triton is not installed")
    return _decode(model, "cpu", EagerDecode)[:2]


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "segments"])
def test_segments_run_eagerly_give_the_eager_steps_bits(model, eager_cpu, experts):
    want, want_ids = eager_cpu
    got, got_ids, rep = _decode(model, "cpu", lambda n, c: graph_step.SegmentDecode(n, c, False, experts), True)
    assert torch.equal(got, want)
    assert got_ids == want_ids
    assert rep["total_seconds"] > 0 and rep["attention_seconds"] > 0 and rep["router_seconds"] > 0
    assert rep["expert_compute_seconds"] > 0


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "segments"])
@pytest.mark.parametrize("arch", LEAD_DENSE)
def test_segments_run_dense_layers_shared_experts_and_mla_as_the_eager_step(arch_model, arch, experts):
    """The first segment holds the dense layer and the first MoE layer's attention; the shared experts run beside
    the selected ones; with --prefetch the dense layer's guess is asked for first, as the eager hooks do."""
    pytest.importorskip("triton", reason="triton is not installed")
    path = arch_model(arch)
    want_stats, got_stats, steps = {}, {}, []
    want, want_ids, _ = _decode(path, "cpu", EagerDecode, prefetch=PREFETCH, stats=want_stats)
    got, got_ids, _ = _decode(path, "cpu", _segments(experts, steps=steps), prefetch=PREFETCH, stats=got_stats)
    assert steps[0].cuts == [1, 2]  # layer 0 is dense
    assert want_stats["prefetch_predicted"] > 0 and got_stats == want_stats
    assert torch.equal(got, want)
    assert got_ids == want_ids


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


SPARSE_BOUND = 1e-5  # glm-dsa: float32 rounding (the CPU: measured below 1e-6)


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "segments"])
def test_segments_run_glm_dsa_sparse_attention_as_the_eager_step(arch_model, experts):
    """glm-dsa's lightning indexer selects by device position inside a segment (the span's keys, those past the
    position masked) the eager step's positions, a "shared" layer reusing the selection a full layer of the
    previous segment made; the attention then sums over the span, not the visible rows, so the logits agree
    within rounding and the greedy ids exactly."""
    pytest.importorskip("triton", reason="triton is not installed")
    path = arch_model("glm-dsa")
    want_stats, got_stats, steps = {}, {}, []
    want, want_ids, _ = _decode(path, "cpu", EagerDecode, prefetch=PREFETCH, stats=want_stats)
    got, got_ids, _ = _decode(path, "cpu", _segments(experts, steps=steps), prefetch=PREFETCH, stats=got_stats)
    assert steps[0].cuts == [1, 2]
    assert got_stats == want_stats
    assert _rel(got, want) < SPARSE_BOUND
    assert got_ids == want_ids


# the decoders whose blocks hand on more than the residual (models/decoder.py's stream): Kimi K3's AttnRes
# checkpoints (banked at layers 0 and 2: segment 0 banks one, segment 1 reads it and banks another) over KDA and
# MLA, its latent MoE; DeepSeek V4's hyper-connection copies and the tokens its hash-routed layer 0 picks by
OWN_STREAMS = ["kimi-k3", "deepseek4"]
STATIC_BOUND = 1e-5  # deepseek4's static step (its window's rows, the span's compressed entries): float32 rounding


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "segments"])
@pytest.mark.parametrize("arch", OWN_STREAMS)
def test_segments_hand_on_kimi_k3s_and_deepseek4s_streams_as_the_eager_step(arch_model, arch, experts):
    """Kimi K3: the eager step's bits (its KDA state folded once a token: the captures' warm-ups on CUDA put it
    back). DeepSeek V4: within rounding (its static attention), the greedy ids exactly. Both prefetch as the
    eager hooks do."""
    pytest.importorskip("triton", reason="triton is not installed")
    path = arch_model(arch)
    want_stats, got_stats, steps = {}, {}, []
    want, want_ids, _ = _decode(path, "cpu", EagerDecode, prefetch=PREFETCH, stats=want_stats)
    got, got_ids, _ = _decode(path, "cpu", _segments(experts, steps=steps), prefetch=PREFETCH, stats=got_stats)
    assert steps[0].cuts == ([1, 2] if arch == "kimi-k3" else [0, 1, 2])
    assert want_stats["prefetch_predicted"] > 0 and got_stats == want_stats
    if arch == "kimi-k3":
        assert torch.equal(got, want)
    else:
        assert _rel(got, want) < STATIC_BOUND
    assert got_ids == want_ids


def test_segments_run_gpt_oss_biased_experts_as_the_eager_step(tmp_path):
    """gpt-oss's MXFP4 experts with their biases (session 25: through the MoE kernels when streamed, the selection
    kept over the segments' offsets buffer refilling its bias rows each token): the eager step's bits."""
    pytest.importorskip("triton", reason="triton is not installed")
    path = write_model(tmp_path / "oss.gguf", model_plan(TINY["gpt-oss"], "F32", [("_exps", "MXFP4")]), seed=5)[0]
    want, want_ids, _ = _decode(path, "cpu", EagerDecode)
    got, got_ids, _ = _decode(path, "cpu", lambda n, c: graph_step.SegmentDecode(n, c, False, True))
    assert torch.equal(got, want)
    assert got_ids == want_ids


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "segments"])
def test_segments_prefetch_as_the_eager_steps_hooks_do(model, experts):
    """--prefetch: the segments' guesses (asked for between segments) are the eager hooks' and
    reach the store in the same order: the same bits, ids and cache counters."""
    pytest.importorskip("triton", reason="triton is not installed")
    want_stats, got_stats = {}, {}
    want, want_ids, _ = _decode(model, "cpu", EagerDecode, prefetch=PREFETCH, stats=want_stats)
    got, got_ids, _ = _decode(model, "cpu", lambda n, c: graph_step.SegmentDecode(n, c, False, experts),
                              prefetch=PREFETCH, stats=got_stats)
    assert want_stats["prefetch_predicted"] > 0 and want_stats["misses"] > 0
    assert got_stats == want_stats
    assert torch.equal(got, want)
    assert got_ids == want_ids


def test_prefetch_skips_the_experts_the_vram_cache_holds(model):
    sm = _streamed(model, "cpu", PREFETCH)
    try:
        store = sm.store
        assert store.vram.admission.offer((1, 0)) is not None
        store.prefetch(1, [0, 1])
        assert sorted(store._prefetched) == [(1, 1)] and store.stats.prefetch_predicted == 1
    finally:
        sm.close()


def test_a_wrong_offsets_buffer_is_a_clear_error(model):
    from sparkd.engine.kernels import fused

    sm = _streamed(model, "cpu")
    before = fused.configure("all", on_cpu=True)
    try:
        with pytest.raises(EngineError, match=r"could not copy the kernel table offsets of layer 0: need int64 "
                                              r"\[\d+\] on cpu, got torch.int32"):
            sm.store.kernel_select(0, [0, 1], torch.empty(6, dtype=torch.int32))
        sm.store.table_mode = "checked"
        with pytest.raises(EngineError, match=r"SPARKD_STREAM_TABLE=checked makes its own \(use cached\)"):
            sm.store.kernel_select(0, [0, 1], torch.empty(6, dtype=torch.int64))
    finally:
        fused.configure(before)
        sm.close()


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [0, PREFETCH], ids=["", "prefetch"])
@pytest.mark.parametrize("mode", ["experts", "segments"])
def test_segment_graphs_replay_the_eager_steps_bits_on_cuda(model, mode, prefetch, monkeypatch):
    want_stats, got_stats = {}, {}
    want, want_ids, _ = _decode(model, "cuda", EagerDecode, prefetch=prefetch, stats=want_stats)
    monkeypatch.setenv(graph_step.ENV, mode)
    steps = []
    got, got_ids, rep = _decode(model, "cuda", lambda n, c: steps.append(graph_step.streaming_step(n, c, "cuda"))
                                or steps[0], True, prefetch, got_stats)
    n = TINY["qwen3moe"].n_layer
    assert isinstance(steps[0], graph_step.SegmentDecode) and steps[0].graphs
    assert steps[0].experts == (mode == "experts")
    assert sorted(steps[0]._graphs) == list(range(n + 1))  # a segment per MoE layer, the head last
    assert torch.equal(got, want), "segment graph replay differs from the eager step"
    assert got_ids == want_ids
    assert got_stats == want_stats and (want_stats["prefetch_predicted"] > 0) == bool(prefetch)
    assert rep["attention_seconds"] > 0 and rep["router_seconds"] == 0 and rep["attention_gpu_seconds"] > 0
    assert rep["expert_compute_seconds"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("arch", LEAD_DENSE + ["glm-dsa"] + OWN_STREAMS)
def test_segment_graphs_replay_dense_layers_shared_experts_and_mla_on_cuda(arch_model, arch):
    """The eager step's bits (glm-dsa's sparse attention and deepseek4's static step: within rounding, as on the
    CPU); Kimi K3's KDA state folded once a token (a warm-up folding it twice fails it)."""
    path = arch_model(arch)
    want, want_ids, _ = _decode(path, "cuda", EagerDecode, prefetch=PREFETCH)
    steps = []
    got, got_ids, _ = _decode(path, "cuda", lambda n, c: steps.append(graph_step.streaming_step(n, c, "cuda"))
                              or steps[0], prefetch=PREFETCH)
    assert isinstance(steps[0], graph_step.SegmentDecode) and steps[0].graphs and steps[0].experts
    assert sorted(steps[0]._graphs) == list(range(len(steps[0].cuts) + 1))
    if arch in ("glm-dsa", "deepseek4"):
        assert _rel(got, want) < SPARSE_BOUND
    else:
        assert torch.equal(got, want), "segment graph replay differs from the eager step"
    assert got_ids == want_ids


def test_segment_blocker_names_a_layer_without_a_one_token_step(arch_model, tmp_path):
    """Loaded without streaming (the CPU's torch experts: no kernel store) a MoE layer has no step a segment can
    hold; a dense model has no router to end a segment at."""
    from sparkd.engine.kernels import fused
    from sparkd.engine.models import load_model

    gemma = write_model(tmp_path / "g.gguf", model_plan(TINY["gemma3"], "F32"), seed=5)[0]
    before = fused.configure("all", on_cpu=True)
    loaded = [load_model(p) for p in (arch_model("deepseek2"), gemma)]
    try:
        why = [graph_step.segment_blocker(m.net) for m in loaded]
    finally:
        fused.configure(before)
        for m in loaded:
            m.close()
    assert why[0] == "layer 1: its expert store or activation has no one-token kernel step"  # layer 0 is dense
    assert why[1] == "no layer has routed experts: nothing streams"


def test_the_step_falls_back_to_eager_where_segments_would_differ(model):
    from sparkd.engine.kernels import fused

    sm = _streamed(model, "cpu")
    before = fused.configure("all", on_cpu=True)
    try:
        net = sm.model.net
        assert graph_step.segment_blocker(net) is None
        cache = net.new_cache(8)
        logged = []
        assert type(graph_step.streaming_step(net, cache, "cpu")) is EagerDecode  # no graphs on the CPU
        eager_before = fused.configure_eager(False)
        try:
            assert "SPARKD_FUSED_EAGER=0" in graph_step.segment_blocker(net)
        finally:
            fused.configure_eager(eager_before)
        fused.configure("rms_norm,router", on_cpu=True)
        assert "rope_kv or attention" in graph_step.segment_blocker(net)
        assert type(graph_step.streaming_step(net, cache, "cuda", "auto", logged.append)) is EagerDecode
        assert logged and "rope_kv or attention" in logged[0]
        assert type(graph_step.streaming_step(net, cache, "cuda", "off")) is EagerDecode
        fused.configure("all", on_cpu=True)
        plan = sm.store.plan
        sm.store.plan = dataclasses.replace(plan, prefetch_slots=2)
        assert graph_step.segment_blocker(net) is None  # the segments run the prefetch hooks' guesses
        sm.store.plan = plan
        sm.store.table_mode = "checked"
        assert graph_step.segment_blocker(net) is None
        assert "SPARKD_STREAM_TABLE=checked" in graph_step.experts_blocker(net)
    finally:
        fused.configure(before)
        sm.close()


def test_a_step_past_the_context_is_a_clear_error(model):
    sm = _streamed(model, "cpu")
    try:
        net = sm.model.net
        cache = net.new_cache(2)
        cache.n_past = 2
        with pytest.raises(EngineError, match=r"could not extend the KV cache to 3 positions: context is 2"):
            graph_step.SegmentDecode(net, cache, graphs=False).next_token(1)
        assert cache.n_past == 2
    finally:
        sm.close()
