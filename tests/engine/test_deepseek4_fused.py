"""DeepSeek V4's fused kernels (SPARKD_FUSED_KERNELS' hyper_conn: kernels/hyper_conn.py, the weights in one launch,
the mix and the merge as batched products; rope_tail: kernels/rope_tail.py) against the torch code
(layers/hyper_conn.py, layers/kv_compressor.py rope_tail), alone on random inputs and in a tiny deepseek4 model's
decode.

Where there is no GPU the kernel runs under TRITON_INTERPRET=1 (fused.configure(on_cpu=True)); on the GPU box the
same checks run compiled (marker gpu). Measured under the interpreter: the weights and the merge <= 1.2e-7 relative,
the model's logits 4.2e-7; the bounds leave room for the GPU's approximate exp and fused multiply-adds.
"""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine.kernels import fused  # noqa: E402
from sparkd.engine.kernels.rope_tail import rope_tail as rope_tail_kernel  # noqa: E402
from sparkd.engine.layers.hyper_conn import HyperConnection  # noqa: E402
from sparkd.engine.layers.kv_compressor import rope_tail  # noqa: E402
from sparkd.engine.layers.rope import RopeConfig, rope_cos_sin  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402

BOUND = 2e-6
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant runs where there "
                       "is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu().double() - want.cpu().double()).norm() / want.cpu().double().norm())


@pytest.fixture
def kernels_on():
    """fused.configure's switch set to run hyper_conn (and nothing else) on CPU tensors too; put back after."""
    def on(names: str):
        return fused.configure(names, on_cpu=True)
    before = fused.current()
    yield on
    fused.configure(before)


