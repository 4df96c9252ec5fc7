"""The RMSNorm that also writes its output as act_quant's int8 blocks (rms_norm_quant,
add_rms_norm_quant) against the two launches it replaces (rms_norm, then act_quant.quantize):
the float output and every QuantX buffer (quants, scales, Q8_K's per-32 sums) bit for bit, on
rows at mixed magnitudes with a zero block and max/min ties. Interpreter on the CPU, compiled on
the GPU box (marker gpu)."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

from test_fused_kernels import BACKENDS, ON_GPU

if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import random_blocks  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch, fused  # noqa: E402
from sparkd.engine.kernels.matmul import gemv  # noqa: E402
from sparkd.engine.layers.act_round import vec_dot_format  # noqa: E402
from sparkd.engine.layers.linear import KernelLinear  # noqa: E402
from sparkd.engine.layers.norm import RMSNorm, add_norm  # noqa: E402
from sparkd.engine.kernels.family import KernelArgumentError  # noqa: E402
from sparkd.engine.kernels.rms_norm import add_rms_norm, add_rms_norm_quant, rms_norm, rms_norm_quant  # noqa: E402

FMTS = [act_quant.Q8_0, act_quant.Q8_K]


def awkward_rows(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, h, weight): rows at mixed magnitudes; the weight zeroes the first block of the normed
    rows and makes the largest magnitude of the last row negative with a +/- tie."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 10.0 ** torch.empty(rows, 1).uniform_(-3, 2, generator=g)
    h = torch.randn(rows, cols, generator=g)
    w = torch.randn(cols, generator=g)
    w[:32] = 0.0
    x[-1, 7], w[7] = 1e3, -2.0
    x[-1, 300 % cols], w[300 % cols] = 1e3, 2.0
    return x, h, w


def assert_same_quant(got: act_quant.QuantX, want: act_quant.QuantX, fmt: str) -> None:
    assert torch.equal(got.words.cpu(), want.words.cpu())
    assert torch.equal(got.scales.cpu(), want.scales.cpu())
    if fmt == act_quant.Q8_K:
        assert torch.equal(got.sums.cpu(), want.sums.cpu())


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_norm_quant_equals_norm_then_quantize(backend, fmt, seed):
    cols = 2048 if backend == "cuda" else 512
    x, _, w = awkward_rows(3, cols, seed)
    x, w = x.to(backend), w.to(backend)
    normed, q = rms_norm_quant(x, w, 1e-6, fmt)
    want = rms_norm(x, w, 1e-6)
    assert torch.equal(normed, want)
    assert_same_quant(q, act_quant.quantize(want, fmt), fmt)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_add_norm_quant_equals_add_norm_then_quantize(backend, fmt):
    cols = 2048 if backend == "cuda" else 768  # 768: not a power of two (masked tail blocks)
    x, h, w = (t.to(backend) for t in awkward_rows(2, cols, 3))
    total, normed, q = add_rms_norm_quant(x, h, w, 1e-6, fmt)
    want_total, want = add_rms_norm(x, h, w, 1e-6)
    assert torch.equal(total, want_total) and torch.equal(normed, want)
    assert_same_quant(q, act_quant.quantize(want, fmt), fmt)


def test_norm_quant_refuses_a_width_the_blocks_do_not_divide():
    with pytest.raises(KernelArgumentError, match=r"could not run rms_norm with the 'q8_k' quantization: .* 288"):
        rms_norm_quant(torch.randn(1, 288), torch.randn(288), 1e-6, act_quant.Q8_K)
    with pytest.raises(KernelArgumentError, match=r"'q4' quantization"):
        rms_norm_quant(torch.randn(1, 256), torch.randn(256), 1e-6, "q4")


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemv_after_a_quantizing_norm_gives_the_same_bits_without_its_quant_launch(backend, qtype, monkeypatch):
    """RMSNorm → KernelLinear (and the add + norm) with norm_quant on: the projection reads the
    norm's QuantX, the same bits as with it off, and act_quant.quantize is not called."""
    cols = 512
    raw = random_blocks(qtype, 64 * cols // dispatch.FAMILIES[qtype].block_values)
    lin = KernelLinear(raw.to(backend), qtype, (64, cols), None, vec_dot_format(qtype))
    x, h, w = (t.to(backend) for t in awkward_rows(1, cols, 5))
    norm = RMSNorm(w, 1e-6)
    norm.quant_fmt = lin.x_format()
    calls = []
    real = act_quant.quantize
    monkeypatch.setattr(act_quant, "quantize", lambda *a: calls.append(a) or real(*a))
    before = fused.configure("all", on_cpu=True)
    try:
        got, got_sum = lin(norm(x)), lin(add_norm(x, h, norm)[1])
        assert calls == []
        fused.configure("rms_norm", on_cpu=True)
        want, want_sum = lin(norm(x)), lin(add_norm(x, h, norm)[1])
        assert len(calls) == 2
    finally:
        fused.configure(before)
    assert torch.equal(got, want) and torch.equal(got_sum, want_sum)


def test_a_quantized_x_the_gemv_cannot_use_is_refused():
    raw = random_blocks(T.Q8_0, 8 * 256 // 32)
    x = torch.randn(256)
    with pytest.raises(KernelArgumentError, match=r"could not run the Q8_0 GEMV on a pre-quantized x: .*pass x alone"):
        gemv(raw, T.Q8_0, (8, 256), x, qx=act_quant.quantize(torch.randn(1, 256), act_quant.Q8_K))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_on_the_norms_quantized_x_gives_the_same_bits(backend, qtype):
    """moe_decode handed the norm's QuantX (qx) against moe_decode quantizing the norm's float
    output itself: the same bits; a QuantX in another family's format is refused before any
    launch."""
    if qtype == T.Q4_K and backend == "cpu":
        pytest.skip("a Q4_K MoE takes minutes under the interpreter; the GPU run covers it")
    from test_kernels import TILES, arena_table

    from sparkd.engine.kernels.moe import moe_decode, prepare

    table, *_ = arena_table(qtype, qtype, 256, 256, 5, backend)
    sel = prepare(table, backend).select(torch.tensor([3, 0, 4], device=backend))
    fmt = sel.gate_up.act_fmt
    x, _, w = (t.to(backend) for t in awkward_rows(1, 256, 7))
    normed, q = rms_norm_quant(x, w, 1e-6, fmt)
    rw, tiles = torch.rand(3, device=backend), {k: v for k, v in TILES[backend].items() if k in ("gate_up", "down")}
    got = moe_decode(sel, normed[0], rw, qx=q, **tiles)
    assert torch.equal(got, moe_decode(sel, normed[0], rw, **tiles))
    other = act_quant.Q8_K if fmt == act_quant.Q8_0 else act_quant.Q8_0
    out = torch.full((256,), 7.0, device=backend)
    with pytest.raises(KernelArgumentError, match=r"could not run the MoE decode kernels on a pre-quantized x"):
        moe_decode(sel, normed[0], rw, out=out, qx=act_quant.quantize(normed, other), **tiles)
    assert bool((out == 7.0).all())  # nothing written


def test_the_norm_before_a_kernel_moe_writes_its_x_blocks(tmp_path):
    """qwen3moe with Q8_0 experts through the MoE kernels: link_norm_quant links every block's
    ffn_norm to its MoE too (attention norm, ffn norm, output norm), and the static step quantizes
    x once fewer per layer for the MoE with the same logits bits."""
    from bench_script import load_bench_script

    from sparkd.engine.cuda_graphs import link_norm_quant
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model

    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    m = load_model(path, device="cpu", kernels=True)
    counts = load_bench_script("gpu_box/launch_count.py").static_step_counts
    try:
        n_layer = len(m.net.blocks)
        assert link_norm_quant(m.net) == 2 * n_layer + 1
        assert all(b.ffn_norm.quant_fmt == act_quant.Q8_0 for b in m.net.blocks)
        on, off = counts(m.net, "all", on_cpu=True), counts(m.net, "rms_norm,rope_kv,attention,router", on_cpu=True)
    finally:
        m.close()
    # without norm_quant: the attention's stack, the MoE and the head quantize their x themselves
    assert off["ops"]["triton:_quant_kernel"] - on["ops"].get("triton:_quant_kernel", 0) == 2 * n_layer + 1
