"""bench/q4t_pair.py (session 8, q4k19): the pair tile (2 rows a thread, 16 lanes along K) gives the GGUF step's
values within the float bound (q4_k's integer sums, another float order: per thread and row, then over the 16
threads of a row pair), at 2 groups a step with a masked half step and over split-K ranges; and its load-only
twin reads every byte of the tile's range exactly as often as its loads say (a byte missed changes the sum)."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script
from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err

from sparkd.engine.kernels import act_quant, matmul

pair = load_bench_script("q4t_pair.py")  # (imports bench/q4t_relaid: PYTHONPATH has bench/)


@pytest.mark.parametrize("mode", ["pair", "pairx"])
@pytest.mark.parametrize("cols", [768, 2048], ids=["split-1-masked", "split-2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pair_steps_give_the_gguf_values(backend, cols, mode):
    rows = 8
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    data = pair.pack_raw(raw, (rows, cols))
    assert data.numel() == raw.numel() and not torch.equal(data, raw)
    x = torch.randn(cols, device=backend)
    qx = act_quant.quantize(x[None], act_quant.Q8_K)
    split = matmul.split_for(matmul.GEMV_TILES["Q4_K_TILED"], rows, cols // 256, backend)
    assert split == (1 if cols == 768 else 2)
    y = torch.full((rows,), float("nan"), device=backend)
    pair.gemv(mode, data, rows, cols, qx, y)
    W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
    assert rel_err(y.cpu(), W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pair_twin_reads_each_byte_of_its_range(backend):
    rows, cols, groups = 4, 512, 2
    w = (torch.randint(0, 256, (rows * groups * 144,), dtype=torch.uint8).view(torch.int32) & 0xFF)
    qx = act_quant.QuantX(torch.zeros(1, cols // 4, dtype=torch.int32, device=backend),
                          torch.ones(1, groups, device=backend),
                          torch.zeros(1, cols // 32, dtype=torch.int32, device=backend))
    y = torch.empty(rows, device=backend)
    pair.gemv("pair-loadonly", w.view(torch.uint8).to(backend), rows, cols, qx, y)
    qs, hd = w.long()[:groups * 128].reshape(groups, 16, 2, 4), w.long()[groups * 128:].reshape(groups, 16)
    # per group and row 2p + r: the 64 words of pair p (threads 2c + p) + 16 threads' d of the row and their
    # scale words (each sub-block's twice, each mn word 4 times)
    want = sum(qs[g, :, :, :].sum((0, 2)).repeat_interleave(2) + 16 * hd[g, :4] + 2 * hd[g, 4:12].sum()
               + 4 * hd[g, 12:].sum() for g in range(groups))
    assert torch.equal(y.cpu(), want.float())
