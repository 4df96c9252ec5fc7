"""bench/q4t_tma.py's load-only twins (session 8) read exactly the bytes of their program's tile and K range:
the TMA descriptors' strides and boxes, the pointer control and x's descriptor, at a split with 4 groups a
step and one with 1. Interpreter where there is no GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script
from test_kernels import BACKENDS

from sparkd.engine.kernels import act_quant, matmul

tma = load_bench_script("q4t_tma.py")


def expected(w: torch.Tensor, qx: act_quant.QuantX, rows: int, groups: int, split: int) -> torch.Tensor:
    """Per row: over its program's ranges, (every word of the tile's qs and headers of the range's groups +
    x's words and sums of those groups) x the range's summed scales, by the tiled layout's definition."""
    tiles = w.view(torch.int32).long().reshape(rows // 4, 144 * groups)
    per = -(-groups // split)
    y = torch.zeros(rows // 4, dtype=torch.float64)
    for part in range(split):
        gs = range(part * per, min((part + 1) * per, groups))
        qs = sum(tiles[:, 128 * g:128 * (g + 1)].sum(1) for g in gs)
        hd = sum(tiles[:, 128 * groups + 16 * g:128 * groups + 16 * (g + 1)].sum(1) for g in gs)
        xs = sum(int(qx.words[0, 64 * g:64 * (g + 1)].sum() + qx.sums[0, 8 * g:8 * (g + 1)].sum()) for g in gs)
        y += (qs + hd + xs).double() * float(qx.scales[0, part * per:part * per + len(gs)].sum())
    return y.repeat_interleave(4).float()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cols", [2048, 1536], ids=["4-a-step", "1-a-step"])
def test_twins_sum_exactly_their_tiles_bytes(backend, cols):
    rows, groups = 8, cols // 256
    # words of one low byte: every sum stays an exact float32 integer, so a word missed or read twice shows
    w = (torch.randint(0, 256, (rows * groups * 144,), dtype=torch.uint8).view(torch.int32) & 0xFF)
    w = w.view(torch.uint8).to(backend)
    qx = act_quant.QuantX(torch.randint(0, 256, (1, cols // 4), dtype=torch.int32, device=backend),
                          torch.ones(1, groups, device=backend),
                          torch.randint(0, 256, (1, cols // 32), dtype=torch.int32, device=backend))
    split = matmul.split_for(matmul.GEMV_TILES["Q4_K_TILED"], rows, groups, backend)
    assert split == 2 and tma.unroll_for(groups, split) == (4 if cols == 2048 else 1)
    want = expected(w.cpu(), qx, rows, groups, split)
    for loads in tma.LOADS:
        y = torch.full((rows,), float("nan"), device=backend)
        tma.gemv(loads, w, rows, cols, qx, y)
        assert torch.equal(y.cpu(), want), loads
