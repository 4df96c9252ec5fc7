"""Session 14 (moe24f): the MoE decode layer in one launch (bench/moe_fused.py, bench-only: a program per chunk
of expert rows and expert, the down's columns of its chunk right after its gate/up, the partials folded by the
last program of each segment of rows). Within the fp32 bound of the float64 reference over the launch's own h,
that h within it of float64 gate/up; on the GPU also the same bits run to run and in a CUDA graph replay; a
selection of the table out of order, the residual added in the fold. A tile that does not fit the shape, and a
row-tile layout, are refused with the reason. Interpreter where there is no GPU."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script  # noqa: E402
from test_kernels import ACTIVATIONS, BACKENDS, BOUNDS, act_in, arena_table, moe_reference, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch, moe  # noqa: E402

moe_fused = load_bench_script("moe_fused.py")
FusedTile = moe_fused.FusedTile

IDS = {"cpu": [2, 0], "cuda": [3, 0, 4]}  # out of table order
# (gate/up type, down type, dim, width, tiles): the interpreter two Q8_0 chunks of 64
# (q8_0_words.idot_blocks) on one-warp tiles; the GPU the tiles the H200 sweep timed
CASES = {
    "cpu": [(T.Q8_0, T.Q8_0, 64, 128, [FusedTile(64, 64, 64, 1, 1)])],
    "cuda": [(T.Q8_0, T.Q8_0, 2048, 768, [FusedTile(64, 16, 32, 4, 2), FusedTile(128, 8, 64, 8, 1),
                                         FusedTile(256, 8, 16, 4, 1, False, False), FusedTile()]),
             (T.Q4_K, T.Q4_K, 2048, 768, [FusedTile(256, 16, 16, 8, 1), FusedTile(256, 8, 32, 4, 1, True, False)])],
}


def fused_error(y, hf, p, x, w, res, gates, ups, downs, gu_type, d_type) -> float:
    """y against float64 over the launch's own h (rounded as the down's step reads it), and that h against
    float64 gate/up (the references' check, moe_error's, for a launch that returns its h)."""
    h = act_quant.quantize(hf, p.down.act_fmt).dequantize()
    want = moe_reference(x.cpu(), w.cpu(), gates, ups, downs, "silu", h=h) + res.cpu().double()
    xr = act_in(gu_type, x.cpu())
    h64 = torch.stack([ACTIVATIONS["silu"](gates[i] @ xr, ups[i] @ xr) for i in range(len(gates))])
    return max(rel_err(y, want), rel_err(hf, h64))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_launch_within_the_fp32_bound(backend):
    for gu_type, d_type, dim, width, tiles in CASES[backend]:
        ids = IDS[backend]
        table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, max(ids) + 1, backend)
        sel = moe.prepare(table, backend).select(torch.tensor(ids, device=backend))
        gates, ups, downs = ([m[i] for i in ids] for m in (gates, ups, downs))
        x, w, res = torch.randn(dim, device=backend), torch.rand(len(ids), device=backend), \
            torch.randn(dim, device=backend)
        for tile in tiles:
            y = torch.full((dim,), float("nan"), device=backend)
            hf = moe_fused.fused_decode(sel, x, w, "silu", y, tile, residual=res)
            err = fused_error(y, hf, sel, x, w, res, gates, ups, downs, gu_type, d_type)
            assert err < BOUNDS["fp32"], f"{gu_type.name} {moe_fused.tag(tile)}: {err:.2e}"
            if backend == "cuda":  # (the interpreter runs one program after another: the same bits by construction)
                two = moe.moe_decode(sel, x, w, residual=res)  # (a near-tie in h may flip a quant step apart)
                print(f"{gu_type.name} {moe_fused.tag(tile)}: err {err:.2e}, "
                      f"{rel_err(y, two.cpu().double()):.2e} from the two launches")
                out = torch.empty_like(y)
                moe_fused.fused_decode(sel, x, w, "silu", out, tile, residual=res)
                assert torch.equal(out, y), moe_fused.tag(tile)  # run to run
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    moe_fused.fused_decode(sel, x, w, "silu", out, tile, residual=res)
                out.fill_(float("nan"))
                graph.replay()
                assert torch.equal(out, y), moe_fused.tag(tile)


def test_a_tile_that_does_not_fit_or_a_row_tile_layout_is_refused():
    # an expert width of 96 (three 32-value blocks): no chunk of 64 divides it
    table, *_ = arena_table(T.Q8_0, T.Q8_0, 64, 96, 2, "cpu")
    p = moe.prepare(table, "cpu")
    x, w, y = torch.randn(64), torch.rand(2), torch.empty(64)
    with pytest.raises(dispatch.KernelArgumentError, match="multiple of the chunk"):
        moe_fused.fused_decode(p, x, w, "silu", y, FusedTile(64, 32, 32, 1, 1))
    with pytest.raises(dispatch.KernelArgumentError, match="whole 256-column groups"):
        moe_fused.fused_decode(p, x, w, "silu", y, FusedTile(96, 32, 32, 1, 1))
    tiled = moe.prepare(moe.tiled_down(arena_table(T.Q8_0, T.Q4_K, 32, 256, 1, "cpu")[0]), "cpu")
    with pytest.raises(dispatch.KernelArgumentError, match="GGUF rows"):
        moe_fused.fused_decode(tiled, torch.randn(32), torch.rand(1), "silu", torch.empty(32), FusedTile())
