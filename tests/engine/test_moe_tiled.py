"""Session 9 (moe20): the MoE decode's gate/up on experts repacked into the tiled Q4_K GEMV's bytes
(moe.tiled_gate_up: q4_k_tiled.pack_raw per gate and up matrix, in place; pairx by default), the down on
GGUF blocks; session 10 (moe21): the down repacked the same way (moe.tiled_down). The pairx step makes q4_k's integer sums in another float order: within the fp32 bound of the
float64 reference over the engine's own h (moe_error), the same bits run to run, on 4-byte and 16-byte
offsets and on a selection of the table. Interpreter where there is no GPU, compiled with the marker gpu."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, arena_table, moe_error  # noqa: E402
from test_moe_tiles import on_16_bytes  # noqa: E402

from sparkd.engine.kernels import dispatch, moe, moe_prefill, moe_tiles, q4_k_pair, q4_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

ONE_TILE = GemvConfig(block_n=4, num_warps=1, unroll=1)  # the pairx step's tile
# the interpreter runs programs one by one: a wide down tile
DOWN = {"cpu": GemvConfig(block_n=64, num_warps=1, unroll=2, split=2), "cuda": None}


def assert_selection_gives_the_sub_tables_bits(tiled, p, x, w, tiles, backend):
    """A selection of the table (ids read by the kernels: its last expert, then its first) gives the bits
    of the sub-table made of those two experts' offsets."""
    pick = (len(tiled.gate_offsets) - 1, 0)
    sub = moe.prepare(dataclasses.replace(tiled, gate_offsets=[tiled.gate_offsets[i] for i in pick],
                                          up_offsets=[tiled.up_offsets[i] for i in pick],
                                          down_offsets=[tiled.down_offsets[i] for i in pick]), backend)
    w2 = w[:2].contiguous()
    ids = torch.tensor(pick, device=backend)
    assert torch.equal(moe.moe_decode(p.select(ids), x, w2, **tiles), moe.moe_decode(sub, x, w2, **tiles))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("align", [4, 16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_gate_up_within_the_fp32_bound(backend, align):
    if backend == "cpu" and align == 16:
        pytest.skip("the interpreter runs the arena's own 4-byte offsets only (~1 min a case); the GPU runs both")
    # the interpreter runs programs one by one: few 4-row tiles (a Q8_0 down lets the experts be 32 rows)
    dim, width, n, down = (512, 32, 2, T.Q8_0) if backend == "cpu" else (2048, 768, 8, T.Q4_K)
    table, gates, ups, downs = arena_table(T.Q4_K, down, dim, width, n, backend)
    table = on_16_bytes(table) if align == 16 else table
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    gguf = moe.moe_decode(moe.prepare(table, backend), x, w, gate_up=ONE_TILE, down=DOWN[backend])
    before = table.gate.clone()
    tiled = moe.tiled_gate_up(table)
    assert tiled.gate_up_type == q4_k_tiled.TILED and tiled.down_type == down
    span, d_span = width * dispatch.FAMILIES[T.Q4_K].row_bytes(dim), dim * dispatch.FAMILIES[down].row_bytes(width)
    for o in tiled.down_offsets:  # the downs as they were, the gate/up matrices repacked
        assert torch.equal(tiled.down[o:o + d_span], before[o:o + d_span])
    assert not torch.equal(tiled.gate[tiled.gate_offsets[0]:][:span], before[table.gate_offsets[0]:][:span])
    p = moe.prepare(tiled, backend)
    tile = moe_tiles.PAIRX_GATE_UP if moe_tiles.pairx_steps(dim) else moe_tiles.DECODE_TILES["Q4_K_TILED"][0]
    assert p.gate_up_vec == (align == 16) and moe_tiles.decode_tiles(p)[0] == tile
    tiles = dict(gate_up=dataclasses.replace(ONE_TILE, fuse_quant=True), down=DOWN[backend])
    ys = [moe.moe_decode(p, x, w, **tiles) for _ in range(2)]
    assert torch.equal(ys[0], ys[1])
    err = moe_error(ys[0], p, x, w, gates, ups, downs, "silu", T.Q4_K, down, tiles["gate_up"])
    assert err < BOUNDS["fp32"]
    assert torch.allclose(ys[0], gguf, rtol=1e-4, atol=1e-4 * float(gguf.abs().max()))
    assert_selection_gives_the_sub_tables_bits(tiled, p, x, w, tiles, backend)


def test_tiled_gate_up_refuses_what_it_cannot_run():
    table = arena_table(T.Q8_0, T.Q8_0, 256, 32, 1, "cpu")[0]
    with pytest.raises(dispatch.KernelArgumentError, match="needs Q4_K gate/up"):
        moe.tiled_gate_up(table)
    tiled = moe.tiled_gate_up(arena_table(T.Q4_K, T.Q8_0, 256, 32, 1, "cpu")[0])
    p = moe.prepare(tiled, "cpu")
    x, w = torch.randn(256), torch.rand(1)
    with pytest.raises(dispatch.KernelArgumentError, match="elementwise tile of 4 rows on 1 warp"):
        moe.moe_decode(p, x, w, gate_up=GemvConfig(block_n=64), down=DOWN["cpu"])
    with pytest.raises(dispatch.KernelArgumentError, match="needs a Q4_K down"):
        moe.tiled_down(table)
    down = moe.tiled_down(arena_table(T.Q8_0, T.Q4_K, 32, 256, 1, "cpu")[0])
    with pytest.raises(dispatch.KernelArgumentError, match="needs whole tiles .* 34 down rows, tiles of 4"):
        moe.prepare(dataclasses.replace(down, dim=34), "cpu")
    with pytest.raises(dispatch.KernelArgumentError, match="elementwise tile of 4 rows on 1 warp"):
        moe.moe_decode(moe.prepare(down, "cpu"), torch.randn(32), w, down=GemvConfig(block_n=8))


def test_tiled_gate_up_prefill_and_round_trip():
    """moe_prefill's per-expert GEMM on the repacked gate/up dequantizes to q4_k's values (the GGUF table's bits,
    the float GEMM and the integer one),
    and q4_k_pair.unpack_raw gives the file's blocks back (store.get's fallback)."""
    table = arena_table(T.Q4_K, T.Q8_0, 256, 32, 3, "cpu")[0]
    before = table.gate.clone()
    x, slots, w = torch.randn(2, 256), torch.tensor([[0, 2], [1, 0]]), torch.rand(2, 2)
    want = {p: moe_prefill.moe_prefill(table, x, slots, w, precision=p) for p in ("ieee", "int8")}
    tiled = moe.tiled_gate_up(table)
    for p in want:  # int8: q4_k_pair.iblock's quants, scales and mins are q4_k.iblock's
        assert torch.equal(moe_prefill.moe_prefill(tiled, x, slots, w, precision=p), want[p])
    span = 32 * dispatch.FAMILIES[T.Q4_K].row_bytes(256)
    for o in [*tiled.gate_offsets, *tiled.up_offsets]:
        assert torch.equal(q4_k_pair.unpack_raw(tiled.gate[o:o + span], (32, 256)), before[o:o + span])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_down_within_the_fp32_bound(backend):
    """The down on the pairx bytes (moe.tiled_down; on the GPU with the gate/up tiled too, as the engine loads
    them): within the fp32 bound of the float64 reference over the engine's own h; moe_prefill on the repacked
    down gives the GGUF table's bits and q4_k_pair.unpack_raw the file's blocks (store.get's fallback). On the
    GPU also: within 1e-4 of the GGUF step, the same bits run to run, a selection gives the sub-table's bits."""
    gpu = backend == "cuda"
    # the interpreter (~1 s a program): a Q8_0 gate/up lets the model width be 32 (8 down tiles), one range
    gu_type, dim, width, n = (T.Q4_K, 2048, 768, 8) if gpu else (T.Q8_0, 32, 256, 2)
    table, gates, ups, downs = arena_table(gu_type, T.Q4_K, dim, width, n, backend)
    table = on_16_bytes(table) if gpu else table
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    gu, dn = (None, None) if gpu else (GemvConfig(block_n=64, num_warps=1, unroll=1), ONE_TILE)
    gguf = moe.moe_decode(moe.prepare(table, backend), x, w, gate_up=gu) if gpu else None
    slots, wp = torch.tensor([[0, n - 1], [n - 1, 0]], device=backend), torch.rand(2, 2, device=backend)
    xp = torch.randn(2, dim, device=backend)
    prefill = moe_prefill.moe_prefill(table, xp, slots, wp, precision="ieee")
    before = table.down.clone()
    tiled = moe.tiled_down(table)
    tiled = moe.tiled_gate_up(tiled) if gu_type == T.Q4_K else tiled
    assert tiled.down_type == q4_k_tiled.TILED
    span = dim * dispatch.FAMILIES[T.Q4_K].row_bytes(width)
    for o in tiled.down_offsets:
        assert not torch.equal(tiled.down[o:o + span], before[o:o + span])
        assert torch.equal(q4_k_pair.unpack_raw(tiled.down[o:o + span], (dim, width)), before[o:o + span])
    p = moe.prepare(tiled, backend)
    assert p.down_vec or not gpu
    # (session 21, down49: 2048-4095 wide the 2-range tile with the loads ahead, other float rounding)
    assert moe_tiles.decode_tiles(p)[1] == (moe_tiles.PAIRX_DOWN_TILE if moe_tiles.pairx_down_fits(p) else
                                            moe_tiles.TILED_DOWN)
    tiles = dict(gate_up=dataclasses.replace(gu or moe_tiles.decode_tiles(p)[0], fuse_quant=True), down=dn)
    y = moe.moe_decode(p, x, w, **tiles)
    err = moe_error(y, p, x, w, gates, ups, downs, "silu", gu_type, T.Q4_K, tiles["gate_up"])
    assert err < BOUNDS["fp32"]
    assert torch.equal(moe_prefill.moe_prefill(p, xp, slots, wp, precision="ieee"), prefill)
    if gpu:
        assert torch.equal(moe.moe_decode(p, x, w, **tiles), y)
        # session 13 (moe23): the down let launch at the gate/up's start or after its loop (PDL): the same bits
        for at_start in (True, False):
            assert torch.equal(moe.moe_decode(p, x, w, **tiles, kernels=moe_tiles.Kernels(down_at_start=at_start)), y)
        assert torch.allclose(y, gguf, rtol=1e-4, atol=1e-4 * float(gguf.abs().max()))
        assert_selection_gives_the_sub_tables_bits(tiled, p, x, w, tiles, backend)
        # 2 groups a step over 3: row_idot's masked loop (the default's 3 a step run _row_idot_full's)
        odd = dict(gate_up=tiles["gate_up"], down=GemvConfig(block_n=4, num_warps=1, unroll=2, split=2))
        y2 = moe.moe_decode(p, x, w, **odd)
        assert moe_error(y2, p, x, w, gates, ups, downs, "silu", gu_type, T.Q4_K, odd["gate_up"]) < BOUNDS["fp32"]
