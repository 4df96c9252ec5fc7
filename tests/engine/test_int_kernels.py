"""The integer path of the Q8_0, Q4_K and Q6_K kernels: activations quantized on the device exactly as
act_round (and llama.cpp) rounds them, dp4a against its emulation, and the kernels inside a CUDA
graph capture. The kernels' results against the float64 reference are in test_kernels.py (its
references round x as these kernels do).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
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

from test_kernels import BACKENDS, BOUNDS, TILES, arena_table, moe_reference, random_blocks, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, default_config, gemv  # noqa: E402
from sparkd.engine.kernels.moe import moe_decode, prepare  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

DEV = "cuda" if ON_GPU else "cpu"


def awkward_x(rows: int, cols: int) -> torch.Tensor:
    """Random rows at mixed magnitudes, plus the edge cases of the scale: a zero block, the
    largest magnitude held by a negative value, and a tie between +max and -max."""
    x = torch.randn(rows, cols) * 10.0 ** torch.empty(rows, 1).uniform_(-3, 2)
    x[0, :256] = 0.0
    x[-1, 7] = -x[-1].abs().max() * 1.5
    x[-1, 300] = -x[-1, 7]
    return x


@pytest.mark.parametrize("fmt", [act_quant.Q8_0, act_quant.Q8_K])
@pytest.mark.parametrize("backend", BACKENDS)
def test_quantized_x_equals_act_round_bit_for_bit(backend, fmt):
    x = awkward_x(3, 1024 if backend == "cuda" else 512)
    q = act_quant.quantize(x.to(backend), fmt)
    # + 0.0: a zero quant times a negative scale is -0.0 here, +0.0 in torch's rounding
    assert torch.equal(q.dequantize().cpu() + 0.0, round_activations(x, fmt) + 0.0)
    if fmt == act_quant.Q8_K:  # the per-32 sums the min term uses
        quants = q.words.view(torch.int8).cpu().int()
        assert torch.equal(quants.reshape(3, -1, 32).sum(-1), q.sums.cpu())


@pytest.mark.parametrize("case", ["dtype", "cols", "fmt", "dims"])
def test_quantize_rejects_bad_arguments(case):
    x = torch.randn(2, 256, device=DEV)
    arg, fmt = {"dtype": (x.double(), "q8_0"), "cols": (x[:, :48].contiguous(), "q8_0"),
                "fmt": (x, "q4_0"), "dims": (x[0], "q8_k")}[case]
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the q[48]_[0k] quantization"):
        act_quant.quantize(arg, fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_dp4a_matches_its_emulation(qtype):
    """The PTX dp4a and the shift-and-multiply emulation the interpreter runs give the same sums
    (bitwise, no split-K: the float steps happen in the same order)."""
    rows, cols = 1031, 4096
    raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values).cuda()
    x = torch.randn(cols, device="cuda")
    got = [gemv(raw, qtype, (rows, cols), x, config=GemvConfig(split=1, dp4a=asm)) for asm in (True, False)]
    assert torch.equal(*got)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_integer_kernels_replay_in_a_cuda_graph(qtype):
    """Quantizing x, the GEMV and the MoE decode capture into one graph; a replay with new inputs
    gives what a direct call gives (no host sync, nothing decided on device values)."""
    rows, dim, width, n = 515, 2048, 768, 8
    raw = random_blocks(qtype, rows * dim // dispatch.FAMILIES[qtype].block_values).cuda()
    table = prepare(arena_table(qtype, qtype, dim, width, n, "cuda")[0], "cuda")  # offsets copied before
    x, w = torch.randn(dim, device="cuda"), torch.rand(n, device="cuda")
    y_lin, y_moe = torch.empty(rows, device="cuda"), torch.empty(dim, device="cuda")
    cfg = GemvConfig(split=3)  # the ordered split-K reduction captures too

    def step():
        gemv(raw, qtype, (rows, dim), x, out=y_lin, config=cfg)
        moe_decode(table, x, w, out=y_moe)
    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    x.copy_(torch.randn(dim, device="cuda"))
    w.copy_(torch.rand(n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_lin, gemv(raw, qtype, (rows, dim), x, config=cfg))
    assert torch.equal(y_moe, moe_decode(table, x, w))  # experts summed in table order, no atomics


# (gate/up type, down type, gate/up tile rows holding whole blocks of the down's activation format)
# (tiles of part of a block: the block's last program quantizes it)
FUSED = [(T.Q8_0, T.Q8_0, 32), (T.Q4_K, T.Q4_K, 256), (T.Q8_0, T.Q8_0, 8), (T.Q4_K, T.Q4_K, 64),
         (T.Q4_K, T.Q6_K, 64)]  # Q4_K_M's experts: Q6_K down


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("gu_type,d_type,rows", FUSED, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_h_quantization_matches_the_separate_launch(backend, gu_type, d_type, rows):
    """fuse_quant: gate/up quantizes h itself (one launch fewer). The interpreter has no FMA
    contraction: the same bits as the separate quantization; the GPU: the reference's bound."""
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, n, backend)
    x, w = torch.randn(dim), torch.rand(n)
    tile = GemvConfig(block_n=rows, num_warps=4 if backend == "cuda" else 1, unroll=1)
    down = TILES[backend].get("down")
    fused = moe_decode(table, x.to(backend), w.to(backend), gate_up=dataclasses.replace(tile, fuse_quant=True),
                       down=down)
    if backend == "cpu":
        assert torch.equal(fused, moe_decode(table, x, w, gate_up=tile, down=down))
    err = rel_err(fused, moe_reference(x, w, gates, ups, downs, "silu", gu_type, d_type))
    assert err < BOUNDS["fp32"], err


