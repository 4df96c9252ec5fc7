"""Session 21 (q4k48): the pairx MoE gate/up's loop with a constant trip count (q4_k_pair.gate_up; Kernels.pairx_gate_up
"steps", the tile's unroll a step) adds the same groups in the same order as _gate_up_idot's loop: the same bits, on a
table in the engine's layout (gate/up and down repacked, offsets on 16 bytes on the GPU). Interpreter where there is
no GPU, compiled with the marker gpu."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import arena_table  # noqa: E402
from test_moe_tiles import on_16_bytes  # noqa: E402

from sparkd.engine.kernels import moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402
from sparkd.engine.kernels.moe_tiles import Kernels  # noqa: E402

STEPS = [1, 2, 4, 8]


def decodes(p: moe.PreparedTable, x: torch.Tensor, w: torch.Tensor, down: GemvConfig | None) -> dict:
    """y for the loop (unroll 1, its tile) and for the steps at each of STEPS that divides the row's groups, h
    quantized in the launch."""
    one = GemvConfig(block_n=4, num_warps=1, unroll=1, fuse_quant=True)
    ys = {"loop": moe.moe_decode(p, x, w, gate_up=one, down=down, kernels=Kernels(pairx_gate_up="loop"))}
    for unroll in (u for u in STEPS if p.table.dim % (256 * u) == 0):
        ys[unroll] = moe.moe_decode(p, x, w, gate_up=dataclasses.replace(one, unroll=unroll), down=down,
                                    kernels=Kernels(pairx_gate_up="steps"))
    return ys


def test_the_steps_run_by_width_and_switch_off():
    """"auto": the steps on PAIRX_GATE_UP at the measured widths (2048-6143, rows of whole steps) for pairx rows only;
    "off" and the old set names: the loop; a Kernels' own pairx_gate_up: what it names."""
    widths = (1024, 2048 - 256, 2048, 2048 + 256, 4096, 6144 - 512, 6144 - 256, 6144, 7168)
    assert [moe_tiles.pairx_steps(d, "auto") for d in widths] == [False, False, True, False, True, True, False, False,
                                                                  False]  # (an odd count of groups: not whole steps)
    assert not any(moe_tiles.pairx_steps(d, "off") for d in (2048, 4096))
    with pytest.raises(moe.dispatch.KernelArgumentError, match="SPARKD_MOE_PAIRX_STEPS"):
        moe_tiles.pairx_steps(4096, "on")
    assert moe_tiles.pairx_way(Kernels(), 4096) == ("steps" if moe_tiles.PAIRX_STEPS == "auto" else "loop")
    assert moe_tiles.pairx_way(Kernels(pairx_gate_up="steps"), 7168) == "steps"
    assert moe_tiles.pairx_way(moe_tiles.decode_kernels("s14"), 4096) == "loop"
    for dim, steps in ((1024, False), (2048, True), (4096, True), (6144, False)):
        tiled = moe.prepare(moe.tiled_gate_up(arena_table(T.Q4_K, T.Q8_0, dim, 32, 1, "cpu")[0]), "cpu")
        want = moe_tiles.PAIRX_GATE_UP if steps and moe_tiles.PAIRX_STEPS == "auto" else \
            moe_tiles.DECODE_TILES["Q4_K_TILED"][0]
        assert moe_tiles.decode_tiles(tiled)[0] == want, dim
        assert moe_tiles.decode_tiles(tiled, "s14")[0] == moe_tiles.DECODE_TILES["Q4_K_TILED"][0]
        gguf = moe.prepare(arena_table(T.Q4_K, T.Q8_0, dim, 32, 1, "cpu")[0], "cpu")  # GGUF rows: as before
        assert moe_tiles.decode_tiles(gguf)[0] == moe_tiles.DECODE_TILES["Q4_K"][0]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
def test_pairx_gate_up_steps_give_the_loops_bits_interpreted():
    # the interpreter runs programs one by one: 8 tiles of 2 experts, 4 groups a row (a Q8_0 down: 32-row experts)
    table = moe.tiled_gate_up(arena_table(T.Q4_K, T.Q8_0, 1024, 32, 2, "cpu")[0])
    p = moe.prepare(table, "cpu")
    assert moe._pairx_gate_up(p, GemvConfig(block_n=4, num_warps=1, unroll=2), Kernels(pairx_gate_up="steps")) == \
        dict(NG=4)
    x, w = torch.randn(1024), torch.rand(2)
    ys = decodes(p, x, w, GemvConfig(block_n=64, num_warps=1, unroll=2, split=2))
    for key, y in ys.items():
        assert torch.equal(y, ys["loop"]), key


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("shape", [(2048, 768, 8), (4096, 1536, 8)])
def test_pairx_gate_up_steps_give_the_loops_bits(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dim, width, n = shape
    table = on_16_bytes(arena_table(T.Q4_K, T.Q4_K, dim, width, n, "cuda")[0])
    p = moe.prepare(moe.tiled_down(moe.tiled_gate_up(table)), "cuda")
    assert p.gate_up_vec and moe._pairx_gate_up(p, GemvConfig(block_n=4, num_warps=1, unroll=4),
                                                Kernels(pairx_gate_up="steps")) == dict(NG=dim // 256)
    x, w = torch.randn(dim, device="cuda"), torch.rand(n, device="cuda")
    ys = decodes(p, x, w, None)
    for key, y in ys.items():
        assert torch.equal(y, ys["loop"]), key
