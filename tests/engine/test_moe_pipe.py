"""Session 19 (moe42): moe_pipe's software-pipelined persistent Q8_0 gate/up (moe_tiles.Kernels.pipe) gives the grid
kernel's h and y bits: each tile's groups onto its elementwise tile in the same order, h quantized by a block's last
tile, whichever program ran it. Interpreter where there is no GPU (a few programs, small shapes), compiled with the
marker gpu at the decode shapes."""

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


def test_the_pipe_runs_only_where_the_words_step_is_unmasked_and_elementwise():
    k, tile = moe_tiles.Kernels(), GemvConfig(block_n=2, unroll=4, elementwise=True)
    assert moe._pipe_ok(16, k, tile, True, 1536, 4096)
    assert not moe._pipe_ok(0, k, tile, True, 1536, 4096)  # off
    assert not moe._pipe_ok(16, k, tile, False, 1536, 4096)  # rows not on words (or not Q8_0)
    assert not moe._pipe_ok(16, k, dataclasses.replace(tile, elementwise=False), True, 1536, 4096)
    assert not moe._pipe_ok(16, k, tile, True, 1536, 4096 + 256)  # the masked step: not a whole loop step
    assert not moe._pipe_ok(16, k, dataclasses.replace(tile, unroll=8), True, 1536, 4096)  # steps of 1, 2 or 4 groups
    assert not moe._pipe_ok(16, moe_tiles.S6R2_KERNELS, tile, True, 1536, 4096)  # the masked step always


def test_the_pipe_runs_by_width_and_switches_off():
    """Session 19: "auto" from model width 4096 below 6144 (the 2/1/4/e tile's widths), where it won on the H200;
    "off", and the older tile sets, the grid kernel everywhere."""
    tile = moe_tiles.Q8_0_GATE_UP_4096
    assert [moe_tiles.pipe_programs(d, tile, "auto") for d in (2048, 4096 - 256, 4096, 5120, 6144, 7168)] == \
        [0, 0, 16, 16, 0, 0]
    assert moe_tiles.pipe_programs(4096, dataclasses.replace(tile, unroll=2), "auto") == 0  # a tile not measured
    assert all(moe_tiles.pipe_programs(d, tile, "off") == 0 for d in (2048, 4096, 7168))
    assert moe_tiles.decode_kernels("new").pipe is None  # by width
    assert all(moe_tiles.decode_kernels(w).pipe == 0 for w in moe_tiles.TILE_SETS if w != "new")
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_PIPE"):
        moe_tiles.pipe_programs(4096, tile, "on")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pipelined_gate_up_gives_the_grid_kernels_bits(backend):
    shapes = [(1024, 64, 2)] if backend == "cpu" else [(4096, 1536, 8), (2048, 768, 8), (7168, 2048, 8)]
    for dim, width, n in shapes:
        table = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)[0]
        p = moe.prepare(table, backend)
        x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
        # (the interpreter: 4 groups a row in 2 steps of 2, 64 tiles on 3 programs)
        gu, dn = GemvConfig(block_n=2, unroll=2, elementwise=True, fuse_quant=True), GemvConfig(block_n=2, split=2)
        if backend == "cuda":
            gu, dn = moe_tiles.decode_tiles(p)
            gu = dataclasses.replace(gu, fuse_quant=True)
        h = moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, moe_tiles.Kernels(pipe=0))
        base = moe.moe_decode(p, x, w, gate_up=gu, down=dn, kernels=moe_tiles.Kernels(pipe=0))
        for per in (3,) if backend == "cpu" else (8, 16, 24):
            k = moe_tiles.Kernels(pipe=per)
            assert moe._pipe_ok(per, k, gu, p.gate_up_words, width, dim)
            hp = moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, k)
            # (Q8_0 blocks: words and scales; the sums are a placeholder no kernel writes)
            assert torch.equal(hp.words, h.words) and _bits(hp.scales, h.scales), (dim, per)
            assert _bits(moe.moe_decode(p, x, w, gate_up=gu, down=dn, kernels=k), base), (dim, per)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same float32 bits (a NaN too: the interpreter's sigmoid of a large -g times a large u)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))
