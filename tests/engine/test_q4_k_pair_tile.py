"""Session 19 (moe43): the pairx step reads the tile its launch hands it (q4_k_pair.idot at w_ptr, matmul.at_tile),
not the program id's: a grid in another order gives the same bits as the engine's. Interpreter where there is no
GPU, compiled with the marker gpu."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import act_quant, q4_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, at_tile, int_args, row_idot  # noqa: E402

ONE_TILE = GemvConfig(block_n=4, num_warps=1, unroll=1)  # the pairx step's tile


@triton.jit
def _tiles_kernel(w_ptr, xw_ptr, xd_ptr, xs_ptr, y_ptr, K, row_bytes, IDOT: tl.constexpr, A1: tl.constexpr,
                  A2: tl.constexpr, A3: tl.constexpr, REVERSED: tl.constexpr, EMU: tl.constexpr):
    """The one-tile GEMV as the engine's launch steps it, program i on tile i, or (REVERSED) on the last tile but i."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0) if REVERSED else tl.program_id(0)
    rows = tile * 4 + tl.arange(0, 4)
    w_at, row_off = at_tile(w_ptr, rows.to(tl.int64) * row_bytes, tile, 4, row_bytes, True)
    tl.store(y_ptr + rows, row_idot(w_at, row_off, rows >= 0, xw_ptr, xd_ptr, xs_ptr, K, 0, 1, IDOT, A1, A2, A3, 1,
                                    True, EMU, None))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pairx_step_sums_the_tile_it_is_handed(backend):
    rows, cols = (16, 512) if backend == "cpu" else (1536, 4096)
    w = q4_k_tiled.pack(random_blocks(T.Q4_K, rows * cols // 256).to(backend), (rows, cols), loads="pairx")
    x = torch.randn(cols, device=backend)
    fam = q4_k_tiled.FAMILIES["pairx"]
    q = act_quant.quantize(x[None], fam.act_fmt)
    ys = []
    for reversed_ in (False, True):
        ys.append(torch.empty(rows, device=backend))
        _tiles_kernel[(rows // 4,)](w.data, q.words, q.scales, q.sums, ys[-1], cols, cols // 256 * 144,
                                    REVERSED=reversed_, EMU=backend == "cpu", num_warps=1, **int_args(fam))
    assert torch.equal(ys[0], ys[1])
    # the engine's GEMV (another kernel: its float contraction may differ in the last place on the GPU)
    want = q4_k_tiled.gemv(w, x, config=ONE_TILE, loads="pairx")
    assert torch.allclose(ys[1], want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
