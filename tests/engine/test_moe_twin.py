"""bench/moe_twin.py's load-only twins read exactly the bytes their launch's tile reads: every
32-bit word of each selected expert's rows once (with x's / h's words of its group), whatever the
tile's rows, unroll (a power of two or not) and down ranges. Interpreter where there is no GPU."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script  # noqa: E402
from test_kernels import BACKENDS, arena_table  # noqa: E402

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
