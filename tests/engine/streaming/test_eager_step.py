"""The streamed model's eager one-token step (streaming/eager_step.py): the norms feeding an
integer GEMV (attention stack, MoE gate/up, head) write x's int8 blocks themselves, the greedy
token is picked where the logits are and the experts' layouts are kept. Each part is switched off by $SPARKD_EAGER_STEP; on or off, the same
logits bit for bit and the same greedy tokens.

Without a GPU the kernels run under TRITON_INTERPRET=1 with the CPU standing in for the device;
on the GPU box the same on CUDA (marker gpu)."""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.make_model import plan as model_plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.streaming import eager_step  # noqa: E402

PROMPT, STEPS = [1, 5, 9, 33, 2], 3
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="the interpreter variant runs where there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def test_parts_parse_and_unknown_names_are_a_clear_error():
    assert eager_step.parse("all") == frozenset(eager_step.PARTS)
    assert eager_step.parse("none") == eager_step.parse("") == frozenset()
    assert eager_step.parse(" device_pick, norm_quant ") == {"device_pick", "norm_quant"}
    with pytest.raises(EngineError, match=r"could not switch the eager step's parts 'graphs': unknown graphs "
                                          r"\(choose all, none or some of norm_quant, device_pick; "
                                          r"SPARKD_EAGER_STEP\)"):
        eager_step.parse("graphs")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("eager") / "m.gguf", model_plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]


def _run(path, backend: str, spec: str):
    """(logits of the prompt and each step, greedy ids by next_token, linked norms, store counters)
    of a fresh streamed model with $SPARKD_EAGER_STEP=spec, experts through the MoE kernels from
    the arena and a 3-slot VRAM cache (both kinds of slot in one table)."""
    from sparkd.engine.kernels import fused
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming
    from sparkd.engine.streaming.vram import VramExperts

    before, before_fused = eager_step.configure(spec), fused.configure("all", on_cpu=backend == "cpu")
    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False, device=backend)
    sm = open_streaming(path, opts)
    try:
        store = sm.store
        if backend == "cpu":  # the interpreter: experts through the kernels, a CPU tensor as "VRAM"
            store.kernel_device = "cpu"
        if store.vram is None:
            store.vram = VramExperts(3, sm.plan.slot_bytes, backend)
        net = sm.model.net
        cache = net.new_cache(len(PROMPT) + 2 * STEPS)
        step = eager_step.EagerDecode(net, cache)
        rows = [net(torch.tensor(PROMPT), cache)[-1:]]
        for _ in range(STEPS):  # the logits row back (a temperature request)
            rows.append(step(int(rows[-1][-1].argmax())))
        ids = [int(rows[-1][-1].argmax())]
        for _ in range(STEPS):  # greedy: the pick made where the logits are
            ids.append(step.next_token(ids[-1]))
        return torch.cat(rows).cpu(), ids, step.linked, store.snapshot()
    finally:
        sm.close()
        eager_step.configure(before)
        fused.configure(before_fused)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_eager_steps_cuts_keep_the_logits_bits_and_the_tokens(model, backend):
    pytest.importorskip("triton", reason="triton is not installed")
    on_logits, on_ids, linked, stats = _run(model, backend, "all")
    off_logits, off_ids, unlinked, _ = _run(model, backend, "none")
    # each MoE's gate/up (the streamed store's x_format); on CUDA also the attention stack and the
    # head (KernelLinear; the interpreter's trunk stays torch Linear)
    n = TINY["qwen3moe"].n_layer
    assert linked == (2 * n + 1 if backend == "cuda" else n)
    assert unlinked == 0
    assert stats["misses"] > 0 and stats["vram_hits"] > 0
    assert torch.equal(on_logits, off_logits)
    assert on_ids == off_ids


def test_an_eager_step_picks_with_the_host_samplers_op(model):
    """device_pick off ($SPARKD_DEVICE_ARGMAX=0 too) brings the row back and picks on the host:
    the same ids; the CPU engine (no kernels) links nothing."""
    from sparkd.engine.models import load_model

    m = load_model(model)
    try:
        picks = {}
        for spec in ("all", "norm_quant"):
            before = eager_step.configure(spec)
            try:
                cache = m.net.new_cache(len(PROMPT) + STEPS)
                step = eager_step.EagerDecode(m.net, cache)
                ids = [int(m.net(torch.tensor(PROMPT), cache)[-1].argmax())]
                for _ in range(STEPS):
                    ids.append(step.next_token(ids[-1]))
                picks[spec] = (ids, step.device_argmax, step.linked)
            finally:
                eager_step.configure(before)
    finally:
        m.close()
    assert picks["all"][1] and not picks["norm_quant"][1]
    assert picks["all"][0] == picks["norm_quant"][0]
    assert picks["all"][2] == picks["norm_quant"][2] == 0


def test_the_stage_profile_times_a_step_picked_on_the_device(model):
    """next_token runs the network without its forward (no logits row back), so the profile
    times that call as the token's total, once, and gives the method back when removed."""
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.profile import StageProfile
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    sm = open_streaming(model, StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False))
    before = eager_step.configure("all")
    try:
        net = sm.model.net
        cache = net.new_cache(len(PROMPT) + 2)
        step = eager_step.EagerDecode(net, cache)
        net(torch.tensor(PROMPT), cache)
        prof = StageProfile(net, step)
        step.next_token(3)
        rep = prof.report(0.0)
        prof.remove()
        assert "next_token" not in vars(step)  # the class's method again
    finally:
        eager_step.configure(before)
        sm.close()
    assert rep["total_seconds"] > 0
    assert rep["total_seconds"] >= rep["attention_seconds"] + rep["router_seconds"]
