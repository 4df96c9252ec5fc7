"""The tiled Q6_K layout (kernels/q6_k_tiled.py: resident Q6_K repacked at load, tiles of 8 rows,
quant planes then scales then d) against the GGUF blocks: q6_k's integer step on both, so under
the interpreter the same tile gives the same bits (split-K ranges with masked tail groups, program
tiles of one and two packing tiles, the rows tile of half a packing tile, the elementwise tile), the
float path ($SPARKD_Q6_K_INT=0) too; on the GPU the rows tile gives the same bits and the
elementwise tile sums its tile in another order (within the float bound). Elementwise tiles of
fewer rows than a packing tile are refused before they compile (the H200 failed the 2-row one).
The loader tiles only matrices of MIN_VALUES values or more. The GEMM, row counts that are not whole
tiles, graphs and $SPARKD_Q6_K_LAYOUT=gguf: test_row_tiles.py (the same checks for both tiled layouts).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
"""

import os
import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch, q6_k, q6_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GEMV_TILES, GemvConfig, gemv  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

TILED = q6_k_tiled.TILED
ROWS_TILE = GemvConfig(block_n=4, num_warps=1, unroll=2, split=1, elementwise=False)
# the default tile, 16 rows on 2 warps with split-K in 2 ranges of 3 groups per step (masked tail
# groups), the rows tile (4 rows: half a packing tile), and programs of part of a packing tile:
# GEMV_TILES' GGUF tile (2 rows) and 4 rows on 1 warp (off by ~1 on the H200 until session 8's row sums)
TILES = [GEMV_TILES["Q6_K_TILED"], GemvConfig(block_n=16, num_warps=2, unroll=3, split=2), ROWS_TILE,
         GEMV_TILES["Q6_K"], GemvConfig(block_n=4, num_warps=1, unroll=2)]


@pytest.mark.parametrize("config", TILES, ids=lambda c: f"{c.block_n}/{c.num_warps}/{c.unroll}/{c.split}/"
                         f"{'e' if c.elementwise else 'g'}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_gives_the_gguf_bits(backend, config):
    """q6_k's integer step on the tiled layout against the GGUF blocks at the same tile: the same
    bits under the interpreter, and on the GPU for the rows tile (integer sums, one float step per
    group); every tile within the float bound of the float64 reference."""
    rows, cols = (4104, 2048 + 768) if backend == "cuda" else (16, 768)  # whole packing tiles, odd groups
    raw = random_blocks(T.Q6_K, rows * cols // 256).to(backend)
    x = torch.randn(cols, device=backend)
    tiled = q6_k_tiled.pack(raw, (rows, cols))
    assert tiled.data.numel() == raw.numel()
    want = gemv(raw, T.Q6_K, (rows, cols), x, config=config)
    got = q6_k_tiled.gemv(tiled, x, config=config)
    W, xr = reference(raw, T.Q6_K, (rows, cols)), act_in(T.Q6_K, x.cpu())
    assert rel_err(got, W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]
    if backend == "cpu" or not config.elementwise:
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_path_on_the_tiled_layout_gives_the_gguf_bits(monkeypatch, backend):
    """The families $SPARKD_Q6_K_INT=0 picks (no integer step: the dequant, x rounded by the
    caller) give the same bits on both layouts."""
    rows, cols = (520, 2048) if backend == "cuda" else (16, 512)
    raw, x = random_blocks(T.Q6_K, rows * cols // 256).to(backend), torch.randn(cols, device=backend)
    monkeypatch.setitem(dispatch.FAMILIES, T.Q6_K, q6_k.FLOAT_FAMILY)
    monkeypatch.setitem(dispatch.LAYOUTS, TILED, q6_k_tiled.FLOAT_FAMILY)
    rx = lambda v: round_activations(v, act_quant.Q8_K)  # noqa: E731 - what KernelLinear passes
    cfg = GemvConfig(block_n=8, unroll=2)
    want = gemv(raw, T.Q6_K, (rows, cols), x, config=cfg, round_x=rx)
    assert torch.equal(gemv(q6_k_tiled.pack_raw(raw, (rows, cols)), TILED, (rows, cols), x, config=cfg,
                            round_x=rx), want)


def test_int_switch_reaches_the_tiled_family():
    """SPARKD_Q6_K_INT=0 at import: the tiled family has no integer step either (a subprocess: the
    variable is read once); this process: the integer one."""
    code = ("from sparkd.engine.kernels import dispatch, q6_k_tiled as t; "
            "print(dispatch.family(t.TILED) is t.FLOAT_FAMILY, t.FAMILY.idot is None)")
    env = dict(os.environ, SPARKD_Q6_K_INT="0", TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "True"]
    assert dispatch.family(TILED) is q6_k_tiled.INT_FAMILY and q6_k_tiled.INT_FAMILY.act_fmt == act_quant.Q8_K


def test_tiled_layout_is_planes_then_scales_then_d():
    """Byte for byte (on the host: no kernel): tile t, group g, lane r, half h, c: plane A holds
    ql[64h + 16c ..+16], B ql[64h + 32 + 16c ..+16], QH qh[32h + 16c ..+16] at 16 (4r + 2h + c);
    then every group's 8 x 16 scale bytes, then every group's 8 d's."""
    rows, cols, groups = 16, 512, 2
    raw = random_blocks(T.Q6_K, rows * groups)
    blocks = raw.view(rows, groups, 210)
    data = q6_k_tiled.pack_raw(raw, (rows, cols)).view(2, 8 * groups * 210)
    for t in range(2):
        for g in range(groups):
            for r in range(8):
                blk = blocks[8 * t + r, g]
                for h in range(2):
                    for c in range(2):
                        at = g * 1536 + 16 * (4 * r + 2 * h + c)
                        assert torch.equal(data[t, at:at + 16], blk[64 * h + 16 * c:][:16])
                        assert torch.equal(data[t, at + 512:at + 528], blk[64 * h + 32 + 16 * c:][:16])
                        assert torch.equal(data[t, at + 1024:at + 1040], blk[128 + 32 * h + 16 * c:][:16])
                assert torch.equal(data[t, groups * 1536 + g * 128 + 16 * r:][:16], blk[192:208])
                assert torch.equal(data[t, groups * 1664 + g * 16 + 2 * r:][:2], blk[208:])


def test_loader_tiles_the_large_matrices_only():
    """Below MIN_VALUES values (attn_v 512x2048; 4096x2048) the loader keeps the GGUF blocks, from
    it (6144x4096, the head) tiles."""
    from sparkd.engine.models.weights import _tiled_q6_k
    assert not q6_k_tiled.worth_tiling((4096, 2048)) and q6_k_tiled.worth_tiling((6144, 4096))
    small, large = (512, 256), (q6_k_tiled.MIN_VALUES // 2048, 2048)
    raw = random_blocks(T.Q6_K, small[0] * small[1] // 256)
    assert _tiled_q6_k(raw, small) == (raw, T.Q6_K)
    raw = random_blocks(T.Q6_K, large[0] * large[1] // 256)
    data, qtype = _tiled_q6_k(raw, large)
    assert qtype is TILED and torch.equal(data, q6_k_tiled.pack_raw(raw, large))
