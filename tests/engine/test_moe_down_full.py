"""Session 7 (moe14): Kernels.down_full (Q4_K by default since session 8; SPARKD_MOE_TILES=s7 switches back), the down's groups in a loop of constant trip count on a mask
true everywhere (moe._row_idot_full), runs where moe._full holds and gives the bits of the step it
replaces (row_idot: the same groups in the same order onto the same tile), for Q8_0 words (per-group
and elementwise tiles) and Q4_K's vector step, over one and two experts a program.
Interpreter where there is no GPU, compiled with the marker gpu."""

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


def test_down_full_is_on_for_q4_k_by_default():
    assert moe_tiles.decode_kernels("new").down_full == ("Q4_K", "Q4_K_TILED")  # the tiled down too (moe21)
    assert moe_tiles.decode_kernels("s7").down_full == ()  # the switch back
    assert moe_tiles.decode_kernels("s6r2").down_full == ()


def on_16(table: moe.ExpertTable) -> moe.ExpertTable:
    """The table's experts copied into a fresh arena at offsets on 16 bytes (arena_table pads by 4s):
    Q4_K rows then take _q4_k_vec's step, as the engine's 4 KiB slots do."""
    spans = [table.width * moe.dispatch.FAMILIES[table.gate_up_type].row_bytes(table.dim)] * 2 + \
        [table.dim * moe.dispatch.FAMILIES[table.down_type].row_bytes(table.width)]
    parts, offs, at = [], ([], [], []), 0
    for k, (buf, where) in enumerate(zip((table.gate, table.up, table.down),
                                         (table.gate_offsets, table.up_offsets, table.down_offsets))):
        for o in where:
            parts.append(buf[o:o + spans[k]])
            offs[k].append(at)
            at += -(-spans[k] // 16) * 16
            parts.append(torch.zeros(at - offs[k][-1] - spans[k], dtype=torch.uint8, device=buf.device))
    arena = torch.cat(parts)
    return dataclasses.replace(table, gate=arena, up=arena, down=arena, gate_offsets=offs[0], up_offsets=offs[1],
                               down_offsets=offs[2])


def _downs(p, q, w, dim, tile, backend):
    ys = [torch.empty(dim, device=backend) for _ in range(2)]
    # (session 20's loads ahead off: at 2048 wide it would take both Q8_0 elementwise downs)
    for y, k in zip(ys, (moe_tiles.Kernels(down_full=("Q8_0", "Q4_K"), down_ahead=False),
                         moe_tiles.Kernels(down_full=(), down_ahead=False))):
        moe._down(p, q, w, y, tile, None, None, k)
    return ys


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_constant_trip_down_gives_the_loops_bits(backend, qtype):
    # two groups a row (unroll 1 and 2), experts in one or two ranges; the interpreter runs programs
    # one by one, so few rows and tiles there
    cpu = backend == "cpu"
    dim, width, n = ((64, 512, 4) if qtype == T.Q8_0 else (256, 512, 2)) if cpu else (2048, 1536, 8)
    table, gates, ups, downs = arena_table(qtype, qtype, dim, width, n, backend)
    p = moe.prepare(on_16(table), backend)
    assert p.down_vec == (qtype == T.Q4_K)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    h = torch.randn(n, width) if cpu else moe._gate_up(p, x, w, False, "silu", moe_tiles.decode_tiles(p)[0], None,
                                                       "test", None, moe_tiles.Kernels())
    q = act_quant.quantize(h, p.down.act_fmt)
    rows = dim if cpu else 4  # the interpreter: one program per range
    if qtype == T.Q8_0:
        tiles = [(1, False, 2), (2, True, 1)] if cpu else [(u, ew, s) for u in (1, 2) for ew in (False, True)
                                                             for s in (1, 2, 8)]
    else:
        tiles = [(2, True, 2)] if cpu else [(u, True, s) for u in (1, 2) for s in (1, 2, 4, 8)]
    for unroll, ew, split in tiles:
        tile = GemvConfig(block_n=rows, num_warps=1, unroll=unroll, elementwise=ew, split=split)
        assert moe._full(dim, width, tile)
        y, y_loop = _downs(p, q, w, dim, tile, backend)
        assert torch.equal(y, y_loop), (unroll, ew, split)
    if not cpu:  # the engine's down tile (Q4_K: unroll 3 over 6 groups, two steps), the same bits
        assert torch.equal(*_downs(p, q, w, dim, moe_tiles.decode_tiles(p)[1], backend))
    if not cpu:  # the engine's call (h quantized in the gate/up launch), down_full on, near the reference
        gu, dn = moe_tiles.decode_tiles(p)
        gu, k = dataclasses.replace(gu, fuse_quant=True), moe_tiles.Kernels(down_full=("Q8_0", "Q4_K"))
        y = moe.moe_decode(p, x, w, gate_up=gu, down=dn, kernels=k)
        assert moe_error(y, p, x, w, gates, ups, downs, "silu", qtype, qtype, gu, k) < BOUNDS["fp32"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_group_steps_over_six_groups_give_the_loops_bits(backend):
    # Q4_K's 2048-wide down tile (4/1/3/e/8) at F = 1536: two steps of the constant-trip loop; h random
    dim, width, n = (256, 1536, 2) if backend == "cpu" else (2048, 1536, 8)
    p = moe.prepare(on_16(arena_table(T.Q4_K, T.Q4_K, dim, width, n, backend)[0]), backend)
    assert p.down_vec
    q = act_quant.quantize(torch.randn(n, width, device=backend), p.down.act_fmt)
    w = torch.rand(n, device=backend)
    tile = GemvConfig(block_n=dim if backend == "cpu" else 4, num_warps=1, unroll=3, elementwise=True, split=n)
    assert moe._full(dim, width, tile)
    y, y_loop = _downs(p, q, w, dim, tile, backend)
    assert torch.equal(y, y_loop)
