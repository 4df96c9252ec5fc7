"""bench/moe_twin.py's load-only twins read exactly the bytes their launch's tile reads: every
32-bit word of each selected expert's rows once (with x's / h's words of its group), whatever the
tile's rows, unroll (a power of two or not) and down ranges. Interpreter where there is no GPU."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script  # noqa: E402
from test_kernels import BACKENDS, arena_table  # noqa: E402
from test_moe_tiles import on_16_bytes  # noqa: E402

from sparkd.engine.kernels import act_quant, moe  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

twin = load_bench_script("moe_twin.py")


def wrapped(v: torch.Tensor) -> torch.Tensor:
    """int64 sums as the kernels' wrapping int32."""
    return ((v + 2**31) % 2**32 - 2**31).int()


def word_sums(buf: torch.Tensor, offset: int, rows: int, row_bytes: int, group_words: int, xw: torch.Tensor):
    """Per row: sum of (weight word ^ x's word of its group at the word's lane mod 64)."""
    w = buf[offset:offset + rows * row_bytes].view(torch.int32).reshape(rows, -1).long()
    cols = torch.arange(w.shape[1])
    return (w ^ xw.long()[cols // group_words * 64 + cols % group_words % 64]).sum(1)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("backend", [pytest.param("cpu", marks=BACKENDS[0].marks),
                                     pytest.param("cuda", marks=pytest.mark.gpu)])
