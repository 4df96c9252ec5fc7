"""bench/q4t_compact.py's steps (session 8, q4k17: x's words, sums and scales and the headers loaded compactly
once per group, or once per step of UNROLL groups, then broadcast to the words' tile) give the bytes step's
values: bit for bit under the interpreter, and on the GPU for the per-group step (the H200 run,
bench/results/q4k17_h200_s8.log); the per-step kernel's last bits differed there, so on CUDA it is held to the
float bound. The same tensor against q4_k_tiled's bytes step and against q4_k's step on the GGUF blocks, at a
masked half step (3 or 6 groups a range, 4 a step), 2 groups a step over split-K ranges of 3, 8 rows on 2 warps."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import load_bench_script
from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err

from sparkd.engine.kernels import act_quant, matmul, q4_k_tiled
from sparkd.engine.kernels.matmul import GEMV_TILES, OLD_GEMV_TILES, GemvConfig, gemv

compact = load_bench_script("q4t_compact.py")
TILES = [GEMV_TILES["Q4_K_TILED"], GemvConfig(block_n=4, unroll=2, split=2), GemvConfig(block_n=8, num_warps=2)]


def _tensors(backend: str, rows: int = 8, cols: int = 1536):
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    return raw, q4_k_tiled.pack(raw, (rows, cols), loads="bytes"), torch.randn(cols, device=backend)


def _per_group(tiled, x, cfg):
    y = torch.empty(tiled.rows, device=x.device)
    return matmul.igemv(tiled.data, compact.idot_compact, (4, 8), act_quant.Q8_K, (tiled.rows, tiled.cols),
                        tiled.cols // 256 * 144, x, y, cfg, isplit=4)


@pytest.mark.parametrize("config", TILES, ids=lambda c: f"{c.block_n}/{c.num_warps}/{c.unroll}/{c.split}")
@pytest.mark.parametrize("steps", ["per-group", "per-step"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compact_loads_give_the_bytes_bits(backend, steps, config):
    raw, tiled, x = _tensors(backend)
    want = q4_k_tiled.gemv(tiled, x, config=config, loads="bytes")
    # bits where the H200 showed them equal (one warp); on 2 warps the compiled layouts of q4_k's and the
    # tiled step sum a row's words across other lanes (the final call: other last bits), so the bound only
    same_bits = backend == "cpu" or config.num_warps == 1
    if same_bits:
        assert torch.equal(gemv(raw, T.Q4_K, (tiled.rows, tiled.cols), x, config=config), want)  # q4_k's bits
    got = _per_group(tiled, x, config) if steps == "per-group" else compact.gemv(tiled, x, config)[0]
    if backend == "cpu" or (steps == "per-group" and same_bits):
        assert torch.equal(got, want)
    W, xr = reference(raw, T.Q4_K, (tiled.rows, tiled.cols)), act_in(T.Q4_K, x.cpu())
    assert rel_err(got.cpu(), W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]


def test_the_step_kernel_refuses_the_rows_tile_and_other_layouts():
    raw = random_blocks(T.Q4_K, 4)
    for w, cfg in ((q4_k_tiled.pack(raw, (4, 256), loads="bytes"), OLD_GEMV_TILES["Q4_K"]),
                   (q4_k_tiled.pack(raw, (4, 256), loads="vector"), GEMV_TILES["Q4_K_TILED"])):
        with pytest.raises(ValueError, match="could not run the compact-step GEMV: need the bytes layout"):
            compact.gemv(w, torch.zeros(256), cfg)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tiled_q4_k_tile_steps_2_groups_where_the_split_is_1(backend):
    """GemvConfig.whole_unroll (q4k17): 2 groups a step at split 1, unroll's 4 at split-K ranges; the same bits
    either way (masked half steps included: 3 groups a row), as $SPARKD_GEMV_WHOLE_UNROLL=off's 4 everywhere.
    The bytes step's tile (unroll 4; pairx, the default since, steps 2 groups everywhere)."""
    cfg = dataclasses.replace(GEMV_TILES["Q4_K_TILED"], unroll=4)
    assert (matmul.step_groups(cfg, 1), matmul.step_groups(cfg, 2)) == ((2, 4) if matmul.WHOLE_UNROLL else (4, 4))
    raw, tiled, x = _tensors(backend, 8, 768)
    assert matmul.split_for(cfg, 8, 3, x.device) == 1
    old = dataclasses.replace(cfg, whole_unroll=0)
    assert torch.equal(q4_k_tiled.gemv(tiled, x, config=cfg, loads="bytes"),
                       q4_k_tiled.gemv(tiled, x, config=old, loads="bytes"))
