"""What the row-tiled resident layouts share (kernels/row_tiles.py; q4_k_tiled: tiles of 4 rows,
q6_k_tiled: of 8), each against its GGUF blocks: the GEMM gives the same bits, row counts that are
not whole tiles are refused by the kernels and kept as GGUF blocks by the loader, the GEMV replays
in a CUDA graph, resident projections give the same logits with the layout switched back to GGUF,
and an unknown layout is a clear error. Each layout's integer steps and bytes: test_q4_k_tiled.py,
test_q6_k_tiled.py.

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
"""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.kernels import dispatch, q4_k_tiled, q6_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import gemm, gemv  # noqa: E402
from sparkd.engine.models import weights  # noqa: E402

# (layout module, GGUF type, the loader's pick, $env of the resident layout, its parser)
LAYOUTS = [
    pytest.param((q4_k_tiled, T.Q4_K, weights._tiled_q4_k, weights.Q4_K_LAYOUT_ENV, weights.resident_q4_k_layout),
                 id="Q4_K"),
    pytest.param((q6_k_tiled, T.Q6_K, weights._tiled_q6_k, weights.Q6_K_LAYOUT_ENV, weights.resident_q6_k_layout),
                 id="Q6_K"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_gemm_gives_the_gguf_bits(backend, layout):
    mod, qtype = layout[:2]
    rows, cols = (512 + mod.TILE_ROWS, 2048) if backend == "cuda" else (2 * mod.TILE_ROWS, 512)
    raw = random_blocks(qtype, rows * cols // 256).to(backend)
    xs = torch.randn(3, cols, device=backend)
    want = gemm(raw, qtype, (rows, cols), xs, precision="ieee")
    assert torch.equal(gemm(mod.pack_raw(raw, (rows, cols)), mod.TILED, (rows, cols), xs, precision="ieee"), want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiled_rejects_rows_that_are_not_whole_tiles(layout):
    mod, qtype, loader = layout[:3]
    r = mod.TILE_ROWS
    raw = random_blocks(qtype, r + r // 2)
    name = qtype.name
    with pytest.raises(dispatch.KernelArgumentError, match=rf"could not run the {name} repacking: \[{r + r // 2}, "
                                                           rf"256\] needs rows a multiple of {r}"):
        mod.pack(raw, (r + r // 2, 256))
    with pytest.raises(dispatch.KernelArgumentError,
                       match=f"could not run the {name} repacking: need {2 * r * mod.TILES.block_bytes} bytes"):
        mod.pack(raw, (2 * r, 256))
    with pytest.raises(dispatch.KernelArgumentError, match=f"could not run the {name}_TILED GEMV: {r + r // 2} rows "
                                                           f"is not a multiple of the layout's tile of {r} rows"):
        gemv(raw, mod.TILED, (r + r // 2, 256), torch.zeros(256))
    assert loader(raw, (r + r // 2, 256)) == (raw, qtype)  # the loader keeps such a matrix as GGUF blocks


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiled_replays_in_a_cuda_graph(layout):
    mod, qtype = layout[:2]
    rows, cols = 5120, 2048
    w = mod.pack(random_blocks(qtype, rows * cols // 256).cuda(), (rows, cols))
    x, y = torch.randn(cols, device="cuda"), torch.empty(rows, device="cuda")
    mod.gemv(w, x, out=y)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.gemv(w, x, out=y)
    x.copy_(torch.randn(cols, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, mod.gemv(w, x))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_resident_layouts_give_the_same_logits(tmp_path, monkeypatch, backend, layout):
    """Resident projections of the type are tiled by default and kept as GGUF blocks with
    $SPARKD_Q*_K_LAYOUT=gguf: the same prompt logits bit for bit (the GEMM's tile is the same on
    both layouts) and the same greedy token (one GEMV step)."""
    from test_kernel_engine import logits_by_layout

    mod, qtype, _, env = layout[:4]
    monkeypatch.setattr(q6_k_tiled, "MIN_VALUES", 512 * 256)  # a tiny model's head (512x256) counts as large
    got = logits_by_layout(tmp_path, monkeypatch, backend, qtype.name, env, ("tiled", "gguf"))
    assert mod.TILED in got["tiled"][2] and qtype in got["gguf"][2]
    (a, tok_a, _), (b, tok_b, _) = got["tiled"], got["gguf"]
    assert tok_a == tok_b and torch.equal(a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unknown_layout_is_a_clear_error(layout):
    """A layout handed over in code (Weights(q4_k_layout=...)); the environment's values: test_switches.py."""
    qtype, parse = layout[1], layout[4]
    with pytest.raises(EngineError, match=f"could not choose the resident {qtype.name} layout 'packed': use one "
                                          "of tiled, gguf"):
        parse("packed")
    assert parse("GGUF") == "gguf"
