"""Session 7 (moe13): q8_0_words.idot_full, the Q8_0 words step without masks, runs where every
row and group of a launch is in range (moe._full) and gives the masked step's bits exactly (the
same integer sums per block, the same float steps in the same order), in gate/up and in the
down, with and without the elementwise tile; the masked step where a shape is not in range.
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

from sparkd.engine.kernels import act_quant, moe, moe_tiles, q8_0_words  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402


def test_full_needs_whole_tiles_and_whole_loop_steps():
    tile = GemvConfig(block_n=4, unroll=2)
    assert moe._full(768, 2048, tile)  # 2048 values: 8 groups, 4 steps of 2
    assert not moe._full(768, 2048 + 256, tile)  # 9 groups: the last step reads one past the row
    assert not moe._full(766, 2048, tile)  # a partial row tile
    assert not moe._full(768, 2048 + 64, GemvConfig(block_n=4, unroll=1))  # a partial group
    assert moe._int_args(moe.dispatch.FAMILIES[T.Q8_0], True, False, True)["IDOT"] is q8_0_words.idot_full
    assert moe._int_args(moe.dispatch.FAMILIES[T.Q8_0], True, False, False)["IDOT"] is q8_0_words.idot
    assert moe_tiles.decode_kernels("new").full and not moe_tiles.decode_kernels("s6r2").full


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_unmasked_words_give_the_masked_steps_bits(backend):
    # the interpreter runs programs one by one: one group per row, two experts, wide tiles
    dim, width, n = (256, 256, 2) if backend == "cpu" else (2048, 768, 8)
    table, gates, ups, downs = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)
    p = moe.prepare(table, backend)
    assert p.gate_up_words and p.down_words
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows = 64 if backend == "cpu" else 2
    full, masked = moe_tiles.Kernels(), moe_tiles.S6R2_KERNELS
    for ew in (False, True):
        gu = GemvConfig(block_n=rows, num_warps=1, unroll=1, elementwise=ew)
        dn = GemvConfig(block_n=rows, num_warps=1, unroll=1, elementwise=ew, split=2)
        assert moe._full(width, dim, gu) and moe._full(dim, width, dn)
        h, h_masked = (moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, k) for k in (full, masked))
        assert torch.equal(h, h_masked), ew
        q = act_quant.quantize(h_masked, p.down.act_fmt)  # one h into both downs
        ys = [torch.empty(dim, device=backend) for _ in range(2)]
        for y, k in zip(ys, (full, masked)):
            moe._down(p, q, w, y, dn, None, None, k)
        assert torch.equal(ys[0], ys[1]), ew
    # the engine's call, default tiles where they fit the shape: the same bits, near the reference
    tiles = dict(gate_up=GemvConfig(block_n=rows, fuse_quant=True), down=GemvConfig(block_n=rows, split=2))
    if backend == "cuda":
        tiles = dict(zip(("gate_up", "down"), moe_tiles.decode_tiles(p)))
        tiles["gate_up"] = dataclasses.replace(tiles["gate_up"], fuse_quant=True)
    y, y_masked = (moe.moe_decode(p, x, w, kernels=k, **tiles) for k in (full, masked))
    assert torch.equal(y, y_masked)
    assert moe_error(y, p, x, w, gates, ups, downs, "silu", T.Q8_0, T.Q8_0, tiles["gate_up"], full) < BOUNDS["fp32"]
