"""The eager one-token step (streamed experts keep decode eager) on the static step's decode
kernels: rope_attention (or, from fused.ROPE_ATTENTION_SPAN, rope_kv and decode_attention) with the
position on the device and rows [0, pos] instead of a bucket span. The kernels read the same keys in
the same ranges either way, so the eager step gives the static step's bits (torch.equal, not a
bound); $SPARKD_FUSED_EAGER=0 gives it back its torch rope and attend.

Where there is no GPU the kernels run under TRITON_INTERPRET=1 on the CPU (tiny F32 models); on
the GPU box the same checks run compiled (marker gpu), there on a Q8_0 model whose experts run
the MoE kernels.
"""

import os

import pytest
import torch
from bench_script import load_bench_script

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton: 3.9.0 runs the "
                                     "interpreter next to the CPU torch)")

from sparkd.engine.cuda_graphs import StaticDecode
from sparkd.engine.kernels import fused
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

ARCHS = ["qwen3moe", "gpt-oss", "gemma3", "deepseek2"]  # q/k norms folded, sinks, sliding window, MLA
PROMPT, STEPS = [1, 7, 42, 3, 99], 4  # positions 5..8 cross the 8 bucket of first_bucket=4
BACKENDS = [
    pytest.param("cpu", "F32", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant "
                       "runs where there is no GPU")),
    pytest.param("cuda", "Q8_0", id="cuda", marks=pytest.mark.gpu),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(arch, quant) → a tiny model's path, written on first use."""
    d, paths = tmp_path_factory.mktemp("tiny"), {}

    def path(arch: str, quant: str):
        if (arch, quant) not in paths:
            paths[arch, quant] = write_model(d / f"{arch}_{quant}.gguf", plan(TINY[arch], quant), seed=3)[0]
        return paths[arch, quant]
    return path


def greedy(net, spec: str, device: str, eager_kernels: bool, static: bool, kv_dtype: torch.dtype = torch.float32):
    """(logits rows, ids) of greedy decoding after PROMPT with fused kernels `spec`, one token a
    step: the static step (no graph) or the eager net(tokens, cache); kv_dtype: the cache rows' type."""
    before, before_eager = fused.configure(spec, on_cpu=device == "cpu"), fused.configure_eager(eager_kernels)
    try:
        cache = net.new_cache(32, kv_dtype)
        logits = net(torch.tensor(PROMPT), cache)[-1:]
        step = (StaticDecode(net, cache, graphs=False, first_bucket=4) if static
                else lambda t: net(torch.tensor([t]), cache))
        rows, ids = [], []
        for _ in range(STEPS):
            ids.append(int(logits[-1].argmax()))
            logits = step(ids[-1])
            rows.append(logits[-1])
        return torch.stack(rows), ids
    finally:
        fused.configure(before)
        fused.configure_eager(before_eager)


@pytest.mark.parametrize("backend, quant", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_eager_step_equals_static_step(models, backend, quant, arch, kv_dtype):
    m = load_model(models(arch, quant), device=backend)
    try:
        want, want_ids = greedy(m.net, "all", backend, True, static=True, kv_dtype=kv_dtype)
        got, got_ids = greedy(m.net, "all", backend, True, static=False, kv_dtype=kv_dtype)
    finally:
        m.close()
    assert got_ids == want_ids
    assert torch.equal(got, want), f"{arch}: eager step on the decode kernels differs from the static step"


@pytest.mark.skipif(ON_GPU, reason="counts the interpreter's launches; the GPU groups run the bits test above")
def test_eager_step_picks_rope_attention_by_its_position(models, monkeypatch):
    """With fused.ROPE_ATTENTION_SPAN at 8 (a bucket boundary of first_bucket=4), the static step runs positions 5-7
    (bucket 8) in one launch and 8 (bucket 16) in two; the eager step over its 32-row cache does the same, by its
    position, and gives the static step's bits at each."""
    counts = load_bench_script("gpu_box/launch_count.py")
    monkeypatch.setattr(fused, "ROPE_ATTENTION_SPAN", 8)
    m = load_model(models("qwen3moe", "F32"))
    before = fused.configure("all", on_cpu=True)
    try:
        cache = m.net.new_cache(32)
        m.net(torch.tensor(PROMPT), cache)
        launches = [counts.count_cpu(lambda t=t: m.net(torch.tensor([t]), cache))["ops"] for t in (3, 4, 5, 6)]
    finally:
        fused.configure(before)
    one = [("triton:_rope_attention" in ops, "triton:_rope_kv" in ops) for ops in launches]
    assert one == [(True, False)] * 3 + [(False, True)]
    try:
        want, want_ids = greedy(m.net, "all", "cpu", True, static=True)
        got, got_ids = greedy(m.net, "all", "cpu", True, static=False)
    finally:
        m.close()
    assert got_ids == want_ids and torch.equal(got, want)


@pytest.mark.parametrize("backend, quant", BACKENDS)
def test_switch_off_gives_the_torch_attention_back(models, backend, quant):
    """Eager kernels off with every kernel on = rope_kv and attention off: the torch rope and
    attend, to the bit. Compared at the attention's output (the input of its wo): on the GPU the
    Q8_0 model's int8 rounding of that output can hide the two summation orders in the logits."""
    m = load_model(models("qwen3moe", quant), device=backend)
    seen: list[torch.Tensor] = []
    wo = m.net.blocks[0].attn.wo
    hook = wo.register_forward_pre_hook(lambda _, args: seen.append(args[0].cpu()))
    # with "norm_fold" (in "all") one token's wo runs forward_parts, which no forward hook sees
    parts = getattr(wo, "forward_parts", None)
    if parts is not None:
        wo.forward_parts = lambda o: seen.append(o.cpu()) or parts(o)
    try:
        runs = {}
        for name, spec, eager in (("torch", "rms_norm,router,norm_quant", True), ("off", "all", False),
                                  ("on", "all", True)):
            seen.clear()
            logits, _ = greedy(m.net, spec, backend, eager, static=False)
            runs[name] = (logits, torch.cat(seen[1:]))  # the steps after the prompt
    finally:
        hook.remove()
        wo.__dict__.pop("forward_parts", None)
        m.close()
    assert torch.equal(runs["off"][0], runs["torch"][0]) and torch.equal(runs["off"][1], runs["torch"][1])
    assert not torch.equal(runs["on"][1], runs["torch"][1])  # the switch does switch: another summation order


def test_eager_position_past_the_context_is_refused(models):
    m = load_model(models("qwen3moe", "F32"))
    before = fused.configure("all", on_cpu=True)
    try:
        cache = m.net.new_cache(6)
        m.net(torch.tensor(PROMPT), cache)
        m.net(torch.tensor([5]), cache)
        with pytest.raises(Exception, match="could not extend the KV cache to 7 positions: context is 6"):
            m.net(torch.tensor([5]), cache)
        assert cache.n_past == 6
    finally:
        fused.configure(before)
        m.close()
