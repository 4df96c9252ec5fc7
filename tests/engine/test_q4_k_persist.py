"""The integer GEMV on a persistent grid (matmul.GemvConfig.persist, session 7, q4k14): each program
loops over whole (row tile, range) items, so every row's sum is the one-program-per-item grid's, in the
same order: the same bits, tested on the tiled Q4_K layout's default step (the step does not matter to the
grid) with split-K folds, more items than programs, items that do not divide evenly and, on the GPU, more
row tiles than one wave holds.

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the real grid.
"""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err  # noqa: E402

from sparkd.engine.kernels import matmul, q4_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GEMV_TILES, GemvConfig, persistent_programs  # noqa: E402

DEFAULT = GEMV_TILES["Q4_K_TILED"]
# (split, persist): the wave rule's split, explicit splits with folds, items not a multiple of persist
GRIDS = [(0, 1), (0, 2), (0, 5), (2, 2), (3, 4), (1, 3)]


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"split{g[0]}-p{g[1]}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_grid_gives_the_same_bits(backend, grid):
    split, persist = grid
    # (2048x7168: the wave rule splits K in 7; 20000 rows: more 4-row tiles than an H200 wave holds)
    shapes = [(2048, 7168), (20000, 512)] if backend == "cuda" else [(12, 1280)]
    for rows, cols in shapes:
        raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
        x = torch.randn(cols, device=backend)
        tiled = q4_k_tiled.pack(raw, (rows, cols))
        base = dataclasses.replace(DEFAULT, split=split)
        want = q4_k_tiled.gemv(tiled, x, config=base)
        got = q4_k_tiled.gemv(tiled, x, config=dataclasses.replace(base, persist=persist))
        assert torch.equal(got, want), (rows, cols)
        W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
        assert rel_err(got, W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]


def test_persistent_programs_cap_the_grid_at_one_wave():
    wave = matmul.wave_programs(1)  # (no GPU here: DEFAULT_SMS)
    cfg = GemvConfig(persist=2)
    assert persistent_programs(cfg, 12) == 6
    assert persistent_programs(dataclasses.replace(cfg, persist=5), 12) == 3  # 5 asked, 4 each: spread evenly
    assert persistent_programs(cfg, 3 * wave + 1) == -(-(3 * wave + 1) // 4) <= wave  # 4 a program: one wave
    assert persistent_programs(dataclasses.replace(cfg, persist=1), wave) == wave
