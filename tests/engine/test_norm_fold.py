"""The split-K fold moved into the launch after the GEMV (fused "norm_fold"): matmul.gemv(parts=True)
leaves the ranges' partial sums, and the residual add + RMSNorm after attention adds them in order
(rms_norm PARTS), so the output projection's launch has no ticket and no read-back. The same bits
as the in-launch fold (matmul.fold_part) followed by the plain add + norm, at the kernel and at the
model. Interpreter on the CPU, compiled on the GPU box (marker gpu: there the programs race)."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

from test_fused_kernels import BACKENDS, ON_GPU

if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import random_blocks  # noqa: E402
from test_norm_quant import assert_same_quant, awkward_rows  # noqa: E402

from sparkd.engine.cuda_graphs import StaticDecode  # noqa: E402
from sparkd.engine.kernels import act_quant, dispatch, fused, matmul, rms_norm  # noqa: E402
from sparkd.engine.kernels.family import KernelArgumentError  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv, sum_parts  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402

ROWS, GROUPS = 19, 6
TILE = GemvConfig(block_n=16, num_warps=1, unroll=1)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q6_K], ids=lambda t: t.name)  # integer and float kernels
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemv_parts_summed_in_order_are_the_kernel_fold(backend, qtype):
    cols = GROUPS * 256
    raw = random_blocks(qtype, ROWS * cols // dispatch.FAMILIES[qtype].block_values).to(backend)
    x = torch.randn(cols, device=backend)
    for split in range(1, GROUPS + 1):
        cfg = dataclasses.replace(TILE, split=split)
        parts = gemv(raw, qtype, (ROWS, cols), x, config=cfg, parts=True)
        assert parts.shape == (split, ROWS)
        assert torch.equal(sum_parts(parts), gemv(raw, qtype, (ROWS, cols), x, config=cfg)), split
    # no ordered split: y itself, one row (atomic adds, written into out)
    out = torch.empty(ROWS, device=backend)
    y = gemv(raw, qtype, (ROWS, cols), x, config=dataclasses.replace(TILE, split=3, atomic=True), out=out, parts=True)
    assert y.shape == (1, ROWS) and y.data_ptr() == out.data_ptr()


def test_gemv_parts_refuses_an_unknown_fold():
    raw = random_blocks(T.Q8_0, 16 * 256 // 32)
    with pytest.raises(KernelArgumentError, match="fold 'atomics' is not one of"):
        gemv(raw, T.Q8_0, (16, 256), torch.randn(256), config=GemvConfig(fold="atomics"), parts=True)


@pytest.mark.parametrize("fmt", [None, act_quant.Q8_0, act_quant.Q8_K])
@pytest.mark.parametrize("backend", BACKENDS)
def test_add_norm_of_parts_equals_fold_then_add_norm(backend, fmt):
    cols = 2048 if backend == "cuda" else 768  # 768: masked tail blocks
    x, h, w = (t.to(backend) for t in awkward_rows(5, cols, 4))
    x = x[-1:]  # one row (the last: its ties), h's 5 rows its partials
    for n in (1, 2, 3, 5):
        parts = h[:n].contiguous()
        if fmt is None:
            got, want = rms_norm.add_rms_norm(x, parts, w, 1e-6, parts=True), rms_norm.add_rms_norm(
                x, sum_parts(parts)[None], w, 1e-6)
        else:
            got = rms_norm.add_rms_norm_quant(x, parts, w, 1e-6, fmt, parts=True)
            want = rms_norm.add_rms_norm_quant(x, sum_parts(parts)[None], w, 1e-6, fmt)
            assert_same_quant(got[2], want[2], fmt)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), n


def test_add_norm_of_parts_refuses_bad_shapes():
    w = torch.randn(256)
    with pytest.raises(KernelArgumentError, match=r"on partials: need x one row .* x torch.float32 \[2, 256\]"):
        rms_norm.add_rms_norm(torch.randn(2, 256), torch.randn(3, 256), w, 1e-6, parts=True)
    with pytest.raises(KernelArgumentError, match=r"h torch.float32 \[3, 128\]"):
        rms_norm.add_rms_norm_quant(torch.randn(1, 256), torch.randn(3, 128), w, 1e-6, act_quant.Q8_0, parts=True)
    with pytest.raises(KernelArgumentError, match=r"h torch.float32 \[0, 256\]"):
        rms_norm.add_rms_norm(torch.randn(1, 256), torch.randn(0, 256), w, 1e-6, parts=True)


# attention's output projection 512 wide (2 groups: 2 ranges where every group is its own range);
# Q4_K: rows of 256 (the tiled layout), its pairx step (GPU only: slow in the interpreter)
SHAPES = {"Q8_0": TINY["qwen3moe"].replace(n_head=4, head_dim=128, n_layer=1),
          "Q4_K": TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256, n_head=4, head_dim=128, n_layer=1)}
WITHOUT = ",".join(k for k in fused.KERNELS if k != "norm_fold")


@pytest.mark.parametrize("quant", ["Q8_0", pytest.param("Q4_K", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_static_step_with_norm_fold_gives_the_in_launch_folds_bits(tmp_path, backend, quant, monkeypatch):
    """A model whose GEMVs split every group into its own range: the static step (a graph on CUDA)
    with norm_fold against without, the same logits bits; the norm did add 2 partials."""
    if quant == "Q4_K" and backend == "cpu":
        pytest.skip("the tiled Q4_K step runs on the GPU only here (interpreter: minutes)")
    monkeypatch.setattr(matmul, "split_for", lambda cfg, rows, groups, device=None, rule=None: groups)
    path = write_model(tmp_path / "m.gguf", plan(SHAPES[quant], quant), seed=7)[0]
    seen = []
    launch = rms_norm._launch

    def spy(x, h, weight, eps, fmt=None, parts=False):
        seen.append(h.shape[0] if parts else 0)
        return launch(x, h, weight, eps, fmt, parts)
    monkeypatch.setattr(rms_norm, "_launch", spy)
    m = load_model(path, device=backend, kernels=True)
    rows = {}
    try:
        for spec in ("all", WITHOUT):
            before = fused.configure(spec, on_cpu=backend == "cpu")
            try:
                cache = m.net.new_cache(16)
                logits = m.net(torch.tensor([1, 5, 9]), cache)
                step = StaticDecode(m.net, cache, graphs=backend == "cuda", first_bucket=4)
                got = []
                for _ in range(3):
                    logits = step(int(logits[-1].argmax()))
                    got.append(logits[-1].cpu())
                rows[spec] = torch.stack(got)
            finally:
                fused.configure(before)
            seen.append(spec)
    finally:
        m.close()
    assert torch.equal(rows["all"], rows[WITHOUT])
    on = seen[:seen.index("all")]
    assert 2 in on and 2 not in seen[seen.index("all") + 1:]
