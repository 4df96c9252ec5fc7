"""The chunked Q4_K GEMV tile (kernels/q4_k_chunked.py: the file's bytes, a (row, 32-byte chunk)
per thread) against q4_k's tiles: the same integer sums (bit for bit where every float step is
exact), tails (rows not a multiple of the tile, groups past the end of a range), odd row counts,
and resident Q4_K projections switched back with $SPARKD_Q4_K_LAYOUT=gguf.

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err  # noqa: E402

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.kernels import dispatch, q4_k_chunked  # noqa: E402
from sparkd.engine.kernels.matmul import GEMV_TILES, OLD_GEMV_TILES, GemvConfig, gemv  # noqa: E402

CHUNKED = q4_k_chunked.CHUNKED
# tiles of the chunked family: the default, 16 rows on one warp (two rows per thread) and on two,
# split-K in 2 ranges with 3 groups per step (masked tail groups), the pipeliner's 3 stages, the
# interpreter's wide tile
TILES = [None, GemvConfig(block_n=16, unroll=2), GemvConfig(block_n=16, num_warps=2, unroll=1),
         GemvConfig(block_n=8, unroll=3, split=2), GemvConfig(block_n=8, unroll=1, stages=3), GemvConfig(block_n=64)]


def exact_case(rows: int, cols: int, seed: int = 0):
    """Random Q4_K blocks and an x on which every float step of the GEMV is exact: d = 2^-4,
    dmin = 2^-5, x multiples of 2^-7 with one +-127 * 2^-7 per 256 (so x's Q8_K scale is 2^-7)
    and the rest in -3..3: the sums stay under 2^23 units of 2^-12, so any order of the float
    adds gives the same bits and the result is the integer sums' (q4_k's) exactly."""
    raw = random_blocks(T.Q4_K, rows * cols // 256).view(-1, 144)
    raw[:, 0:2] = torch.from_numpy(np.array([2.0 ** -4], np.float16).view(np.uint8))
    raw[:, 2:4] = torch.from_numpy(np.array([2.0 ** -5], np.float16).view(np.uint8))
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (cols,), generator=g).float()
    x[::256] = 127.0 * torch.where(torch.rand(cols // 256, generator=g) < 0.5, -1.0, 1.0)
    return raw.reshape(-1), x * 2.0 ** -7


@pytest.mark.parametrize("config", TILES, ids=lambda c: "default" if c is None else
                         f"{c.block_n}/{c.num_warps}/{c.unroll}/{c.split}/{c.stages}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_gives_q4_k_sums_bit_for_bit(backend, config):
    rows, cols = (4099, 4096) if backend == "cuda" else (13, 768)  # rows not a multiple of any tile
    raw, x = exact_case(rows, cols)
    raw, x = raw.to(backend), x.to(backend)
    want = gemv(raw, T.Q4_K, (rows, cols), x, config=OLD_GEMV_TILES["Q4_K"])  # session 3's rows tile
    got = gemv(raw, CHUNKED, (rows, cols), x, config=config)
    assert torch.equal(got, want)
    assert torch.equal(got.cpu().double(), reference(raw, T.Q4_K, (rows, cols)) @ act_in(T.Q4_K, x.cpu()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_on_random_blocks_is_within_the_fp32_bound(backend):
    """Random scales (both signs, 1e-3..1e-1) and a random x: only the float order differs from
    q4_k's default tile."""
    rows, cols = (151937, 2048) if backend == "cuda" else (9, 512)
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    x = torch.randn(cols, device=backend)
    W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
    scale = W.abs() @ xr.abs()
    old = gemv(raw, T.Q4_K, (rows, cols), x, config=GEMV_TILES["Q4_K"] if backend == "cuda" else None)
    for cfg in TILES[:2]:
        got = gemv(raw, CHUNKED, (rows, cols), x, config=cfg)
        assert rel_err(got, old.cpu().double(), scale) < 1e-6
        assert rel_err(got, W @ xr, scale) < BOUNDS["fp32"]


@pytest.mark.gpu
def test_chunked_replays_in_a_cuda_graph():
    rows, cols = 5120, 2048
    raw = random_blocks(T.Q4_K, rows * cols // 256).cuda()
    x, y = torch.randn(cols, device="cuda"), torch.empty(rows, device="cuda")
    gemv(raw, CHUNKED, (rows, cols), x, out=y)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemv(raw, CHUNKED, (rows, cols), x, out=y)
    x.copy_(torch.randn(cols, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, gemv(raw, CHUNKED, (rows, cols), x))


def test_chunked_family_reads_the_file_bytes():
    fam = dispatch.family(CHUNKED)
    assert fam.row_bytes(2048) == dispatch.FAMILIES[T.Q4_K].row_bytes(2048) == 8 * 144
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q4_K_CHUNKED GEMV: 300 columns"):
        gemv(torch.zeros(144, dtype=torch.uint8), CHUNKED, (1, 300), torch.zeros(300))
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q4_K_CHUNKED GEMV: need x"):
        gemv(torch.zeros(144, dtype=torch.uint8), CHUNKED, (2, 256), torch.zeros(256))


@pytest.mark.parametrize("backend", BACKENDS)
def test_resident_q4_k_layouts_give_the_same_logits(tmp_path, monkeypatch, backend):
    """Resident Q4_K projections take the chunked tile by default and q4_k's with
    $SPARKD_Q4_K_LAYOUT=gguf: the same greedy token, logits within the float order's rounding."""
    from test_kernel_engine import PROMPT, SHAPES, greedy

    from sparkd.engine.layers.linear import KernelLinear
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.models import load_model
    from sparkd.engine.models.weights import Q4_K_LAYOUT_ENV
    path = write_model(tmp_path / "m.gguf", plan(SHAPES["Q4_K"], "Q4_K"), seed=5)[0]
    got = {}
    for layout, qtype in (("chunked", CHUNKED), ("gguf", T.Q4_K)):
        monkeypatch.setenv(Q4_K_LAYOUT_ENV, layout)
        k = load_model(path, device=backend, kernels=True)
        try:
            assert qtype in {m.qtype for m in k.net.modules() if isinstance(m, KernelLinear)}
            got[layout] = greedy(k.net, PROMPT, 1)
        finally:
            k.close()
    (a, tok_a), (b, tok_b) = got["chunked"], got["gguf"]
    assert tok_a == tok_b and float((a - b).norm() / b.norm()) < 1e-5


def test_unknown_q4_k_layout_is_a_clear_error(monkeypatch):
    from sparkd.engine.models.weights import Q4_K_LAYOUT_ENV, resident_q4_k_layout
    monkeypatch.setenv(Q4_K_LAYOUT_ENV, "packed")
    with pytest.raises(EngineError, match="could not choose the resident Q4_K layout 'packed': use one of "
                                          "chunked, gguf"):
        resident_q4_k_layout()
    assert resident_q4_k_layout("GGUF") == "gguf"
