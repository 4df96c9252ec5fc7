"""The tiled Q4_K layout (kernels/q4_k_tiled.py: resident Q4_K repacked at load, tiles of 4 rows,
qs then headers) against the GGUF blocks: q4_k's integer step on both, so the same tile gives the
same bits (split-K ranges with masked tail groups, rows past the end of a program's tile, the
rows tile and the elementwise tile). The integer steps with fewer loads (q4k9: the header in one
128-bit load, x's sums in one 64-bit one) give the same bits, and so does the default of session 7
(q4k12: "bytes", the scale bytes regrouped at repack, the same scales and mins, test_bytes_scales_are_q4_k_scales);
$SPARKD_Q4_K_TILED_LOADS=vector switches back to session 6's step and layout, =scalar to q4_k's step. The GEMM, row counts that are not whole tiles, graphs, the loader and
$SPARKD_Q4_K_LAYOUT=gguf: test_row_tiles.py (the same checks for both tiled layouts).

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

from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sparkd.engine.kernels import dispatch, q4_k, q4_k_tiled  # noqa: E402
from sparkd.engine.kernels.matmul import GEMV_TILES, OLD_GEMV_TILES, GemvConfig, gemv  # noqa: E402

# the default tile, 2 rows (half a packing tile), 8 rows on 2 warps with split-K in 2 ranges of 3
# groups per step (masked tail groups), session 3's rows tile, the interpreter's wide tile
TILES = [GEMV_TILES["Q4_K_TILED"], GemvConfig(block_n=2, unroll=2), GemvConfig(block_n=8, num_warps=2, unroll=3, split=2),
         OLD_GEMV_TILES["Q4_K"], GemvConfig(block_n=64)]


def same_bits_on_cuda(loads: str, config: GemvConfig) -> bool:
    """Where the H200 gave q4_k's bits (bench/results/gemv_tiles_h200_s5_q4k9_tests.log): q4_k's own
    step at every tile; the steps with fewer loads at one-warp tiles (the default 4/1; 2/1 since
    session 8's row_tiles.row_sums), not at 2-warp tiles (the last bits differ there, within the
    float bound: the sums over the tile's chunks are compiled for another layout)."""
    return loads == "scalar" or not config.elementwise or config.num_warps == 1


@pytest.mark.parametrize("config", TILES, ids=lambda c: f"{c.block_n}/{c.num_warps}/{c.unroll}/{c.split}/"
                         f"{'e' if c.elementwise else 'g'}")
@pytest.mark.parametrize("loads", sorted(q4_k_tiled.FAMILIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_gives_the_gguf_bits(backend, loads, config):
    """Every integer step on the tiled layout (q4_k's, the header in one load, x's sums in one too)
    against q4_k's on the GGUF blocks: the same integer sums and float steps, so the same bits (the
    interpreter: always; the GPU: same_bits_on_cuda), else within the float bound."""
    if loads.startswith("vector") and not config.elementwise:
        pytest.skip("the rows tile runs q4_k's step whatever the vector loads")
    if loads == "pairx" and (config.block_n, config.num_warps, config.elementwise) != (4, 1, True):
        pytest.skip("pairx runs on the 4-row one-warp elementwise tile only (test_pairx_refuses_other_tiles)")
    rows, cols = (4100, 4096) if backend == "cuda" else (12, 768)  # whole tiles, not whole program tiles
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    x = torch.randn(cols, device=backend)
    tiled = q4_k_tiled.pack(raw, (rows, cols), loads=loads)
    assert tiled.data.numel() == raw.numel()
    want = gemv(raw, T.Q4_K, (rows, cols), x, config=config)
    got = q4_k_tiled.gemv(tiled, x, config=config, loads=loads)
    W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
    assert rel_err(got, W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]
    if loads == "pairx":
        return  # q4_k's integer sums, another float order (per thread and row, then over the tile's threads)
    if loads == "bytes" and not config.elementwise:
        return  # bytes' rows tile sums the elementwise tile per group: q4_k's rows step adds in another order
    if backend == "cpu" or same_bits_on_cuda(loads, config):
        assert torch.equal(got, want)


@triton.jit
def _both_scales(hdr_ptr, out_ptr):
    """For block b's 16 header bytes at hdr_ptr + 16 b (GGUF order) and + 16 (B + b) (bytes order):
    q4_k.scale_min_words' (sc, mn) of sub-blocks 0-7, then chunk_scales' by chunk j, as int32 [B, 2, 4, 4]."""
    b = tl.program_id(0)
    words = (hdr_ptr + 16 * b).to(tl.pointer_type(tl.int32))
    bwords = (hdr_ptr + 16 * (tl.num_programs(0) + b)).to(tl.pointer_type(tl.int32))
    j = tl.arange(0, 4)
    a, bb, c = tl.load(words + 1 + 0 * j), tl.load(words + 2 + 0 * j), tl.load(words + 3 + 0 * j)
    sc_lo, mn_lo = q4_k.scale_min_words(a, bb, c, 2 * j)
    sc_hi, mn_hi = q4_k.scale_min_words(a, bb, c, 2 * j + 1)
    got = q4_k_tiled.chunk_scales(tl.load(bwords + 1 + 0 * j), tl.load(bwords + 2 + 0 * j),
                                  tl.load(bwords + 3 + 0 * j), j)
    out = out_ptr + 32 * b + 4 * j
    tl.store(out, sc_lo)
    tl.store(out + 1, mn_lo)
    tl.store(out + 2, sc_hi)
    tl.store(out + 3, mn_hi)
    tl.store(out + 16, got[0])
    tl.store(out + 17, got[1])
    tl.store(out + 18, got[2])
    tl.store(out + 19, got[3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bytes_scales_are_q4_k_scales(backend):
    """The bytes layout keeps every block's 6-bit scales and mins (the integer sums' only other input
    besides the qs and x, which it leaves alone): chunk_scales on the repacked header gives what
    q4_k.scale_min_words gives on the file's, for every sub-block of blocks with every 6-bit value."""
    n = 64
    raw = random_blocks(T.Q4_K, n)
    blocks = raw.view(n, 144)
    blocks[:, 4:16] = torch.arange(n * 12, dtype=torch.int64).view(n, 12).mul(37).remainder(256).to(torch.uint8)
    packed = q4_k_tiled.pack_raw(blocks.reshape(-1), (4, n * 64), loads="bytes")  # one tile of 4 rows
    bytes_hdr = packed[n * 128:].view(n // 4, 4, 16).transpose(0, 1).reshape(-1)  # [group, row] -> block order
    both = torch.cat([blocks[:, :16].reshape(-1), bytes_hdr]).to(backend)
    out = torch.zeros(n, 2, 4, 4, dtype=torch.int32, device=backend)
    _both_scales[(n,)](both, out)
    assert torch.equal(out[:, 0], out[:, 1])
    assert int(out[:, 0].max()) == 63 and int(out[:, 0].min()) == 0


def test_the_default_loads_are_the_pairx_step():
    """FAMILY (what matmul.gemv runs on TILED) is the H200's pick (session 8: pairx), session 7's bytes
    step, session 6's vector step and q4_k's one switch away; pack_raw makes the layout FAMILY reads."""
    assert q4_k_tiled.LOADS == os.environ.get(q4_k_tiled.LOADS_ENV, "pairx")
    assert q4_k_tiled.FAMILY is q4_k_tiled.FAMILIES[q4_k_tiled.LOADS]
    assert q4_k_tiled.FAMILIES["scalar"].idot is q4_k_tiled.idot
    assert q4_k_tiled.pack(random_blocks(T.Q4_K, 4), (4, 256)).layout == q4_k_tiled.layout_of(q4_k_tiled.LOADS)


def test_unknown_loads_is_a_clear_error():
    w = q4_k_tiled.pack(random_blocks(T.Q4_K, 4), (4, 256))
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the Q4_K_TILED GEMV: loads 'wide' is "
                                                           r"not one of \['bytes', 'pairx', 'scalar', 'vector'\]"):
        q4_k_tiled.gemv(w, torch.zeros(256), loads="wide")


def test_tiled_layout_is_tiles_of_qs_then_headers():
    """Byte for byte (on the host: no kernel): tile t holds its 4 rows' qs group by group, then
    their headers group by group."""
    rows, cols = 8, 512
    raw = random_blocks(T.Q4_K, rows * 2)
    blocks = raw.view(rows, 2, 144)
    data = q4_k_tiled.pack_raw(raw, (rows, cols), loads="vector").view(2, 1152)  # 2 tiles of 4 rows x 2 groups x 144
    for t in range(2):
        for g in range(2):
            for lane in range(4):
                blk = blocks[4 * t + lane, g]
                assert torch.equal(data[t, g * 512 + lane * 128:][:128], blk[16:])
                assert torch.equal(data[t, 1024 + g * 64 + lane * 16:][:16], blk[:16])


def test_a_tensor_packed_for_another_step_is_refused():
    """The bytes steps read another header order: a tensor packed for the GGUF one is refused, and back."""
    raw = random_blocks(T.Q4_K, 4)
    for packed_for, loads in (("vector", "bytes"), ("bytes", "vector"), ("bytes", "pairx"), ("pairx", "bytes")):
        w = q4_k_tiled.pack(raw, (4, 256), loads=packed_for)
        with pytest.raises(dispatch.KernelArgumentError,
                           match=rf"could not run the Q4_K_TILED GEMV: loads '{loads}' reads the \w+ header order, "
                                 r"the tensor has the \w+ one"):
            q4_k_tiled.gemv(w, torch.zeros(256), loads=loads)


def test_pairx_refuses_other_tiles():
    """The pairx step is written for one warp on one 4-row tile: any other tile is a clear error, nothing run."""
    w = q4_k_tiled.pack(random_blocks(T.Q4_K, 8), (8, 256), loads="pairx")
    out = torch.full((8,), 7.0)
    refusal = (r"could not run the Q4_K_TILED GEMV: its integer step runs on the elementwise tile of 4 rows on 1 "
               r"warp\(s\) only, not 8 rows on 2")
    with pytest.raises(dispatch.KernelArgumentError, match=refusal):
        q4_k_tiled.gemv(w, torch.zeros(256), out=out, config=GemvConfig(block_n=8, num_warps=2), loads="pairx")
    if q4_k_tiled.LOADS == "pairx":  # the engine's own call (matmul.gemv on TILED) refuses the same way
        with pytest.raises(dispatch.KernelArgumentError, match=refusal):
            gemv(w.data, q4_k_tiled.TILED, (8, 256), torch.zeros(256), out=out, config=GemvConfig(block_n=8, num_warps=2))
    assert torch.equal(out, torch.full((8,), 7.0))


@pytest.mark.parametrize("loads", ["bytes", "pairx"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bytes_layout_gemm_gives_the_gguf_bits(backend, loads, monkeypatch):
    """The GEMM's dequant on the bytes and pairx layouts (what prefill runs when that step is the default)."""
    from sparkd.engine.kernels.prefill_gemm import gemm

    rows, cols = (516, 2048) if backend == "cuda" else (8, 512)
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    xs = torch.randn(3, cols, device=backend)
    want = gemm(raw, T.Q4_K, (rows, cols), xs, precision="ieee")
    monkeypatch.setitem(dispatch.LAYOUTS, q4_k_tiled.TILED, q4_k_tiled.FAMILIES[loads])
    got = gemm(q4_k_tiled.pack_raw(raw, (rows, cols), loads=loads), q4_k_tiled.TILED, (rows, cols), xs,
               precision="ieee")
    assert torch.equal(got, want)