@pytest.mark.parametrize("T, iters", [(1, 20), (5, 20), (5, 3)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_hyper_connection_matches_torch(backend, T, iters, kernels_on):
    """pre's input, post and comb, and post's merge, fused against torch on random weights (D = 96, hc = 4, the
    Sinkhorn's 20 iterations as DeepSeek V4's, or 3); comb's columns then sum to ~1 (the last normalisation). At 3
    iterations a Sinkhorn one short differs from the reference by far more than the bound (the check can fail; at
    20 it has converged to ~1e-6)."""
    hc, D = 4, 96
    g = torch.Generator().manual_seed(T)
    conn = HyperConnection(torch.randn((2 + hc) * hc, hc * D, generator=g) * 0.05,
                           torch.randn((2 + hc) * hc, generator=g), torch.rand(3, generator=g) + 0.5, hc, iters, 1e-6,
                           1e-6).to(backend)
    x = torch.randn(T, hc, D, generator=g).to(backend)
    y = torch.randn(T, D, generator=g).to(backend)
    kernels_on("none")
    want = conn.pre(x)
    want_merge = HyperConnection.post(y, x, *want[1:])
    short = HyperConnection(conn.fn, conn.base, conn.scale, hc, iters - 1, 1e-6, 1e-6).pre(x)
    kernels_on("hyper_conn")
    got = conn.pre(x)
    got_merge = HyperConnection.post(y, x, *got[1:])
    for name, a, b in zip(("input", "post", "comb"), got, want):
        assert rel_err(a, b) < BOUND, f"{name}: {rel_err(a, b):.2e}"
    assert rel_err(got_merge, want_merge) < BOUND
    assert torch.allclose(got[2].sum(1).cpu(), torch.ones(T, hc), atol=1e-4)
    if iters == 3:
        assert rel_err(short[2], want[2]) > 100 * BOUND


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_tail_kernel_gives_the_torch_bits(backend, inverse):
    """The rope on the last 16 of 40 dims (interleaved pairs, yarn's angles: DeepSeek V4's compressed rope) of 3
    tokens x 5 heads, and its inverse: the torch code's bits; rotating by the wrong member of a pair fails it."""
    rope = RopeConfig(n_rot=16, base=160000.0, neox=False, freq_scale=0.25, ext_factor=1.0, n_ctx_orig=64)
    pos = torch.tensor([3, 4, 70])
    cos, sin = rope_cos_sin(rope, pos)
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(1))
    want = rope_tail(x, rope, pos, inverse=inverse)
    got = rope_tail_kernel(x.to(backend), cos.to(backend), sin.to(backend), inverse)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got[..., :24].cpu(), x[..., :24]) and not torch.equal(got.cpu(), x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepseek4_decode_with_fused_kernels(tmp_path, backend, kernels_on):
    """A tiny deepseek4 model (window-only, CSA and HCA layers) decodes with the fused hyper-connections and rope as
    with the torch code: the greedy ids and the logits within the bound over a prompt and 6 steps."""
    path = write_model(tmp_path / "d.gguf", plan(TINY["deepseek4"], "F32"), seed=3)[0]
    m = load_model(path, device=backend)
    got = {}
    try:
        for names in ("none", "hyper_conn,rope_tail"):
            kernels_on(names)
            cache = m.net.new_cache(32)
            rows = [m.net(torch.tensor([1, 7, 42, 3, 99]), cache)[-1]]
            ids = []
            for _ in range(6):
                ids.append(int(rows[-1].argmax()))
                rows.append(m.net(torch.tensor(ids[-1:]), cache)[-1])
            got[names] = torch.stack(rows), ids
    finally:
        m.close()
    assert got["hyper_conn,rope_tail"][1] == got["none"][1]
    err = rel_err(got["hyper_conn,rope_tail"][0], got["none"][0])
    print(f"deepseek4 {backend}: fused kernels' logits relative error {err:.2e}")
    assert err < BOUND


@pytest.mark.parametrize("layer, positions", [(1, [0, 1, 3, 5, 130]), (2, [0, 127, 130])], ids=["csa", "hca"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compressor_step_kernel_matches_torch(tmp_path, backend, kernels_on, layer, positions):
    """A static step's compressor (the tiny model's CSA layer: overlapping blocks, the previous block before
    position 0 at 0-3; its HCA layer: 128-row blocks) on a ring of random rows: the ring rows the torch code's bits,
    the entry within float32 rounding."""
    path = write_model(tmp_path / "d.gguf", plan(TINY["deepseek4"], "F32"), seed=3)[0]
    m = load_model(path, device=backend)
    try:
        comp = m.net.blocks[layer].attn.compressor
        for pos in positions:
            x, p = torch.randn(1, m.cfg.n_embd, device=backend), torch.tensor([pos], device=backend)
            got = {}
            for names in ("none", "compressor"):
                kernels_on(names)
                cache = m.net.new_cache(256)
                cache.span = 256
                st = cache.compressor_state(layer, "attn")
                torch.manual_seed(pos)
                st.kv.copy_(torch.randn(st.kv.shape))
                st.score.copy_(torch.randn(st.score.shape))
                comp(x, p, st, cache)
                got[names] = st.kv.clone(), st.score.clone(), st.entries[pos // comp.ratio].clone()
            assert torch.equal(got["compressor"][0], got["none"][0]) and torch.equal(got["compressor"][1],
                                                                                    got["none"][1]), pos
            assert rel_err(got["compressor"][2], got["none"][2]) < BOUND, pos
    finally:
        m.close()


def test_deepseek4s_norms_write_their_readers_x_blocks(tmp_path):
    """link_norm_quant links each layer's attention norm to q's low-rank projection, the query's norm to wq_b and the
    FFN norm to the MoE (and the output norm to the head): the other integer readers of those outputs (kv's
    projection, the compressors', the indexer's, the shared expert's) take the same blocks, so the static step
    quantizes no x of its own there, with the same logits bits."""
    from bench_script import load_bench_script

    from sparkd.engine.cuda_graphs import link_norm_quant

    path = write_model(tmp_path / "d.gguf", plan(TINY["deepseek4"], "Q8_0"), seed=3)[0]
    m = load_model(path, device="cpu", kernels=True)
    counts = load_bench_script("gpu_box/launch_count.py").static_step_counts
    without = ",".join(k for k in fused.KERNELS if k != "norm_quant")
    try:
        assert link_norm_quant(m.net) == 3 * len(m.net.blocks) + 1
        on_logits, off_logits = [], []
        on, off = counts(m.net, "all", True, on_logits), counts(m.net, without, True, off_logits)
    finally:
        m.close()
    assert torch.equal(on_logits[0], off_logits[0])
    # each layer's q and kv projections, wq_b, the MoE and its shared gate and up (6); the CSA layer's compressor and
    # indexer compressor (2 each), the indexer's proj and wq_b (+6), the HCA layer's compressor (+2); the head (1)
    assert off["ops"]["triton:_quant_kernel"] - on["ops"].get("triton:_quant_kernel", 0) == 6 * 3 + 6 + 2 + 1