def test_twins_read_every_word_of_the_selected_experts(backend, qtype):
    D, F, n = 256, 256, 3  # the interpreter runs programs one by one: few, wide tiles
    table = arena_table(qtype, qtype, D, F, n, backend)[0]
    p = moe.prepare(table, backend)
    qx = act_quant.quantize(torch.randn(1, D, device=backend), p.gate_up.act_fmt)
    hq = act_quant.quantize(torch.randn(n, F, device=backend), p.down.act_fmt)
    arena = table.gate.cpu()
    for cfg in (GemvConfig(block_n=32, unroll=3), GemvConfig(block_n=64, unroll=1, split=2)):
        out = torch.zeros(n, F, dtype=torch.int32, device=backend)
        twin.gate_up(p, qx, out, cfg)
        gw = p.gate_up.row_bytes(256) // 4
        want = torch.stack([word_sums(arena, table.gate_offsets[a], F, p.gate_up_row_bytes, gw, qx.words[0].cpu())
                            + word_sums(arena, table.up_offsets[a], F, p.gate_up_row_bytes, gw, qx.words[0].cpu())
                            for a in range(n)])
        assert torch.equal(out.cpu(), wrapped(want))
        # session 18: 128-bit loads, a persistent grid; session 19: the next step's words loaded ahead
        for vec, persist, ahead in ((False, 5, False), (True, 0, False), (True, 7, False), (True, 7, True),
                                    (False, 2, True)):
            at = dict(gate_offsets=[o // 16 * 16 for o in table.gate_offsets],
                      up_offsets=[o // 16 * 16 for o in table.up_offsets]) if vec else {}
            t = dataclasses.replace(table, **at)
            out = torch.zeros(n, F, dtype=torch.int32, device=backend)
            twin.gate_up(moe.prepare(t, backend), qx, out, cfg, vec, persist, ahead)
            want = torch.stack([word_sums(arena, t.gate_offsets[a], F, p.gate_up_row_bytes, gw, qx.words[0].cpu())
                                + word_sums(arena, t.up_offsets[a], F, p.gate_up_row_bytes, gw, qx.words[0].cpu())
                                for a in range(n)])
            assert torch.equal(out.cpu(), wrapped(want)), (vec, persist, ahead)
        with pytest.raises(ValueError, match="128-bit loads: its rows and expert offsets must be multiples of 16"):
            twin.gate_up(p, qx, out, cfg, True)
        split = min(cfg.split, n) or 1
        out = torch.zeros(split, D, dtype=torch.int32, device=backend)
        twin.down(p, hq, out, cfg)
        per, gw = -(-n // split), p.down.row_bytes(256) // 4
        want = torch.zeros(split, D, dtype=torch.int64)
        for a in range(n):
            want[a // per] += word_sums(arena, table.down_offsets[a], D, p.down_row_bytes, gw, hq.words[a].cpu())
        assert torch.equal(out.cpu(), wrapped(want))
        if split > 1:  # the down's fold too: the ranges' sums as float32, added in order from 0.0
            y, part = torch.full((D,), float("nan"), device=backend), torch.empty(split, D, device=backend)
            twin.down(p, hq, part, cfg, y)
            folded = torch.zeros(D)
            for s in range(split):
                folded += wrapped(want[s]).float()
            assert torch.equal(y.cpu(), folded)


def pair_twin_sums(buf: torch.Tensor, offset: int, rows: int, groups: int, qx) -> torch.Tensor:
    """Per thread t and row slot r of each 4-row tile, group by group: the pair twin's int32 sum of its words (qs
    and x's 4 each, d | dmin of row 2 (t % 2) + r, its sub-block's 2 scale words, x's sum) times x's scale,
    float64 [tiles, G, 32, 2] (the twin adds them in float32)."""
    G = groups
    w = buf[offset:offset + rows * G * 144].view(torch.int32).reshape(rows // 4, G * 144).long()
    t = torch.arange(32)
    c, s = t // 2, t // 4
    xw, xs, xd = qx.words[0].cpu().long(), qx.sums[0].cpu().long(), qx.scales[0].cpu().double()
    g = torch.arange(G)[:, None]
    q = sum(w[:, g * 128 + 4 * t + k] + xw[g * 64 + 4 * c + k] for k in range(4))  # [tiles, G, 32]
    hb = G * 128 + g * 16
    one = q + w[:, hb + 4 + s] + w[:, hb + 12 + s // 2] + xs[g * 8 + s]
    tw = torch.stack([one + w[:, hb + 2 * (t % 2) + r] for r in range(2)], -1)
    return wrapped(tw).double() * xd[:G, None, None]


def test_the_pair_twin_reads_every_word_of_the_tiled_gate_up():
    """moe_twin.gate_up on a tiled gate/up (the pairx bytes): per row the sum over groups of its threads'
    loaded words as the pair twin's loads say (a word missed or read twice moves the sum far off), at steps that
    divide the groups (a masked step past the end reads x's words again: q4t_pair's twin)."""
    D, F, n = 512, 32, 2  # (a Q8_0 down: rows of 32)
    table = moe.tiled_gate_up(on_16_bytes(arena_table(T.Q4_K, T.Q8_0, D, F, n, "cpu")[0]))
    p = moe.prepare(table, "cpu")
    qx = act_quant.quantize(torch.randn(1, D), p.gate_up.act_fmt)
    for unroll in (1, 2):
        out = torch.zeros(n, F)
        twin.gate_up(p, qx, out, GemvConfig(block_n=4, unroll=unroll))
        for a in range(n):
            tw = sum(pair_twin_sums(table.gate, o[a], F, D // 256, qx) for o in (table.gate_offsets, table.up_offsets))
            want = tw.sum(1).reshape(F // 4, 16, 2, 2).sum(1).reshape(F)  # thread t = 2c + p: row 2p + r
            assert torch.allclose(out[a].double(), want, rtol=1e-5, atol=0), (unroll, a)


def test_the_pair_twin_reads_every_word_of_the_tiled_down():
    """moe_twin.down on a tiled down (moe.tiled_down): per row and range the sum over the range's experts and groups
    of the pair twin's words (each expert's h row as its x), and with the fold their ordered sum."""
    D, F, n = 32, 512, 3  # (a Q8_0 gate/up: 8 down tiles)
    table = moe.tiled_down(on_16_bytes(arena_table(T.Q8_0, T.Q4_K, D, F, n, "cpu")[0]))
    p = moe.prepare(table, "cpu")
    hq = act_quant.quantize(torch.randn(n, F), p.down.act_fmt)
    for unroll, split in ((1, 2), (2, 1)):
        out, y = torch.zeros(split, D), torch.full((D,), float("nan"))
        cfg = GemvConfig(block_n=4, unroll=unroll, split=split)
        twin.down(p, hq, out, cfg)
        per, want = -(-n // split), torch.zeros(split, D, dtype=torch.float64)
        for a in range(n):
            tw = pair_twin_sums(table.down, table.down_offsets[a], D, F // 256, act_quant.QuantX(hq.words[a:a + 1], hq.scales[a:a + 1], hq.sums[a:a + 1]))
            want[a // per] += tw.sum(1).reshape(D // 4, 16, 2, 2).sum(1).reshape(D)
        assert torch.allclose(out.double(), want, rtol=1e-5, atol=0), (unroll, split)
        if split > 1:
            twin.down(p, hq, out, cfg, y)
            assert torch.equal(y, out[0] + out[1])
