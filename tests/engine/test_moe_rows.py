"""Session 8 (moe17): moe_rows, the Q8_0 down with the selected experts as rows of one program's
tile and no fold, gives the bits of moe._idown_kernel with one expert per range (split == A, the
default tiles' 8 ranges at top-8), with the residual, with a selection (ids), on both tiles
(per group and elementwise) and where the shape needs masks; moe.rows_fit's rule. Interpreter
where there is no GPU, compiled with the marker gpu."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, arena_table, moe_error  # noqa: E402

from sparkd.engine.kernels import act_quant, moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

CASES = [pytest.param("cpu", id="interpret", marks=BACKENDS[0].marks),
         pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
ROWS, FOLD = moe_tiles.Kernels(down_rows=True), moe_tiles.Kernels()


def test_rows_fit_needs_a_power_of_two_of_experts_and_ordered_sums():
    tile = GemvConfig(block_n=1)
    assert moe.rows_fit(8, tile) and moe.rows_fit(4, tile) and moe.rows_fit(16, tile)
    assert not moe.rows_fit(6, tile) and not moe.rows_fit(32, tile) and not moe.rows_fit(0, tile)
    assert not moe.rows_fit(8, GemvConfig(block_n=1, atomic=True))
    assert not moe_tiles.Kernels().down_rows


def _downs(p, q, w, dim, tiles, backend, residual=None):
    """y of each (down tile, kernels) on one quantized h."""
    ys = []
    for dn, k in tiles:
        y = torch.full((dim,), float("nan"), device=backend)
        moe._down(p, q, w, y, dn, None, residual, k)
        ys.append(y)
    return ys


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", CASES)
def test_experts_as_rows_give_the_folds_bits(backend):
    # the interpreter runs programs one by one: few rows, one or two groups a row
    dim, width, n = (32, 512, 4) if backend == "cpu" else (2048, 768, 8)
    table, gates, ups, downs = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)
    p = moe.prepare(table, backend)
    assert p.down_words
    w = torch.rand(n, device=backend)
    q = act_quant.quantize(torch.randn(n, width, device=backend), p.down.act_fmt)
    res = torch.randn(dim, device=backend)
    # (per-group or elementwise tile, groups a step, rows of each expert a program, residual)
    for ew, unroll, rows, r in ((False, 1, 1, res), (True, 2, 4, None), (False, 2, 2, None), (True, 1, 1, res)):
        fold = GemvConfig(block_n=4, num_warps=1, unroll=unroll, elementwise=ew, split=n)
        tile = dataclasses.replace(fold, block_n=rows, split=0)
        want, got = _downs(p, q, w, dim, ((fold, FOLD), (tile, ROWS)), backend, r)
        assert torch.equal(got, want), (ew, unroll, rows, r is None)
    # a selection of the table (ids), in another order
    ids = torch.arange(n - 1, -1, -1, device=backend)
    sel = p.select(ids)
    fold = GemvConfig(block_n=4, unroll=1, elementwise=False, split=n)
    tile = GemvConfig(block_n=2, unroll=1, elementwise=False)
    want, got = _downs(sel, q, w, dim, ((fold, FOLD), (tile, ROWS)), backend)
    assert torch.equal(got, want)
    if backend == "cpu":
        return
    # the engine's call on the rows tile, near the reference
    x, gu = torch.randn(dim, device=backend), dataclasses.replace(moe_tiles.decode_tiles(p)[0], fuse_quant=True)
    y = moe.moe_decode(p, x, w, gate_up=gu, down=GemvConfig(block_n=1, unroll=1, elementwise=False), kernels=ROWS)
    assert moe_error(y, p, x, w, gates, ups, downs, "silu", T.Q8_0, T.Q8_0, gu, ROWS) < BOUNDS["fp32"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend", CASES)
def test_rows_where_the_shape_needs_masks(backend):
    # 3 groups a row at two groups a step: the masked step
    dim, width, n = 32, 768, 2
    table, *_ = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)
    p = moe.prepare(table, backend)
    q = act_quant.quantize(torch.randn(n, width, device=backend), p.down.act_fmt)
    w = torch.rand(n, device=backend)
    fold = GemvConfig(block_n=4, unroll=2, elementwise=False, split=n)
    tile = GemvConfig(block_n=4, unroll=2, elementwise=False)
    assert not moe._full(dim, width, tile)
    want, got = _downs(p, q, w, dim, ((fold, FOLD), (tile, ROWS)), backend)
    assert torch.equal(got, want)