@pytest.mark.parametrize("d_type,rows", [(T.Q5_K, 256)], ids=["float-down"])
def test_fuse_quant_needs_an_integer_down(d_type, rows):
    table, *_ = arena_table(T.Q8_0, d_type, 256, 256, 2, DEV)
    out = torch.full((256,), float("nan"), device=DEV)
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the MoE decode kernels: fuse_quant needs"):
        moe_decode(table, torch.randn(256, device=DEV), torch.rand(2, device=DEV), out=out,
                   gate_up=GemvConfig(block_n=rows, fuse_quant=True))
    assert torch.isnan(out).all()


@pytest.mark.parametrize("config", [None, GemvConfig(block_n=8, num_warps=1, unroll=1, split=2),
                                    GemvConfig(block_n=8, num_warps=1, unroll=2, elementwise=False),
                                    GemvConfig(block_n=4, num_warps=1, unroll=4, elementwise=True)],
                         ids=["default", "split-tile", "rows", "tile-u4"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_q8_0_gives_the_gguf_layouts_sums(backend, config):
    """Repacked (272-byte groups: quants, then scales) the GEMV computes the same sums as on the
    GGUF blocks, and the GEMM the same products; rows ending inside a 256-value group included."""
    from sparkd.engine.kernels import q8_0_packed
    from sparkd.engine.kernels.prefill_gemm import gemm
    rows, cols = (1031, 2080) if backend == "cuda" else (21, 288)
    raw = random_blocks(T.Q8_0, rows * cols // 32).to(backend)
    x = torch.randn(cols, device=backend)
    packed = q8_0_packed.pack(raw, (rows, cols))
    assert packed.data.numel() == rows * q8_0_packed.row_bytes(cols) and q8_0_packed.row_bytes(cols) % 16 == 0
    ref_config = config or default_config(dispatch.family(q8_0_packed.PACKED))  # the same tile on both
    got = q8_0_packed.gemv(packed, x, config=config)
    want = gemv(raw, T.Q8_0, (rows, cols), x, config=ref_config)
    xs = torch.randn(3, cols, device=backend)
    got_mm = gemm(packed.data, q8_0_packed.PACKED, (rows, cols), xs, precision="ieee")
    want_mm = gemm(raw, T.Q8_0, (rows, cols), xs, precision="ieee")
    if backend == "cpu":  # the same steps in the same order
        assert torch.equal(got, want) and torch.equal(got_mm, want_mm)
    else:  # the compiler may lay the tile out (and so reduce it) differently
        assert float((got - want).norm() / want.norm()) < 1e-6
        assert float((got_mm - want_mm).norm() / want_mm.norm()) < 1e-6


@pytest.mark.parametrize("config", [GemvConfig(block_n=4, num_warps=1, unroll=3, split=2, elementwise=True),
                                    GemvConfig(block_n=2, num_warps=1, unroll=8, split=1, elementwise=True)],
                         ids=["tile-split-tail", "tile-u8"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_q4_k_tiles_give_the_old_tiles_sums(backend, config):
    """The Q4_K elementwise tiles (the default since kern6; x loaded in the words' shape) against
    session 3's rows tile: the same integer sums per block, only the float order of the last
    reduction differs; rows past the end of a tile and groups past the end of a range masked."""
    from test_kernels import act_in, reference
    from sparkd.engine.kernels.matmul import OLD_GEMV_TILES
    rows, cols = (4099, 2816) if backend == "cuda" else (11, 768)
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    x = torch.randn(cols, device=backend)
    old = gemv(raw, T.Q4_K, (rows, cols), x, config=OLD_GEMV_TILES["Q4_K"])
    W, xr = reference(raw, T.Q4_K, (rows, cols)), act_in(T.Q4_K, x.cpu())
    scale = W.abs() @ xr.abs()
    for cfg in (config, None):  # None: the default tile
        got = gemv(raw, T.Q4_K, (rows, cols), x, config=cfg)
        assert rel_err(got, old.cpu().double(), scale) < 1e-6
        assert rel_err(got, W @ xr, scale) < BOUNDS["fp32"]


def test_packed_q8_0_layout_is_groups_of_quants_then_scales():
    """Byte for byte: each row's groups hold the 256 quants, then the 8 scales; a partial last
    group is zero past the row's end (checked on the host: no kernel)."""
    from sparkd.engine.kernels import q8_0_packed
    rows, cols = 3, 288  # one whole group and one block of the next
    raw = random_blocks(T.Q8_0, rows * cols // 32)
    data = q8_0_packed.pack_raw(raw, (rows, cols)).view(rows, 2, 272)
    blocks = raw.view(rows, 9, 34)
    assert torch.equal(data[:, 0, :256], blocks[:, :8, 2:].reshape(rows, 256))
    assert torch.equal(data[:, 0, 256:], blocks[:, :8, :2].reshape(rows, 16))
    assert torch.equal(data[:, 1, :32], blocks[:, 8, 2:]) and torch.equal(data[:, 1, 256:258], blocks[:, 8, :2])
    assert not data[:, 1, 32:256].any() and not data[:, 1, 258:].any()


def test_packed_q8_0_rejects_bad_arguments():
    from sparkd.engine.kernels import q8_0_packed
    raw = random_blocks(T.Q8_0, 8).to(DEV)
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q8_0 repacking: need 340 bytes"):
        q8_0_packed.pack(raw, (5, 64))
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q8_0 repacking: 48 columns"):
        q8_0_packed.pack(raw, (2, 48))
    packed = q8_0_packed.pack(raw, (4, 64))
    out = torch.full((4,), float("nan"), device=DEV)
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q8_0_PACKED GEMV"):
        q8_0_packed.gemv(packed, torch.randn(32, device=DEV), out=out)
    assert torch.isnan(out).all()
