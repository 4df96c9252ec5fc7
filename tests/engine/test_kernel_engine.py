"""The engine's kernel path — projections and routed experts kept as raw GGUF blocks and multiplied
by the Triton kernels (KernelLinear, KernelExperts) — against the CPU reference engine on tiny
generated models: same prompt logits within a bound, same greedy tokens.

On the GPU box it runs on CUDA (marker gpu); elsewhere the same path runs on the CPU under
TRITON_INTERPRET=1 (fewer tokens: the interpreter runs programs one by one).
"""

import json
import os

import pytest
import torch
from gguf import GGMLQuantizationType

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.kernels import dispatch, iq1_s, iq2_xs, iq2_xxs  # noqa: E402
from sparkd.engine.layers import act_round, linear  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402
from sparkd.engine.layers.embedding import KernelEmbedding  # noqa: E402
from sparkd.engine.layers.linear import KernelLinear  # noqa: E402
from sparkd.engine.layers.quant_experts import KernelExperts  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402
from engine_cli import run_engine  # noqa: E402

# Measured: 1.2e-7 (interpreter, Q8_0): one path's logits against themselves (two forms of one launch).
BOUND = 1e-3
# The kernel model against the CPU reference: both round activations to 8 bits per block (as llama.cpp), so float
# noise of an ulp at a value within an ulp of its rounding boundary flips that quant by a whole step, ~6e-3 of these
# tiny models' logits (session 44: the IQ2_XS model at "ieee" on CUDA; test_a_quant_flipped_at_a_near_tie_...). A
# wrong kernel (a scale, a block, a sign) moves them by 1e-1 or more; the greedy tokens are compared too.
STEP_BOUND = 2e-2
PROMPT = [1, 5, 9, 33, 2]
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant "
                       "runs where there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
# Q8_0: every projection and expert quantized; Q4_K needs rows of 256 (attn_output's rows of 64 are Q5_0, as
# llama-quantize's fallback writes them)
SHAPES = {"Q8_0": TINY["qwen3moe"], "Q4_K": TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)}
SHAPES["Q6_K"] = SHAPES["Q4_K"].replace(n_layer=1)  # one layer: the head is what the Q6_K layout tiles
# every projection and expert IQ4_XS or Q4_0: their integer steps (session 21); the grid i-quants (session 23)
SHAPES["IQ4_XS"], SHAPES["Q4_0"] = SHAPES["Q4_K"], SHAPES["Q8_0"]
SHAPES["F16"] = SHAPES["BF16"] = SHAPES["Q8_0"]
GRID = ("IQ2_XXS", "IQ3_XXS", "IQ2_XS", "IQ1_S", "IQ1_M", "IQ2_S", "IQ3_S")
SHAPES.update({q: SHAPES["Q4_K"] for q in GRID})
# the kimi-k3 file's expert mix (test_sparse_model.UD_IQ1_S) on the 256-wide model (trunk F32: the
# interpreter runs only the expert kernels)
IQ_MIX = [(r"blk\.1\.ffn_down_exps", "IQ2_XS"), ("ffn_down_exps", "IQ2_XXS"), ("_exps", "IQ1_S")]


