"""Session 20 (moe45): moe_one's Q8_0 layer in one persistent launch (moe_tiles.Kernels.one) gives the two launches'
h and y bits at the same tiles: the gate/up tiles as moe_pipe's, the down's experts in range order with the grid
down's step and fused multiply-adds, the ranges folded in order; its counters carry over from launch to launch.
Interpreter where there is no GPU (one program, small shapes), compiled with the marker gpu at the decode shapes."""

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

from sparkd.engine.kernels import moe, moe_one, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

CASES = [pytest.param("cpu", id="interpret", marks=BACKENDS[0].marks),
         pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
GATE_UP = GemvConfig(block_n=2, unroll=4, elementwise=True, fuse_quant=True)


def test_one_launch_runs_only_on_q8_0_words_with_an_elementwise_folded_down():
    p = moe.prepare(arena_table(T.Q8_0, T.Q8_0, 1024, 512, 2, "cpu")[0], "cpu")
    k, dn = moe_tiles.Kernels(one=8), GemvConfig(block_n=2, unroll=2, elementwise=True, split=2)
    assert moe._one_ok(8, p, k, GATE_UP, dn)
    assert not moe._one_ok(0, p, k, GATE_UP, dn)  # off
    assert not moe._one_ok(8, p, k, dataclasses.replace(GATE_UP, fuse_quant=False), dn)  # h float: a down quantizes
    assert not moe._one_ok(8, p, k, GATE_UP, dataclasses.replace(dn, elementwise=False))  # the grouped down step
    assert not moe._one_ok(8, p, k, GATE_UP, dataclasses.replace(dn, atomic=True))
    assert not moe._one_ok(8, p, k, GATE_UP, dataclasses.replace(dn, unroll=4))  # 2 groups a row: no whole step
    assert not moe._one_ok(8, p, moe_tiles.S6R2_KERNELS, GATE_UP, dn)  # the masked step
    q4 = moe.prepare(arena_table(T.Q4_K, T.Q8_0, 1024, 512, 2, "cpu")[0], "cpu")
    assert not moe._one_ok(8, q4, k, GATE_UP, dn)


def test_one_launch_switches_off_and_older_sets_run_two():
    assert moe_tiles.one_programs(4096, "off") == 0
    assert all(moe_tiles.decode_kernels(w).one == 0 for w in moe_tiles.TILE_SETS if w != "new")
    assert moe_tiles.decode_kernels("new").one is None  # by width
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_ONE_LAUNCH"):
        moe_tiles.one_programs(4096, "on")


def test_resident_programs_follow_registers_and_shared_memory():
    class Compiled:
        def __init__(self, regs, shared):
            self.n_regs, self.metadata = regs, type("M", (), {"shared": shared})()
    assert moe_one.resident_per_sm(Compiled(96, 0), 1) == 21  # moe42's pipe: 96 registers, 21 an SM
    assert moe_one.resident_per_sm(Compiled(64, 0), 1) == 32  # the block limit
    assert moe_one.resident_per_sm(Compiled(72, 0), 1) == 28
    assert moe_one.resident_per_sm(Compiled(40, 0), 2) == 25  # 40 -> 40 a thread (256 a warp: 1280), 2 warps
    assert moe_one.resident_per_sm(Compiled(32, 20 * 1024), 1) == 10


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", CASES)
def test_one_launch_gives_the_two_launches_bits(backend):
    # (the interpreter: one program, one gate/up group a row in steps of one, one down group a row)
    shapes = [(256, 256, 2)] if backend == "cpu" else [(4096, 1536, 8), (7168, 2048, 8), (2048, 768, 8)]
    for dim, width, n in shapes:
        p = moe.prepare(arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)[0], backend)
        x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
        res = torch.randn(dim, device=backend)
        gu, dn = moe_tiles.decode_tiles(p)
        gu = dataclasses.replace(gu, fuse_quant=True)
        if backend == "cpu" or not dn.elementwise:  # (2048's engine down is the grouped step: an elementwise one)
            dn = GemvConfig(block_n=2, unroll=1, elementwise=True, split=2)  # (768 wide: 3 groups a row)
        two = moe_tiles.Kernels(one=0)
        for pers in ((1,) if backend == "cpu" else (8, 32)):
            k = moe_tiles.Kernels(one=pers, one_unroll=1 if backend == "cpu" else 4)
            assert moe._one_ok(pers, p, k, gu, dn)
            for residual in (None, res):
                base = moe.moe_decode(p, x, w, gate_up=gu, down=dn, kernels=two, residual=residual)
                for _ in range(2):  # the counters carry over: the second launch waits for its own epoch
                    assert _bits(moe.moe_decode(p, x, w, gate_up=gu, down=dn, kernels=k, residual=residual),
                                 base), (dim, pers, residual is None)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same float32 bits (a NaN too: the interpreter's sigmoid of a large -g times a large u)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))
