"""bench/q4t_relaid.py (session 8, q4k18): the re-laid Q4_K tile (a thread's 4 rows' words and its own 2 x words)
gives the GGUF step's values within the float bound (its integer sums are q4_k's, the float order is another:
per thread and row, then over the 32 threads), at 2 groups a step with a masked half step and over split-K ranges;
and its load-only twin reads every byte of the tile's range once (a byte missed or read twice changes the sum)."""

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

relaid = load_bench_script("q4t_relaid.py")


@pytest.mark.parametrize("cols", [768, 2048], ids=["split-1-masked", "split-2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_relaid_step_gives_the_gguf_values(backend, cols):
    rows = 8
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    data = relaid.pack_raw(raw, (rows, cols))
    assert data.numel() == raw.numel() and not torch.equal(data, raw)
    x = torch.randn(cols, device=backend)
    qx = act_quant.quantize(x[None], act_quant.Q8_K)
    split = matmul.split_for(matmul.GEMV_TILES["Q4_K_TILED"], rows, cols // 256, backend)
    assert split == (1 if cols == 768 else 2)
    y = torch.full((rows,), float("nan"), device=backend)
    relaid.gemv("relaid", data, rows, cols, qx, y)
    W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
    assert rel_err(y.cpu(), W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_relaid_twin_reads_each_byte_of_its_range_once(backend):
    rows, cols, groups = 4, 512, 2
    w = (torch.randint(0, 256, (rows * groups * 144,), dtype=torch.uint8).view(torch.int32) & 0xFF)
    qx = act_quant.QuantX(torch.zeros(1, cols // 4, dtype=torch.int32, device=backend),
                          torch.ones(1, groups, device=backend),
                          torch.zeros(1, cols // 32, dtype=torch.int32, device=backend))
    y = torch.empty(rows, device=backend)
    relaid.gemv("relaid-loadonly", w.view(torch.uint8).to(backend), rows, cols, qx, y)
    qs, hd = w.long()[:groups * 128].reshape(groups, 32, 4), w.long()[groups * 128:].reshape(groups, 16)
    # per group: each row's 32 words + (d of the row, 32 x) + (sc, mn words) once per thread
    want = sum(qs[g].sum(0) + 32 * hd[g, :4] + 4 * hd[g, 4:12].sum() + 8 * hd[g, 12:].sum() for g in range(groups))
    assert torch.equal(y.cpu(), want.float())
