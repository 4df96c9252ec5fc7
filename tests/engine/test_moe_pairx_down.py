"""Session 21 (down49): the pairx (Q4_K_TILED) MoE down's loop with the next step's words loaded before this step's
dots (q4_k_pair.down_sums, Kernels.pairx_down_ahead; the default from width 2048, on its 2-range tile below 4096) gives
the grid loop's y bits (each thread's shares in idot's order, the expert's row sums times its weight in expert order,
the ranges folded as before), and two ranges folded by matmul.fold_pair give fold_part's; session 48: with its first
step's weight words loaded before its PDL wait (Kernels.down_early) too. Interpreter where there is no GPU (small shapes), compiled with the marker gpu
at the decode shapes, on offsets of 16 bytes as the engine's tables."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, arena_table  # noqa: E402
from test_moe_tiles import on_16_bytes  # noqa: E402

from sparkd.engine.kernels import moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402
from sparkd.engine.kernels.moe_tiles import Kernels  # noqa: E402


def test_the_pairx_down_ahead_runs_on_the_one_warp_4_row_tile_in_whole_steps_of_1_to_3_groups():
    k, tile = Kernels(), GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True, split=2)
    assert moe._pairx_ahead_ok(True, k, tile, 4096, 1536)
    assert moe._pairx_ahead_ok(True, k, GemvConfig(block_n=4, unroll=3, elementwise=True, split=4), 2048, 768)
    assert not moe._pairx_ahead_ok(False, k, tile, 4096, 1536)  # off
    assert not moe._pairx_ahead_ok(True, Kernels(down_full=()), tile, 4096, 1536)  # the run-time loop
    assert not moe._pairx_ahead_ok(True, k, GemvConfig(block_n=4, unroll=4, elementwise=True, split=2), 4096, 2048)
    assert not moe._pairx_ahead_ok(True, k, GemvConfig(block_n=4, unroll=3, elementwise=True, split=2), 4096, 2048)



def test_the_pairx_down_runs_ahead_from_width_2048_on_its_2_range_tile_below_4096_and_switches_off(monkeypatch):
    """"auto": the loads ahead from width 2048 (session 48, with the early weight words); PAIRX_DOWN_TILE at 2048-4095
    where an expert's row is whole 3-group steps (where it won on the H200), the pair fold there; elsewhere, with
    "off" and in the older tile sets the 4-range tile."""
    def tables(dim, width):
        return moe.prepare(moe.tiled_down(arena_table(T.Q8_0, T.Q4_K, dim, width, 1, "cpu")[0]), "cpu")
    assert [moe_tiles.pairx_down(d) for d in (1024, 2048, 3072, 4096, 7168)] == [False, True, True, True, True]
    assert Kernels().pairx_down_ahead is None and moe_tiles.pair_fold(2048, "Q4_K_TILED")
    assert all(moe_tiles.decode_kernels(w).pairx_down_ahead is False for w in moe_tiles.TILE_SETS if w != "new")
    p = tables(2048, 768)
    assert moe_tiles.pairx_down_fits(p) and moe_tiles.decode_tiles(p)[1] == moe_tiles.PAIRX_DOWN_TILE
    assert moe._pairx_ahead_ok(True, Kernels(), moe_tiles.PAIRX_DOWN_TILE, 2048, 768)
    assert moe_tiles.decode_tiles(p, "s14")[1] == moe_tiles.TILED_DOWN
    for dim, width in ((1024, 768), (2048, 512), (4096, 1536)):  # below, not whole steps, above
        q = tables(dim, width)
        assert not moe_tiles.pairx_down_fits(q) and moe_tiles.decode_tiles(q)[1] == moe_tiles.decode_tiles(q, "s14")[1]
    gguf = moe.prepare(arena_table(T.Q8_0, T.Q4_K, 2048, 768, 1, "cpu")[0], "cpu")  # GGUF rows: as before
    assert not moe_tiles.pairx_down_fits(gguf)
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_PAIRX_DOWN"):
        moe_tiles.pairx_down(2048, "on")
    monkeypatch.setattr(moe_tiles, "PAIRX_DOWN", "off")
    assert not moe_tiles.pairx_down_fits(p) and moe_tiles.decode_tiles(p)[1] == moe_tiles.TILED_DOWN


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pairx_down_ahead_and_pair_fold_give_the_grid_loops_bits(backend):
    # (unroll, split) by (dim, width, n); the interpreter: 5 experts in 4 ranges of 2 (the last empty), one range,
    # two ranges (the pair fold)
    cases = {(32, 768, 5): [(1, 4), (3, 1), (1, 2)]} if backend == "cpu" else {
        (4096, 1536, 8): [(2, 4), (2, 2), (3, 2), (1, 2)], (2048, 768, 8): [(3, 4), (3, 2)]}
    loop = Kernels(down_pair_fold=False, pairx_down_ahead=False)
    for (dim, width, n), downs in cases.items():
        table = arena_table(T.Q8_0 if backend == "cpu" else T.Q4_K, T.Q4_K, dim, width, n, backend)[0]  # (32 wide)
        p = moe.prepare(moe.tiled_down(on_16_bytes(table) if backend == "cuda" else table), backend)
        w, res = torch.rand(n, device=backend), torch.randn(dim, device=backend)
        h = torch.randn(n, width, device=backend)  # quantized by the down's call as the engine's h
        for i, (unroll, split) in enumerate(downs):
            dn = GemvConfig(block_n=4, num_warps=1, unroll=unroll, elementwise=True, split=split)
            assert moe._pairx_ahead_ok(True, loop, dn, dim, width), (dim, dn)
            ons = [Kernels(pairx_down_ahead=True, down_pair_fold=False)] + (
                # (under PDL only: the interpreter runs the same code either way)
                [Kernels(pairx_down_ahead=True, down_pair_fold=False, down_early=True)] if backend == "cuda" else []) + (
                [Kernels(down_pair_fold=True), Kernels(pairx_down_ahead=True, down_pair_fold=True)] if split == 2 else [])
            for r in (None, res) if i == 0 else (None,):  # the residual at the first tile of a shape
                base, y = torch.empty(dim, device=backend), torch.empty(dim, device=backend)
                moe._down(p, h, w, base, dn, None, r, loop)
                for on in ons:
                    moe._down(p, h, w, y.fill_(float("nan")), dn, None, r, on)
                    assert torch.equal(y.view(torch.int32), base.view(torch.int32)), (dim, dn, r is None, on)


def test_the_early_down_runs_only_after_a_pairx_gate_up_where_the_down_runs_ahead(monkeypatch):
    """Session 48: moe._early keeps Kernels.down_early (None: $SPARKD_MOE_DOWN_EARLY, "auto") only where the down runs
    q4_k_pair.down_sums and the gate/up is pairx's _igate_up_kernel (which then lets the down launch after its own
    wait: pdl.py's exception); the older tile sets never; a bad switch value is refused by name."""
    tile = GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True, split=4)
    both = moe.prepare(moe.tiled_down(moe.tiled_gate_up(arena_table(T.Q4_K, T.Q4_K, 4096, 512, 1, "cpu")[0])), "cpu")
    down_only = moe.prepare(moe.tiled_down(arena_table(T.Q4_K, T.Q4_K, 4096, 512, 1, "cpu")[0]), "cpu")
    assert Kernels().down_early is None and moe_tiles.down_early()
    assert moe._early(both, tile, Kernels()).down_early is True
    assert moe._early(down_only, tile, Kernels()).down_early is False  # the GGUF gate/up
    assert moe._early(both, tile, Kernels(pairx_down_ahead=False)).down_early is False  # the grid loop
    assert moe._early(both, tile, Kernels(down_early=False)).down_early is False
    assert all(moe_tiles.decode_kernels(w).down_early is False for w in moe_tiles.TILE_SETS if w != "new")
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_DOWN_EARLY"):
        moe_tiles.down_early("on")
    monkeypatch.setattr(moe_tiles, "DOWN_EARLY", "off")
    assert moe._early(both, tile, Kernels()).down_early is False


@pytest.mark.gpu
def test_the_early_down_gives_the_layers_bits():
    """A selection's whole decode layer (pairx gate/up and down, h quantized in the gate/up launch) with the early down
    and without, under PDL (the interpreter has none): the same y bits, call after call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for dim, width, n, k in [(4096, 1536, 32, 8), (2048, 768, 32, 8)]:
        table = on_16_bytes(arena_table(T.Q4_K, T.Q4_K, dim, width, n, "cuda")[0])
        sel = moe.prepare(moe.tiled_down(moe.tiled_gate_up(table)), "cuda").select(torch.randperm(n, device="cuda")[:k])
        assert moe._early(sel, moe_tiles.decode_tiles(sel)[1], Kernels()).down_early is True
        x, w = torch.randn(dim, device="cuda"), torch.rand(k, device="cuda")
        late = moe.moe_decode(sel, x, w, kernels=Kernels(down_early=False))
        for _ in range(3):
            assert torch.equal(moe.moe_decode(sel, x, w).view(torch.int32), late.view(torch.int32)), (dim, width)
