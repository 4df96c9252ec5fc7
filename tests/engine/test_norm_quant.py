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
