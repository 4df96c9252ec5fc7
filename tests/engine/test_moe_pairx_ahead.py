"""Session 19 (moe43): the pairx step handed its 4-row tile (q4_k_pair.idot finds it from the rows' offsets, not
the program id), and the pairx gate/up with each group's loads issued 1 or 2 groups before its dots
(q4_k_pair.gate_up, Kernels.pairx_ahead): the same h and y bits as the idot loop. Interpreter where there is no
GPU (a few 4-row tiles), compiled with the marker gpu at the engine's widths."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from test_kernels import BACKENDS, arena_table, random_blocks  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch, moe, moe_tiles, q4_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, int_args, row_idot  # noqa: E402

ONE_TILE = GemvConfig(block_n=4, num_warps=1, unroll=1)  # the pairx step's tile


@triton.jit
def _reversed_kernel(w_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, K, row_bytes, IDOT: tl.constexpr, A1: tl.constexpr,
                     A2: tl.constexpr, A3: tl.constexpr, EMU: tl.constexpr):
    """The one-tile GEMV with program i on the last tile but i: a grid that is not the tiles' order."""
    rows = (tl.num_programs(0) - 1 - tl.program_id(0)) * 4 + tl.arange(0, 4)
    y = row_idot(w_ptr, rows.to(tl.int64) * row_bytes, rows >= 0, xw_ptr, xd_ptr, xs_ptr, K, 0, 1, IDOT, A1, A2, A3,
                 1, True, EMU, None)
    tl.store(y_ptr + rows, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pairx_step_sums_the_tile_it_is_handed(backend):
    rows, cols = (16, 512) if backend == "cpu" else (1536, 4096)
    w = q4_k_tiled.pack(random_blocks(T.Q4_K, rows * cols // 256).to(backend), (rows, cols), loads="pairx")
    x = torch.randn(cols, device=backend)
    fam = q4_k_tiled.FAMILIES["pairx"]
    want = q4_k_tiled.gemv(w, x, config=ONE_TILE, loads="pairx")  # the engine's grid: program i on tile i
    q = act_quant.quantize(x[None], fam.act_fmt)
    y = torch.empty(rows, device=backend)
    _reversed_kernel[(rows // 4,)](w.data, q.words, q.scales, q.sums, y, cols, cols // 256 * 144,
                                   EMU=backend == "cpu", num_warps=1, **int_args(fam))
    assert torch.equal(y, want)


def tiled_table(backend: str, dim: int, width: int, n: int, tiled_down: bool):
    """A Q4_K table with gate/up (and the down if tiled_down) in the pairx bytes, as the engine repacks them."""
    table = moe.tiled_gate_up(arena_table(T.Q4_K, T.Q4_K, dim, width, n, backend)[0])
    return moe.prepare(moe.tiled_down(table) if tiled_down else table, backend)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_loads_ahead_give_the_idot_loops_bits(backend, ahead):
    """h (rounded and not) and y of the gate/up with loads ahead, then of the down with loads ahead too (pairx
    downs on the constant trip count: Q4_KXD), bit for bit the idot loops'."""
    # the interpreter runs programs one by one: few 4-row tiles, a down of one group a row (each step another
    # expert); the GPU: Q4_KX at Qwen3-30B-A3B's shape, Q4_KXD at 4096 (the default tiles)
    one = GemvConfig(block_n=4, num_warps=1, unroll=1, split=2)
    shapes = [(512, 256, 2, True, one)] if backend == "cpu" else [(2048, 768, 8, False, None),
                                                                  (4096, 1536, 8, True, None)]
    for dim, width, n, d_tiled, down in shapes:
        p = tiled_table(backend, dim, width, n, d_tiled)
        x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
        gate_up = dataclasses.replace(moe_tiles.decode_tiles(p)[0], fuse_quant=True)
        loop = moe_tiles.Kernels(pairx_ahead=0, pairx_down_ahead=0)
        early = dataclasses.replace(loop, pairx_ahead=ahead)
        both = dataclasses.replace(early, pairx_down_ahead=1)
        assert moe.pairx_ahead(p, early) == ahead and moe.pairx_ahead(p, loop) == 0
        ng = width // 256 if d_tiled else 0  # where the down runs q4_k_pair.down
        assert moe.pairx_down_ahead(p, both, ng) == (1 if d_tiled else 0)
        for rounded in (False, True):
            assert torch.equal(moe.down_input(p, x, kernels=early, rounded=rounded),
                               moe.down_input(p, x, kernels=loop, rounded=rounded))
        ys = [moe.moe_decode(p, x, w, gate_up=gate_up, down=down, kernels=k) for k in (loop, early, both, both)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])


def test_loads_ahead_only_on_pairx_rows_and_by_the_switch(monkeypatch):
    gguf = moe.prepare(arena_table(T.Q4_K, T.Q8_0, 512, 32, 2, "cpu")[0], "cpu")
    assert moe.pairx_ahead(gguf, moe_tiles.Kernels(pairx_ahead=2)) == 0
    assert moe.pairx_down_ahead(gguf, moe_tiles.Kernels(pairx_down_ahead=1), 2) == 0
    assert moe_tiles.pairx_ahead_at(2048, "0") == (0, 0) and moe_tiles.pairx_ahead_at(2048, "2") == (2, 1)
    for dim in (2048, 4096, 7168):
        gate_up, down = moe_tiles.pairx_ahead_at(dim, "auto")
        assert gate_up in (0, 1, 2) and down in (0, 1)
    monkeypatch.setattr(moe_tiles, "PAIRX_AHEAD", "0")
    assert moe_tiles.pairx_ahead_at(4096) == (0, 0)
    with pytest.raises(dispatch.KernelArgumentError, match="SPARKD_MOE_PAIRX_AHEAD"):
        moe_tiles.pairx_ahead_at(4096, "3")
