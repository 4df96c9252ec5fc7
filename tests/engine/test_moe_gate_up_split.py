"""Session 12 (moe22): the integer MoE gate/up with its K in ranges (GemvConfig.split of the gate/up tile,
moe._igate_up_kernel's KSPLIT): each range's gate and up sums stored, the last program of a row tile adding
them in range order before the activation and h. Another float order than one range: within the fp32 bound
of the float64 reference over the engine's own h, within float32 rounding of the unsplit h, the same bits
run to run, its tickets left zero; a split that does not cut the row into whole loop steps is refused.
Interpreter where there is no GPU, compiled with the marker gpu."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BOUNDS, arena_table, moe_error, rel_err  # noqa: E402

from sparkd.engine.kernels import dispatch, matmul, moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

# the interpreter runs programs one by one: two experts of 32 rows in two 16-row tiles (h's Q8_0 blocks then
# quantized by their last tile: the ticket path after the split's), 2 groups a row
CASES = [pytest.param("cpu", T.Q8_0, False, 2, id="interpret-Q8_0")] + \
    [pytest.param("cuda", t, tiled, split, id=f"cuda-{t.name}{'-tiled' if tiled else ''}-{split}", marks=pytest.mark.gpu)
     for t, tiled in ((T.Q8_0, False), (T.Q4_K, False), (T.Q4_K, True)) for split in (2, 4)]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend,qtype,tiled,split", CASES)
def test_split_gate_up_within_the_fp32_bound(backend, qtype, tiled, split):
    dim, width, n = (512, 32, 2) if backend == "cpu" else (2048, 768, 8)
    table, gates, ups, downs = arena_table(qtype, qtype, dim, width, n, backend)
    table = moe.tiled_gate_up(table) if tiled else table
    p = moe.prepare(table, backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    one = GemvConfig(block_n=16, num_warps=1, unroll=1) if backend == "cpu" else moe_tiles.decode_tiles(p, "s11")[0]
    one = dataclasses.replace(one, split=0)
    down = GemvConfig(block_n=64, num_warps=1, unroll=2, split=2) if backend == "cpu" else None
    cut = dataclasses.replace(one, split=split)
    h_one, h_cut = (moe.down_input(p, x, "silu", t, rounded=False) for t in (one, cut))
    assert rel_err(h_cut, h_one.cpu().double()) < 1e-6
    assert not torch.equal(h_cut, h_one) or backend == "cpu"  # (the GPU's sums do meet in another order)
    tiles = dict(gate_up=dataclasses.replace(cut, fuse_quant=True), down=down)
    ys = [moe.moe_decode(p, x, w, **tiles) for _ in range(2)]
    assert torch.equal(ys[0], ys[1])
    assert not matmul.tickets(1, backend).any()  # every ticket set back for the next launch
    err = moe_error(ys[0], p, x, w, gates, ups, downs, "silu", qtype, qtype, tiles["gate_up"])
    assert err < BOUNDS["fp32"]


def test_a_split_into_part_steps_is_refused():
    table = arena_table(T.Q8_0, T.Q8_0, 512, 32, 1, "cpu")[0]
    p = moe.prepare(table, "cpu")
    for cfg in (GemvConfig(block_n=16, unroll=1, split=4), GemvConfig(block_n=16, unroll=2, split=2)):
        with pytest.raises(dispatch.KernelArgumentError, match=r"gate/up split over K into \d ranges needs the row"):
            moe.moe_decode(p, torch.randn(512), torch.rand(1), gate_up=cfg)


def test_the_split_is_the_default_below_width_4096_and_s11_switches_it_off():
    for qtype in (T.Q8_0, T.Q4_K):
        at = {dim: moe.prepare(arena_table(qtype, qtype, dim, 256, 1, "cpu")[0], "cpu") for dim in (2048, 4096)}
        assert moe_tiles.decode_tiles(at[2048])[0].split == moe_tiles.GATE_UP_SPLIT > 1
        assert moe_tiles.decode_tiles(at[4096])[0].split <= 1
        for dim, p in at.items():
            new, old = moe_tiles.decode_tiles(p), moe_tiles.decode_tiles(p, "s11")
            assert old[1] == new[1] and old[0] == dataclasses.replace(new[0], split=old[0].split)
            assert old[0].split <= 1
    narrow = moe.prepare(arena_table(T.Q8_0, T.Q8_0, 512, 32, 1, "cpu")[0], "cpu")  # 2 groups: no 2 ranges of 2
    assert moe_tiles.decode_tiles(narrow)[0] == dataclasses.replace(moe_tiles.DECODE_TILES["Q8_0"][0], split=0)
