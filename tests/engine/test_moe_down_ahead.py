"""Session 20 (moe46): the Q8_0 MoE down's loop with the next step's words loaded ahead (moe_down_ahead,
moe_tiles.Kernels.down_ahead) gives the grid kernel's y bits: each expert's groups onto its elementwise tile in the
same order, its row sums times its weight onto the range's sums in expert order, the ranges folded as before.
Interpreter where there is no GPU (small shapes), compiled with the marker gpu at the decode shapes."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, arena_table  # noqa: E402

from sparkd.engine.kernels import moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402


def test_the_down_ahead_runs_only_where_the_words_step_is_unmasked_and_elementwise():
    k, tile = moe_tiles.Kernels(), GemvConfig(block_n=2, unroll=2, elementwise=True, split=2)
    assert moe._ahead_ok(True, k, tile, True, 4096, 1536)
    assert moe._ahead_ok(True, k, dataclasses.replace(tile, unroll=3), True, 4096, 1536)
    assert not moe._ahead_ok(False, k, tile, True, 4096, 1536)  # off
    assert not moe._ahead_ok(True, k, tile, False, 4096, 1536)  # rows not on words (or not Q8_0)
    assert not moe._ahead_ok(True, k, dataclasses.replace(tile, elementwise=False), True, 4096, 1536)
    assert not moe._ahead_ok(True, k, tile, True, 4096, 1536 + 256)  # the masked step: not a whole loop step
    assert not moe._ahead_ok(True, k, dataclasses.replace(tile, unroll=6), True, 4096, 1536)  # steps of 1 to 4
    assert not moe._ahead_ok(True, moe_tiles.S6R2_KERNELS, tile, True, 4096, 1536)  # the masked step always


def test_the_down_ahead_switches_off():
    assert moe_tiles.decode_kernels("new").down_ahead is None  # by width (down_ahead)
    assert all(moe_tiles.decode_kernels(w).down_ahead is False for w in moe_tiles.TILE_SETS if w != "new")
    assert not any(moe_tiles.down_ahead(d, "off") for d in (2048, 4096, 7168))
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_DOWN_AHEAD"):
        moe_tiles.down_ahead(4096, "on")


def test_the_q8_0_down_loads_ahead_from_width_2048_below_4096_and_switches_back(monkeypatch):
    """Session 20: "auto" at model widths 2048-4095 where an expert's row is whole 3-group steps, on the tile
    Q8_0_DOWN_AHEAD (where it won on the H200); elsewhere, with "off" and in the older tile sets session 19's tile.
    Session 21: the loop at 4096-6143 too, on that width's tile (with the pair fold)."""
    def tables(dim, width):
        return moe.prepare(arena_table(T.Q8_0, T.Q8_0, dim, width, 1, "cpu")[0], "cpu")
    assert [moe_tiles.down_ahead(d) for d in (1024, 2048, 3072, 4096, 7168)] == [False, True, True, True, False]
    p, s14 = tables(2048, 768), moe_tiles.decode_tiles(tables(2048, 768), "s14")
    assert moe_tiles.ahead_tile_fits(p) and moe_tiles.decode_tiles(p) == (s14[0], moe_tiles.Q8_0_DOWN_AHEAD)
    assert moe._ahead_ok(True, moe_tiles.Kernels(), moe_tiles.Q8_0_DOWN_AHEAD, p.down_words, 2048, 768)
    for dim, width in ((1024, 768), (2048, 512), (4096, 768), (4096, 1536)):  # below, not whole steps, above
        q = tables(dim, width)
        assert not moe_tiles.ahead_tile_fits(q) and moe_tiles.decode_tiles(q)[1] == moe_tiles.decode_tiles(q, "s14")[1]
    assert not moe_tiles.ahead_tile_fits(p, "off")
    monkeypatch.setattr(moe_tiles, "DOWN_AHEAD", "off")
    assert moe_tiles.decode_tiles(p) == s14 and not moe_tiles.down_ahead(2048)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_down_ahead_gives_the_grid_kernels_bits(backend):
    """The tiles it takes (ranges folded in the launch, one range, an empty range, steps of 1 to 3 groups, 1 or 2
    warps), with and without the residual, and two ranges folded by matmul.fold_pair (session 21, moe48; other
    splits fold as before), with the loads ahead or not: y's bits as the grid kernel's."""
    # (rows, unroll, split, warps) by (dim, width, n); the interpreter: 5 experts in 4 ranges of 2, the last empty
    cases = {(32, 768, 5): [(2, 1, 4, 1), (2, 3, 1, 1), (2, 1, 2, 1)]} if backend == "cpu" else {
        (4096, 1536, 8): [(2, 2, 2, 1), (4, 2, 2, 1), (4, 2, 2, 2), (2, 2, 2, 2), (2, 3, 2, 1)],
        (7168, 2048, 8): [(2, 2, 2, 1)], (2048, 768, 8): [(2, 3, 2, 1)]}
    off = moe_tiles.Kernels(down_ahead=False, down_pair_fold=False)  # the grid kernel's loop, fold_part
    ons = [moe_tiles.Kernels(down_ahead=True, down_pair_fold=False), moe_tiles.Kernels(down_ahead=False, down_pair_fold=True),
           moe_tiles.Kernels(down_ahead=True, down_pair_fold=True)]
    for (dim, width, n), downs in cases.items():
        table = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)[0]
        p = moe.prepare(table, backend)
        w, res = torch.rand(n, device=backend), torch.randn(dim, device=backend)
        h = torch.randn(n, width, device=backend)  # quantized by the down's call as the engine's h
        for i, (rows, unroll, split, warps) in enumerate(downs):
            dn = GemvConfig(block_n=rows, num_warps=warps, unroll=unroll, elementwise=True, split=split)
            assert moe._ahead_ok(True, ons[0], dn, p.down_words, dim, width), (dim, dn)
            for r in (None, res) if i == 0 else (None,):  # the residual at the first tile of a shape
                base, y = torch.empty(dim, device=backend), torch.empty(dim, device=backend)
                moe._down(p, h, w, base, dn, None, r, off)
                for on in ons:
                    moe._down(p, h, w, y.fill_(float("nan")), dn, None, r, on)
                    assert _bits(y, base), (dim, dn, r is None, on)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_pair_fold_runs_by_down_type_and_width_and_switches_off(monkeypatch):
    """Session 21 (moe48, down49): matmul.fold_pair where it won on the H200 (Q8_0 at 2048x768, 4096x1536 and
    7168x2048; the pairx down's 2-range tile at 2048x768), fold_part elsewhere (Q4_K's 2-range downs from 6144 were not
    measured), with "off" and in the older tile sets."""
    widths = (1024, 2048, 4095, 4096, 6144, 7168, 8192)
    assert [moe_tiles.pair_fold(d) for d in widths] == [False] + [True] * 5 + [False]
    assert [moe_tiles.pair_fold(d, "Q4_K_TILED") for d in widths] == [False, True, True] + [False] * 4
    assert not any(moe_tiles.pair_fold(d, "Q4_K") for d in widths)
    assert not moe_tiles.pair_fold(4096, which="off") and moe_tiles.decode_kernels("new").down_pair_fold is None
    assert all(moe_tiles.decode_kernels(w).down_pair_fold is False for w in moe_tiles.TILE_SETS if w != "new")
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_PAIR_FOLD"):
        moe_tiles.pair_fold(4096, which="on")
    monkeypatch.setattr(moe_tiles, "PAIR_FOLD", "off")
    assert not moe_tiles.pair_fold(4096)