def greedy(net, prompt: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """Prompt logits and n greedy tokens (a decode step between two picks; none after the last, whose
    logits nothing reads: under the interpreter that step cost as much as the prompt)."""
    cache = net.new_cache(len(prompt) + n)
    first = logits = net(torch.tensor(prompt), cache)
    out = [int(logits[-1].argmax())] if n else []
    while len(out) < n:
        logits = net(torch.tensor(out[-1:]), cache)
        out.append(int(logits[-1].argmax()))
    return first, out


def assert_greedy_matches(ref, k, prompt: list[int], n: int, label: str) -> None:
    """The kernel model k's prompt logits within STEP_BOUND of the CPU reference ref's, and the same n greedy tokens."""
    want_logits, want = greedy(ref.net, prompt, n)
    got_logits, got = greedy(k.net, prompt, n)
    err = float((got_logits - want_logits).norm() / want_logits.norm())
    print(f"{label}: prompt logits relative error {err:.2e}")
    assert err < STEP_BOUND and got == want


def logits_by_layout(tmp_path, monkeypatch, backend: str, quant: str, env: str, layouts: tuple[str, ...]) -> dict:
    """A tiny `quant` model (SHAPES) loaded with kernels once per resident layout set by $env:
    layout -> (prompt logits, one greedy token, the qtypes of its KernelLinear projections)."""
    path = write_model(tmp_path / "m.gguf", plan(SHAPES[quant], quant), seed=5)[0]
    got = {}
    for layout in layouts:
        monkeypatch.setenv(env, layout)
        k = load_model(path, device=backend, kernels=True)
        try:
            got[layout] = (*greedy(k.net, PROMPT, 1), {m.qtype for m in k.net.modules() if isinstance(m, KernelLinear)})
        finally:
            k.close()
    return got


@pytest.mark.parametrize("precision", ["int8", "ieee"])
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "BF16"] + [pytest.param(q, marks=pytest.mark.gpu)
                                                             for q in ("F16", "Q4_K", "IQ4_XS", *GRID)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_path_matches_cpu_reference(tmp_path, backend, quant, precision, monkeypatch):
    """precision: SPARKD_PREFILL_PRECISION's (the prompt's GEMMs): the integer GEMM (default; Q4_0's and IQ4_XS's
    since session 22, the grid i-quants' since session 23) or the float one. F16 and BF16 (session 36: every projection
    and expert multiplied from its 16-bit values) have no integer GEMM: theirs runs at tf32, exact over their values."""
    if backend == "cpu" and (quant not in ("Q8_0", "Q4_0", "BF16") or quant == "BF16" and precision == "ieee"):
        pytest.skip("the interpreter runs the 64-wide Q8_0, Q4_0 and BF16 models only, BF16 at the default precision "
                    "(its tf32 GEMM: float32 under the interpreter, as ieee) (CI time; IQ4_XS's 256-wide: ~100 s; the "
                    "grid i-quants' by hand, session 23: 13-19 s a prompt and token)")
    monkeypatch.setattr(linear, "PREFILL_PRECISION", precision)
    path = write_model(tmp_path / "m.gguf", plan(SHAPES[quant], quant), seed=5)[0]
    n = 8 if backend == "cuda" else 2
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        assert any(isinstance(m, KernelLinear) for m in k.net.modules())
        assert isinstance(k.net.blocks[0].ffn.store, KernelExperts)
        assert k.net.blocks[0].ffn.store.kernel_table(0) is not None
        want_logits, want = greedy(ref.net, PROMPT, n)
        got_logits, got = greedy(k.net, PROMPT, n)
    finally:
        ref.close()
        k.close()
    err = float((got_logits - want_logits).norm() / want_logits.norm())
    print(f"{quant} {backend}: prompt logits relative error {err:.2e}")
    assert err < STEP_BOUND
    assert got == want


def test_a_quant_flipped_at_a_near_tie_moves_the_logits_past_bound(tmp_path):
    """Why the kernel model meets the reference within STEP_BOUND, not BOUND. Session 44: the IQ2_XS model's prompt
    at "ieee" on CUDA missed BOUND by 5.86e-3 at every commit tried; its first module off the reference (by 7e-4) was
    block 1's wqkv, whose input was off by 2.3e-7. The reference alone shows why: the value of that input nearest its
    Q8_K rounding boundary moved the few ulps across it (what the kernels' float noise does) moves the reference's
    logits by the same 5.86e-3. Reference only (CPU, no kernels)."""
    path = write_model(tmp_path / "m.gguf", plan(SHAPES["IQ2_XS"], "IQ2_XS"), seed=5)[0]
    ref = load_model(path)
    try:
        norm = ref.net.blocks[1].attn_norm
        seen = []
        hook = norm.register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
        want = greedy(ref.net, PROMPT, 0)[0]
        hook.remove()
        x = seen[0].reshape(-1)
        q = lambda v: round_activations(v.reshape(-1, 256), act_round.Q8_K).reshape(-1)  # noqa: E731
        v = x.double().reshape(-1, 256)
        v = (v * (127.0 / v.abs().amax(-1, keepdim=True))).reshape(-1)  # the values in quant steps
        i = int(((v - v.floor() - 0.5).abs() / v.abs().clamp(min=1e-9)).argmin())  # the nearest tie, relative
        nudged, toward = x.clone(), torch.tensor(float(v[i].floor() + 0.5) * float(x[i] / v[i]))
        for ulps in range(1, 16):  # a few ulps: what a sum in another order gives
            nudged[i] = torch.nextafter(nudged[i], toward)
            if q(nudged)[i] != q(x)[i]:
                break
        assert q(nudged)[i] != q(x)[i], "the nearest tie is within 15 ulps of its boundary"
        hook = norm.register_forward_hook(lambda m, args, out: nudged.reshape(out.shape))
        got = greedy(ref.net, PROMPT, 0)[0]
        hook.remove()
    finally:
        ref.close()
    err = float((got - want).norm() / want.norm())
    print(f"one Q8_K quant flipped {ulps} ulps from its tie: prompt logits relative error {err:.2e}")
    assert BOUND < err < STEP_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_last_token_logits(tmp_path, backend):
    """forward(last=True) (SPARKD_PROMPT_LOGITS=last: the head's GEMV on the last row) gives the
    last row of every token's logits (the head's GEMM) within the bound, and the same argmax."""
    path = write_model(tmp_path / "m.gguf", plan(SHAPES["Q8_0"], "Q8_0"), seed=5)[0]
    k = load_model(path, device=backend, kernels=True)
    try:
        every = k.net(torch.tensor(PROMPT), k.net.new_cache(len(PROMPT)))
        last = k.net(torch.tensor(PROMPT), k.net.new_cache(len(PROMPT)), last=True)
    finally:
        k.close()
    assert every.shape[0] == len(PROMPT) and last.shape == (1, every.shape[1])
    assert float((last[0] - every[-1]).norm() / every[-1].norm()) < BOUND
    assert int(last[0].argmax()) == int(every[-1].argmax())


@pytest.mark.parametrize("steps", ["float", "int"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_iq_experts_through_the_kernels_match_cpu_reference(tmp_path, backend, steps, monkeypatch):
    """Routed experts as IQ1_S gate/up and IQ2_XXS/IQ2_XS down run through the MoE kernels (their
    grids from device memory), not the torch dequantize fallback: their integer steps (the default since session 23;
    x and h as Q8_K), and (float) their float dots as $SPARKD_<type>_INT=0 makes them the families."""
    for module in (iq1_s, iq2_xxs, iq2_xs):
        family = module.INT_FAMILY if steps == "int" else module.FLOAT_FAMILY
        monkeypatch.setitem(dispatch.FAMILIES, family.qtype, family)
    path = write_model(tmp_path / "m.gguf", plan(SHAPES["Q4_K"], "F32", IQ_MIX), seed=9)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        store = k.net.blocks[0].ffn.store
        assert isinstance(store, KernelExperts)
        for il, down in ((0, "IQ2_XXS"), (1, "IQ2_XS")):
            sel = store.kernel_table(il)
            assert sel is not None and (sel.prepared.gate_up.qtype.name, sel.prepared.down.qtype.name) == ("IQ1_S", down)
            assert (sel.prepared.gate_up.idot is not None) == (sel.prepared.down.idot is not None) == (steps == "int")
        # the interpreter: decode steps only (prefill's GEMM per expert is its slowest part; the
        # GEMM is checked on its own in test_kernels)
        prompt, n = (PROMPT, 8) if backend == "cuda" else (PROMPT[:1], 3)
        assert_greedy_matches(ref, k, prompt, n, f"IQ experts {backend} {steps}")
    finally:
        ref.close()
        k.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt_oss_biased_experts_through_the_kernels(tmp_path, backend):
    """gpt-oss's routed experts (MXFP4, as its GGUFs ship them, with biases) run through the MoE decode kernels with
    their biases (session 24; before, a biased layer took the torch dequantize path), its prompt through the grouped
    GEMMs with them. Greedy tokens and logits as the CPU reference's. Since session 25 the resident experts are in
    mxfp4_tiled's 16-row tiles (test_nibble_tiles: the same bits as the GGUF blocks)."""
    path = write_model(tmp_path / "m.gguf", plan(TINY["gpt-oss"], "F32", [("_exps", "MXFP4")]), seed=9)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        store = k.net.blocks[0].ffn.store
        assert isinstance(store, KernelExperts) and store.kernel_table(0).bias is not None
        sel = store.kernel_select(0, torch.tensor([0, 1], device=backend))
        assert sel is not None and sel.bias is not None and sel.prepared.gate_up.qtype.name == "MXFP4_TILED"
        assert_greedy_matches(ref, k, *((PROMPT, 8) if backend == "cuda" else (PROMPT[:2], 3)),
                              f"gpt-oss MXFP4 experts {backend}")
    finally:
        ref.close()
        k.close()


# DeepSeek V4's clamp and Kimi K3's SiTU caps low enough that the tiny models' sums cross them
MODEL_ACT_SHAPES = {"deepseek4": TINY["deepseek4"].replace(swiglu_limit=0.05),
                    "kimi-k3": TINY["kimi-k3"].replace(situ_beta=0.05, situ_linear_beta=0.05)}


@pytest.mark.parametrize("arch", list(MODEL_ACT_SHAPES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_model_activations_through_the_kernels(tmp_path, backend, arch, monkeypatch):
    """DeepSeek V4's routed experts (clamped SwiGLU, hash-routed first layer) and Kimi K3's (SiTU, at the latent
    width between its down and up projections) run through the MoE kernels (session 33; before, their activations
    sent every layer to the torch path: a host sync and the selected experts dequantized per layer and token).
    The torch path is refused here (the store's get raises), and the greedy tokens and logits are the CPU
    reference's."""
    path = write_model(tmp_path / "m.gguf", plan(MODEL_ACT_SHAPES[arch], "F32", [("_exps", "Q8_0")]), seed=9)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        moes = [b.ffn for b in k.net.blocks if hasattr(b.ffn, "store")]
        assert moes and all(m.kernel_act is not None and m.kernel_act[0] in ("swiglu_clamp", "situ") for m in moes)
        assert isinstance(moes[0].store, KernelExperts)

        def torch_path(*args, **kw):
            raise AssertionError("a routed layer took the torch path (store.get)")
        monkeypatch.setattr(KernelExperts, "get", torch_path)
        assert_greedy_matches(ref, k, *((PROMPT, 8) if backend == "cuda" else (PROMPT[:3], 3)),
                              f"{arch} experts {backend}")
    finally:
        ref.close()
        k.close()


@pytest.mark.parametrize("arch, k_type", [("deepseek2", "Q8_0"), ("deepseek2", "Q5_0"), ("deepseek2", "IQ4_NL"),
                                          ("deepseek2", "Q5_1"), ("kimi-k3", "Q8_0")])
@pytest.mark.parametrize("backend", BACKENDS)
def test_mla_head_matrices_stay_blocks_through_the_grouped_gemv(tmp_path, backend, arch, k_type, monkeypatch):
    """MLA's per-head k and v matrices (attn_k_b, attn_v_b: 3-D) stay the file's blocks (Weights.stacked; before
    session 35 they were f32: ~4 GB a token read at DeepSeek V3's shape). A token's absorbed products are one grouped
    GEMV each, the prompt's are over their dequantized values; the logits and greedy tokens are the CPU reference's
    (f32 values of the same blocks, x rounded the same way). qk_nope 32 so attn_k_b's 32-wide rows take 32-value
    blocks: Q8_0, and the types llama-quantize falls back to for real files' 128-wide rows; attn_v_b in Q4_0."""
    shape = TINY[arch].replace(qk_nope=32)
    path = write_model(tmp_path / "m.gguf", plan(shape, "F32", [("attn_k_b", k_type), ("attn_v_b", "Q4_0")]),
                       seed=9)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        mlas = [b.attn for b in k.net.blocks if hasattr(b.attn, "wk_b")]
        assert mlas and all(isinstance(a.wk_b, KernelLinear) and isinstance(a.wv_b, KernelLinear) for a in mlas)
        info = k.gguf.tensor(f"blk.{mlas[0].il}.attn_k_b.weight")
        assert mlas[0].wk_b.raw.numel() == info.nbytes and mlas[0].wk_b.shape == (shape.n_head * shape.kv_lora_rank, 32)
        calls = []
        grouped = KernelLinear.grouped
        monkeypatch.setattr(KernelLinear, "grouped", lambda self, x: calls.append(x.shape) or grouped(self, x))
        assert_greedy_matches(ref, k, *((PROMPT, 8) if backend == "cuda" else (PROMPT[:3], 3)), f"{arch} mla {backend}")
        assert calls and all(c[0] == 1 for c in calls)  # the decode steps' tokens, never the prompt's

        def step(net):  # a decode step's logits after the prompt
            cache = net.new_cache(len(PROMPT) + 1)
            net(torch.tensor(PROMPT), cache)
            return net(torch.tensor([7]), cache)
        want = step(ref.net)
        assert float((step(k.net) - want).norm() / want.norm()) < STEP_BOUND
    finally:
        ref.close()
        k.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma3"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_token_embedding_stays_blocks(tmp_path, backend, arch):
    """The token embedding stays the file's blocks (KernelEmbedding, session 35; f32 before), and a tied output
    projection (Gemma 3's) multiplies the same bytes: the greedy tokens and logits are the CPU reference's."""
    path = write_model(tmp_path / "m.gguf", plan(TINY[arch], "Q8_0"), seed=5)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        emb = k.net.tok_embd
        assert isinstance(emb, KernelEmbedding) and emb.raw.numel() == k.gguf.tensor("token_embd.weight").nbytes
        tied = not k.gguf.tensors.get("output.weight")
        assert tied == (arch == "gemma3") and isinstance(k.net.output, KernelLinear)
        assert (k.net.output.raw.data_ptr() == emb.raw.data_ptr()) == tied
        assert_greedy_matches(ref, k, *((PROMPT, 8) if backend == "cuda" else (PROMPT[:3], 3)), f"{arch} {backend}")
    finally:
        ref.close()
        k.close()


def test_only_mlas_head_matrices_load_as_stacked_matrices(tmp_path):
    """Weights.stacked on another tensor is a clear error naming the rule the memory plan counts by, before a byte is
    read."""
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models.weights import Weights

    path = write_model(tmp_path / "m.gguf", plan(TINY["deepseek2"], "Q8_0"), seed=9)[0]
    g = GGUFModel.open(path)
    read = []
    try:
        with pytest.raises(EngineError, match=r"could not load 'blk.0.attn_q_b.weight' as stacked matrices: only "):
            Weights(g, on_read=read.append, kernels=True).stacked("blk.0.attn_q_b.weight")
    finally:
        g.close()
    assert not read


@pytest.mark.parametrize("backend", BACKENDS)
def test_16_bit_rows_the_kernels_cannot_run_take_the_other_path(tmp_path, backend):
    """F16 and BF16 kernels take rows of whole 32-value runs (dispatch.multiplies, session 36). A BF16 model whose
    experts' down rows are 48 wide: its attention and gate/up projections stay the file's bytes, the routed experts
    run the generic path, the output head (rows of 64) the kernels, and the logits and greedy tokens are the CPU
    reference's."""
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"].replace(n_ff_exp=48), "BF16"), seed=5)[0]
    ref, k = load_model(path), load_model(path, device=backend, kernels=True)
    try:
        assert {m.qtype for m in k.net.modules() if isinstance(m, KernelLinear)} == {GGMLQuantizationType.BF16}
        assert isinstance(k.net.tok_embd, KernelEmbedding)
        assert k.net.blocks[0].ffn.store.kernel_table(0) is None
        assert_greedy_matches(ref, k, PROMPT, 2, "BF16, experts 48 wide")
    finally:
        ref.close()
        k.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_streamed_experts_zero_copy_match_cpu_reference(tmp_path, backend, arch):
    """--unified on: the MoE kernels read the selected experts in place from the streaming
    arena's slots (pinned host memory on CUDA), with misses read from disk first; gpt-oss's MXFP4 experts with
    their biases too (session 25: the selection's bias rows gathered from the host's, copied to the device)."""
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    spec = plan(SHAPES["Q8_0"], "Q8_0") if arch == "qwen3moe" else plan(TINY["gpt-oss"], "F32", [("_exps", "MXFP4")])
    path = write_model(tmp_path / "m.gguf", spec, seed=7)[0]
    # the plan counts this process's RSS (1.8 GB in a pytest process that set up CUDA): room above it
    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False, device=backend,
                         unified="on")
    ref, sm = load_model(path), open_streaming(path, opts)
    try:
        if backend == "cpu":  # the interpreter: experts through the kernels, trunk as the reference
            sm.store.kernel_device = "cpu"
        sel = sm.store.kernel_select(0, [0, 1])
        assert sel is not None and (sel.bias is not None) == (arch == "gpt-oss")
        if arch == "gpt-oss":  # a selection kept over a caller's offsets buffer (graph_step): its biases refilled
            out = torch.empty(6, dtype=torch.int64, device=sm.store.kernel_device)
            kept = sm.store.kernel_select(0, [0, 1], out)
            buf = kept.bias
            assert torch.equal(buf, sel.bias)
            assert sm.store.kernel_select(0, [2, 1], out) is kept and kept.bias is buf
            assert torch.equal(buf, sm.store.kernel_select(0, [2, 1]).bias) and not torch.equal(buf, sel.bias)
        want_logits, want = greedy(ref.net, PROMPT, 2)
        got_logits, got = greedy(sm.model.net, PROMPT, 2)
        misses = sm.store.stats.misses
    finally:
        ref.close()
        sm.close()
    err = float((got_logits - want_logits).norm() / want_logits.norm())
    print(f"zero-copy {backend}: prompt logits relative error {err:.2e}, {misses} misses read")
    assert misses > 0 and err < STEP_BOUND and got == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_q4_k_expert_gate_up_matches_cpu_reference(tmp_path, monkeypatch, backend):
    """Resident Q4_K experts' gate, up (session 9, moe20) and down (session 10, moe21) repacked at load into the
    pairx bytes (the default) and kept as GGUF blocks ($SPARKD_MOE_GATE_UP_LAYOUT=gguf,
    $SPARKD_MOE_DOWN_LAYOUT=gguf): both within the bound of the CPU reference, the same tokens; the torch
    fallback (store.get) dequantizes the repacked experts to the file's values. The down is tiled from model width
    quant_experts.TILED_DOWN_MIN_DIM: on the GPU from 0 here; the interpreter keeps the 256-wide model's down in
    GGUF blocks (the tiled down's 4-row programs took it from ~1 to ~4 min; test_moe_tiled runs it there)."""
    from sparkd.engine.layers import quant_experts
    from sparkd.engine.layers.quant_experts import DOWN_LAYOUT_ENV, GATE_UP_LAYOUT_ENV

    shape = SHAPES["Q4_K"] if backend == "cuda" else SHAPES["Q6_K"]  # the interpreter: one layer (~1 min a layer)
    path = write_model(tmp_path / "m.gguf", plan(shape, "F32", [("_exps", "Q4_K")]), seed=9)[0]
    prompt, n = (PROMPT, 8) if backend == "cuda" else (PROMPT[:1], 1)  # the interpreter: decode steps only
    ref = load_model(path)
    try:
        want_logits, want = greedy(ref.net, prompt, n)
    finally:
        ref.close()
    got, weights = {}, {}
    if backend == "cuda":
        monkeypatch.setattr(quant_experts, "TILED_DOWN_MIN_DIM", 0)
    for layout in ("tiled", "gguf"):
        monkeypatch.setenv(GATE_UP_LAYOUT_ENV, layout)
        monkeypatch.setenv(DOWN_LAYOUT_ENV, layout)
        down = layout if backend == "cuda" else "gguf"
        k = load_model(path, device=backend, kernels=True)
        try:
            store = k.net.blocks[0].ffn.store
            prepared = store.kernel_table(0).prepared
            names = tuple("Q4_K_TILED" if v == "tiled" else "Q4_K" for v in (layout, down))
            assert (prepared.gate_up.qtype.name, prepared.down.qtype.name) == names
            got[layout] = greedy(k.net, prompt, n)
            ew = store.get(0, [0, 3])
            weights[layout] = tuple(torch.stack(list(t)) for t in (ew.gate, ew.up, ew.down))  # one tensor an expert
        finally:
            k.close()
    for layout, (logits, tokens) in got.items():
        err = float((logits - want_logits).norm() / want_logits.norm())
        print(f"Q4_K experts, gate/up and down {layout}, {backend}: prompt logits relative error {err:.2e}")
        assert err < STEP_BOUND and tokens == want, layout
    assert all(torch.equal(a, b) for a, b in zip(weights["tiled"], weights["gguf"]))


def test_down_layout_tiles_the_down_from_its_width(tmp_path, monkeypatch):
    """$SPARKD_MOE_DOWN_LAYOUT=all (session 13) repacks a Q4_K down narrower than TILED_DOWN_MIN_DIM into the pairx
    bytes at load; "tiled" keeps it in GGUF blocks there; "auto" (the default, down13) tiles it from
    AUTO_DOWN_MIN_DIM: not at this model's width below it, at it (nothing runs: the layouts the load picked)."""
    from sparkd.engine.layers import quant_experts
    from sparkd.engine.layers.quant_experts import DOWN_LAYOUT_ENV

    shape = SHAPES["Q6_K"]
    path = write_model(tmp_path / "m.gguf", plan(shape, "F32", [("_exps", "Q4_K")]), seed=9)[0]
    for layout, min_dim, down in (("all", None, "Q4_K_TILED"), ("tiled", None, "Q4_K"),
                                  ("auto", shape.n_embd + 1, "Q4_K"), ("auto", shape.n_embd, "Q4_K_TILED")):
        monkeypatch.setenv(DOWN_LAYOUT_ENV, layout)
        if min_dim is not None:
            monkeypatch.setattr(quant_experts, "AUTO_DOWN_MIN_DIM", min_dim)
        k = load_model(path, device="cpu", kernels=True)
        try:
            assert k.net.blocks[0].ffn.store.kernel_table(0).prepared.down.qtype.name == down, layout
        finally:
            k.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_resident_q8_0_layouts_give_the_same_logits(tmp_path, monkeypatch, backend):
    """Resident Q8_0 projections are repacked by default (q8_0_packed) and kept as GGUF blocks
    with $SPARKD_Q8_0_LAYOUT=gguf: the same logits either way (bit for bit in the interpreter,
    where both run the same steps; on the GPU their tiles differ)."""
    from gguf import GGMLQuantizationType as T

    from sparkd.engine.kernels.q8_0_packed import PACKED
    from sparkd.engine.models.weights import Q8_0_LAYOUT_ENV
    got = logits_by_layout(tmp_path, monkeypatch, backend, "Q8_0", Q8_0_LAYOUT_ENV, ("packed", "gguf"))
    assert got["packed"][2] == {PACKED} and got["gguf"][2] == {T.Q8_0}
    (a, tok_a, _), (b, tok_b, _) = got["packed"], got["gguf"]
    assert tok_a == tok_b
    assert torch.equal(a, b) if backend == "cpu" else float((a - b).norm() / b.norm()) < 1e-5


def test_unknown_q8_0_layout_is_a_clear_error(tmp_path, monkeypatch):
    from sparkd.engine.models.weights import Q8_0_LAYOUT_ENV
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]
    monkeypatch.setenv(Q8_0_LAYOUT_ENV, "tiled")
    with pytest.raises(EngineError, match="could not use SPARKD_Q8_0_LAYOUT='tiled': choose one of packed, gguf"):
        load_model(path, device="cuda" if ON_GPU else "cpu", kernels=True)


def test_unknown_device_is_a_clear_error(tmp_path):
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]
    with pytest.raises(EngineError, match="could not use device 'tpu'"):
        load_model(path, device="tpu")


_cli = run_engine


@pytest.mark.skipif(ON_GPU, reason="needs a machine without CUDA")
def test_streaming_to_cuda_without_cuda_is_a_clear_error(tmp_path):
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]
    r = _cli("generate", str(path), "--tokens", "1,2", "-n", "1", "--device", "cuda", "--unified", "off")
    assert r.returncode == 2 and "could not use device 'cuda'" in r.stderr


@pytest.mark.gpu
def test_cli_generate_on_cuda_equals_cpu(tmp_path):
    path = write_model(tmp_path / "m.gguf", plan(SHAPES["Q8_0"], "Q8_0"), seed=6)[0]
    runs = [_cli("generate", str(path), "--tokens", "1,5,9", "-n", "8", "--resident", "--json", "--device", d)
            for d in ("cpu", "cuda")]
    for r in runs:
        assert r.returncode == 0, r.stderr
    cpu, cuda = (json.loads(r.stdout.splitlines()[-1]) for r in runs)
    assert cuda["tokens"] == cpu["tokens"]
