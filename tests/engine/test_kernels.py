"""Triton kernels on raw GGUF blocks against the torch CPU reference (quants.dequantize, then a
float64 matmul), on fresh random valid blocks and activations for every check.

Where there is no GPU the kernels run under TRITON_INTERPRET=1 on the CPU with tiny shapes; on the
GPU box the same checks run compiled (marker gpu) with larger shapes. Outputs are poisoned with
NaN first so an unwritten element fails. Error bounds (relative Frobenius norm) come from
measurement, see BOUNDS.
"""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    # must be set before the kernels are decorated, i.e. before sparkd.engine.kernels is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton: 3.9.0 "
                                              "runs the interpreter next to the CPU torch)")

from sparkd.engine import quants  # noqa: E402
from sparkd.engine.errors import UnsupportedTypeError  # noqa: E402
from sparkd.engine.kernels import act_quant, dispatch, q4_k_tiled, q6_k_tiled, q8_0_packed  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.kernels import moe, prefill_gemm  # noqa: E402
from sparkd.engine.kernels import moe_prefill as prefill_moe  # noqa: E402  (the module; its function moe_prefill)
from sparkd.engine.kernels.prefill_gemm import GEMM_BLOCK_T, GROUPED_BLOCK_TS, gemm, grouped_gemm  # noqa: E402
from sparkd.engine.kernels.moe import ExpertTable, down_input, moe_decode, prepare  # noqa: E402
from sparkd.engine.kernels.moe_prefill import expert_tiles, moe_prefill  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402
from sparkd.engine.layers.ffn import ACTIVATIONS, kernel_act, swiglu_limited  # noqa: E402
from sparkd.engine.layers.situ import situ  # noqa: E402
from sparkd.engine.modelgen.blocks import set_iq1_m_d  # noqa: E402

# Measured worst relative errors (docs/performance.md): float32 kernels <= 2.2e-7 on the H200 and
# ~3e-7 under the interpreter; bounds leave >10x headroom. tf32 is bounded from tl.dot's
# input rounding (~1e-3 relative per product) rather than a separate measurement; tf32x3 (three tf32
# products, ~2^-21 per product) at 10x float32's bound.
BOUNDS = {"fp32": 5e-6, "tf32": 5e-3, "tf32x3": 5e-5}

BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant "
                       "runs where there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
TYPES = list(dispatch.FAMILIES)
F16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q2_K: [80, 82], T.Q3_K: [108],
              T.Q4_0: [0], T.IQ4_XS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ3_XXS: [0], T.IQ1_S: [0],
              T.IQ1_M: [], T.MXFP4: [], T.IQ2_S: [0], T.IQ3_S: [0], T.Q5_0: [0], T.Q5_1: [0, 2],
              T.IQ4_NL: [0]}
HALF_TYPES = {T.F16: torch.float16, T.BF16: torch.bfloat16}  # session 36: the files' unquantized weights


def numpy_rng() -> np.random.Generator:
    """A numpy generator seeded off torch's, which tests/engine/conftest.py seeds per test: a test's
    random blocks are the same alone or anywhere in the suite. (An unseeded module generator gave
    every CI run other data; one run drew an h value at a rounding boundary, where the float64
    reference and the fp32 kernel round to different int8 quants: 9.5e-6 against the 5e-6 bound.)"""
    return np.random.default_rng(int(torch.randint(0, 2**62, ())))


def random_blocks(qtype: T, n_blocks: int) -> torch.Tensor:
    """Valid random blocks: random bytes with finite f16 scales (1e-3..1e-1, both signs); F16 and BF16 (runs of 32
    values): normal values, whose random bits would be NaNs and infinities."""
    fam, rng = dispatch.FAMILIES[qtype], numpy_rng()
    if qtype in HALF_TYPES:
        values = torch.from_numpy(rng.standard_normal(n_blocks * fam.block_values, dtype=np.float32))
        return values.to(HALF_TYPES[qtype]).view(torch.uint8)
    b = rng.integers(0, 256, (n_blocks, fam.block_bytes), dtype=np.uint8)
    def scales():
        return (rng.choice([-1.0, 1.0], n_blocks) * 10.0 ** rng.uniform(-3, -1, n_blocks)).astype(np.float16)
    for at in F16_FIELDS[qtype]:
        b[:, at:at + 2] = scales().view(np.uint8).reshape(-1, 2)
    if qtype == T.IQ1_M:  # no f16 field: its d is in the scale words' top nibbles
        set_iq1_m_d(b, scales())
    if qtype == T.MXFP4:  # the e8m0 exponent byte: scales 2^-10 .. 2^-3 (the f16 fields' range)
        b[:, 0] = rng.integers(117, 125, n_blocks)
    return torch.from_numpy(b.reshape(-1))


def reference(raw: torch.Tensor, qtype: T, shape: tuple[int, int]) -> torch.Tensor:
    return quants.dequantize(raw.cpu(), qtype, shape).double()


def act_in(qtype: T | None, x: torch.Tensor) -> torch.Tensor:
    """What a kernel multiplies x [..., K] by: llama.cpp's int8 blocks for a family with an
    integer step (it quantizes x itself), x as given for the others (float64)."""
    fmt = None if qtype is None else dispatch.FAMILIES[qtype].act_fmt
    return x.double() if fmt is None else round_activations(x.float(), fmt).double()


def rel_err(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """||got - ref|| / ||scale||, scale defaulting to ref. A single row's dot product can cancel to
    near zero, so GEMV/GEMM checks pass scale = |W| @ |x|, the size rounding errors scale with."""
    got = got.cpu().double()
    assert torch.isfinite(got).all(), "an output element was not written (still NaN) or is not finite"
    return float((got - ref).norm() / (ref if scale is None else scale).norm())


def cols_for(qtype: T, big: bool) -> list[int]:
    if dispatch.FAMILIES[qtype].block_values == 32:  # rows ending inside a 256-value group, a single block
        return [2080, 96] if big else [288, 32]
    return [2048, 768] if big else [512]


def shapes(backend: str, qtype: T) -> list[tuple[int, int]]:
    big = backend == "cuda"
    rows = [4099, 777, 1] if big else [37, 1]  # odd, not a multiple of any tile, a single row
    return [(r, c) for r in rows for c in cols_for(qtype, big)]


# the default tiles, and split-K with an unroll that overruns each range (masked tail groups)
GEMV_CONFIGS = [None, GemvConfig(block_n=2, num_warps=1, unroll=3, split=2, elementwise=False)]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=["default", "split"])
def test_gemv_matches_reference(backend, qtype, config):
    for rows, cols in shapes(backend, qtype):
        raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
        x = torch.randn(cols)
        out = torch.full((rows,), float("nan"), device=backend)
        gemv(raw.to(backend), qtype, (rows, cols), x.to(backend), out=out, config=config)
        W, xr = reference(raw, qtype, (rows, cols)), act_in(qtype, x)
        err = rel_err(out, W @ xr, W.abs() @ xr.abs())
        assert err < BOUNDS["fp32"], f"{qtype.name} [{rows}, {cols}]: relative error {err:.2e}"


# one of each GEMV launch: the integer step (Q8_0's x blocks without sums, Q4_K's with them), the warps_k launch (the
# resident pairx layout at split 2) and the float step (Q5_K); a split forced so the whole and each group share it
GROUPED_CASES = {"q8_0": GemvConfig(block_n=2, num_warps=1, unroll=2, split=2),
                 "q4_k": GemvConfig(block_n=4, num_warps=1, unroll=1, split=1),
                 "q4_k_pairx": GemvConfig(block_n=4, num_warps=1, unroll=1, split=2, warps_k=True),
                 "q5_k": GemvConfig(block_n=4, num_warps=1, unroll=2, split=2)}


@pytest.mark.parametrize("layout", GROUPED_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_gemv_is_each_groups_gemv(backend, layout):
    """gemv on x [G, cols] (DeepSeek V4's grouped output projection, one launch): group g's rows times x[g], the bits
    of that group's own GEMV, within float32 rounding of the float64 product."""
    qtype, ltype, pack = INT8_LAYOUTS.get(layout, (T.Q5_K, T.Q5_K, None))
    cfg, G, R = GROUPED_CASES[layout], 3, 8
    cols = dispatch.FAMILIES[qtype].block_values * 2
    raw = random_blocks(qtype, G * R * cols // dispatch.FAMILIES[qtype].block_values)
    w = (raw if pack is None else pack(raw, (G * R, cols))).to(backend)
    x = torch.randn(G, cols, device=backend)
    y = gemv(w, ltype, (G * R, cols), x, config=cfg)
    row_bytes = w.numel() // (G * R)
    for g in range(G):
        own = gemv(w[g * R * row_bytes:(g + 1) * R * row_bytes], ltype, (R, cols), x[g].contiguous(), config=cfg)
        assert torch.equal(y[g * R:(g + 1) * R], own), f"{layout} group {g}"
    W, xr = reference(raw, qtype, (G * R, cols)).view(G, R, cols), act_in(qtype, x.cpu())
    want, scale = torch.einsum("grk,gk->gr", W, xr), torch.einsum("grk,gk->gr", W.abs(), xr.abs())
    assert rel_err(y.view(G, R), want, scale) < BOUNDS["fp32"]


@pytest.mark.parametrize("T_tok, R", [(1, 8), (1, 2), (3, 8)], ids=["one-launch", "per-group", "prompt"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_linear_grouped_is_the_float_layers(backend, T_tok, R):
    """KernelLinear.grouped (DeepSeek V4's wo_a): a token in one grouped launch, or a GEMV per group where a group's
    rows (2) are fewer than a program's, a prompt a GEMM per group: Linear.grouped's product on the same blocks
    (x rounded as llama.cpp's matmul for Q8_0 does), within float32 rounding."""
    from sparkd.engine.layers.act_round import vec_dot_format
    from sparkd.engine.layers.linear import KernelLinear, Linear

    G, cols = 3, 64
    raw = random_blocks(T.Q8_0, G * R * cols // 32)
    fmt = vec_dot_format(T.Q8_0)
    kernel = KernelLinear(raw.to(backend), T.Q8_0, (G * R, cols), act_fmt=fmt)
    W = reference(raw, T.Q8_0, (G * R, cols)).float()
    x = torch.randn(T_tok, G, cols)
    got = kernel.grouped(x.to(backend))
    assert got.shape == (T_tok, G, R)
    want = Linear(W, act_fmt=fmt).grouped(x).double()
    scale = torch.einsum("tgi,gri->tgr", x.abs().double(), W.abs().double().view(G, R, cols))
    assert rel_err(got, want, scale) < BOUNDS["fp32"]


@pytest.mark.parametrize("case", ["rows", "tile", "qx"])
def test_grouped_gemv_refuses_groups_that_split_a_tile(case):
    """12 rows in 5 groups; 3 groups of 4 rows on 8-row programs; a pre-quantized x (one row): refused, y untouched."""
    dev = _dev()
    raw = random_blocks(T.Q4_K, 12).to(dev)
    x = torch.randn(5 if case == "rows" else 3, 256, device=dev)
    out = torch.full((12,), float("nan"), device=dev)
    qx = act_quant.quantize(x[:1].contiguous(), act_quant.Q8_K) if case == "qx" else None
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the Q4_K GEMV on \d groups: need 12 rows"):
        gemv(raw, T.Q4_K, (12, 256), x, out=out, config=GemvConfig(block_n=8 if case == "tile" else 4), qx=qx)
    assert torch.isnan(out).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemm_matches_reference(backend, qtype):
    rows, cols = shapes(backend, qtype)[0]
    for precision, n_tok in (("ieee", 19), ("tf32", 5 if backend == "cpu" else 70), ("tf32x3", 21)):
        raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
        x = torch.randn(n_tok, cols)
        out = torch.full((n_tok, rows), float("nan"), device=backend)
        gemm(raw.to(backend), qtype, (rows, cols), x.to(backend), precision, out=out)
        W = reference(raw, qtype, (rows, cols))
        err = rel_err(out, x.double() @ W.T, x.double().abs() @ W.abs().T)
        bound = BOUNDS["fp32" if precision == "ieee" or backend == "cpu" else precision]
        assert err < bound, f"{qtype.name} {precision} [{rows}, {cols}] x {n_tok}: relative error {err:.2e}"


# odd token counts (one past the int8 tile's 64 on each backend), rows not a multiple of its 64
# (K-quants: a multiple of the pairx tile's 4 and of q6_k_tiled's 8; the i-quants: no tiled layout, two groups a row)
INT8_SHAPES = {"cpu": ((37, 288), (5, 67)), "cuda": ((4099, 2048), (7, 130))}
INT8_SHAPES_K = {"cpu": ((16, 256), (5, 67)), "cuda": ((4104, 2048), (7, 130))}
INT8_SHAPES_IQ = {"cpu": ((37, 512), (5, 67)), "cuda": ((4099, 2048), (7, 130))}
GRID_TYPES = (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ1_S, T.IQ1_M, T.IQ2_S, T.IQ3_S)  # the grid i-quants (integer GEMM since session 23)
INT8_SHAPES_OF = {T.Q8_0: INT8_SHAPES, T.Q4_0: INT8_SHAPES, T.Q5_0: INT8_SHAPES, T.IQ4_NL: INT8_SHAPES,
                  T.MXFP4: INT8_SHAPES, T.IQ4_XS: INT8_SHAPES_IQ, **{t: INT8_SHAPES_IQ for t in GRID_TYPES}}
# (qtype, the layout's qtype, its packing of the GGUF blocks or None), by test id
INT8_LAYOUTS = {"q8_0": (T.Q8_0, T.Q8_0, None),
                "q8_0_packed": (T.Q8_0, q8_0_packed.PACKED, q8_0_packed.pack_raw),
                "q4_k": (T.Q4_K, T.Q4_K, None),
                "q4_k_pairx": (T.Q4_K, q4_k_tiled.TILED, lambda raw, shape: q4_k_tiled.pack_raw(raw, shape, "pairx")),
                "q6_k": (T.Q6_K, T.Q6_K, None),
                "q6_k_tiled": (T.Q6_K, q6_k_tiled.TILED, q6_k_tiled.pack_raw),
                "q4_0": (T.Q4_0, T.Q4_0, None), "q5_0": (T.Q5_0, T.Q5_0, None), "iq4_nl": (T.IQ4_NL, T.IQ4_NL, None),
                "iq4_xs": (T.IQ4_XS, T.IQ4_XS, None), "mxfp4": (T.MXFP4, T.MXFP4, None),
                **{t.name.lower(): (t, t, None) for t in GRID_TYPES}}
GRID_LAYOUTS = tuple(t.name.lower() for t in GRID_TYPES)
# the interpreter's share (~10 s a case); all on the GPU
INTERPRETED = ("q8_0", "q8_0_packed", "q4_k_pairx", "q6_k_tiled", "q4_0", "q5_0", "iq4_nl", "iq4_xs", "mxfp4", *GRID_LAYOUTS)


def backend_cases(interpreted, every) -> list:
    """(backend, case) params: the interpreter's cases (BACKENDS' cpu marks) and every case on the GPU."""
    cpu, cuda = BACKENDS
    return [pytest.param("cpu", c, id=f"{cpu.id}-{getattr(c, 'name', c)}", marks=cpu.marks) for c in interpreted] + \
        [pytest.param("cuda", c, id=f"{cuda.id}-{getattr(c, 'name', c)}", marks=cuda.marks) for c in every]


@pytest.mark.parametrize("backend, layout", backend_cases(("q8_0", "q4_k_pairx", "q4_0", "q5_0"), INT8_LAYOUTS))
def test_kernel_linear_dense_is_the_blocks_values(backend, layout):
    """KernelLinear.dense (kernels/dequantize.py; MLA's prompt over its per-head matrices): exactly the values the
    blocks hold, in the GGUF layouts and the resident ones; rows of 32-value blocks end inside a group."""
    from sparkd.engine.layers.linear import KernelLinear

    qtype, kind, pack = INT8_LAYOUTS[layout]
    rows, cols = 16, 384 if dispatch.FAMILIES[qtype].block_values == 32 else 512
    raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
    laid = raw if pack is None else pack(raw, (rows, cols))
    got = KernelLinear(laid.to(backend), kind, (rows, cols)).dense()
    assert got.shape == (rows, cols) and got.is_contiguous() and got.dtype == torch.float32
    assert torch.equal(got.cpu(), quants.dequantize(raw, qtype, (rows, cols)))


@pytest.mark.parametrize("backend, qtype", backend_cases((T.F16, T.BF16), (T.F16, T.BF16)))
def test_a_16_bit_prompt_projection_is_its_values_product(backend, qtype, monkeypatch):
    """An F16 / BF16 KernelLinear over several rows (SPARKD_HALF_PROMPT): cuBLAS over the values widened ("torch"),
    over the 16-bit values on CUDA ("half", the default; the CPU widens them) and prefill_gemm's tf32 GEMM ("kernel")
    all give x rounded to the type times the blocks' values, within float32's bound of float64, every part of a stack
    (rows of 32-value runs, the last group partial)."""
    from sparkd.engine.layers import linear
    from sparkd.engine.layers.act_round import vec_dot_format

    rows, cols = (40, 24), 352
    raws = [random_blocks(qtype, r * cols // 32) for r in rows]
    parts = [linear.KernelLinear(raw.to(backend), qtype, (r, cols), None, vec_dot_format(qtype))
             for raw, r in zip(raws, rows)]
    stack = linear.KernelLinear.stack(parts)
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(2))
    xr = round_activations(x, vec_dot_format(qtype)).double()
    want = torch.cat([xr @ quants.dequantize(raw, qtype, (r, cols)).double().T for raw, r in zip(raws, rows)], 1)
    for way in ("torch", "half", "kernel"):
        monkeypatch.setattr(linear, "HALF_PROMPT", way)
        got = stack(x.to(backend)).cpu().double()
        assert got.shape == want.shape
        assert float((got - want).norm() / want.norm()) < 1e-6, way


@pytest.mark.parametrize("backend, qtype", backend_cases((T.Q8_0, T.Q4_K, T.BF16),
                                                         (T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.F16, T.BF16)))
def test_kernel_embedding_rows_are_the_blocks_rows(backend, qtype):
    """KernelEmbedding (the token embedding on the GPU path, session 35; an F16 or BF16 one since session 36): a lookup
    is exactly the looked-up rows' values, repeats and any order, [*ids.shape, D]; ids outside the vocabulary read
    nothing (zeros)."""
    from sparkd.engine.layers.embedding import KernelEmbedding

    rows, cols = 37, 512
    raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
    emb = KernelEmbedding(raw.to(backend), qtype, (rows, cols))
    want = quants.dequantize(raw, qtype, (rows, cols))
    ids = torch.tensor([[36, 0, 5], [5, 17, 36]], device=backend)
    got = emb[ids]
    assert got.shape == (2, 3, cols) and torch.equal(got.cpu(), want[ids.cpu()])
    assert torch.equal(emb[torch.tensor([7], dtype=torch.int32, device=backend)].cpu(), want[7:8])
    assert not emb[torch.tensor([-1, rows], device=backend)].cpu().any()


def test_dequantize_refuses_bytes_that_are_not_the_matrix():
    from sparkd.engine.kernels.dequantize import dequantize

    raw = random_blocks(T.Q8_0, 12).to(_dev())
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the Q8_0 dequantization: need 340 weight "
                                                            r"bytes in whole tiles of 1 rows for \[10, 32\], got 408"):
        dequantize(raw, T.Q8_0, (10, 32))
    with pytest.raises(dispatch.KernelArgumentError, match="not a positive multiple of the Q8_0 block"):
        dequantize(raw, T.Q8_0, (12, 48))
    with pytest.raises(dispatch.KernelArgumentError, match=r"row ids must be integers \[n\] on .*, got torch.float32"):
        dequantize(raw, T.Q8_0, (12, 32), torch.zeros(3, device=_dev()))


@pytest.mark.parametrize("backend, layout", backend_cases(INTERPRETED, INT8_LAYOUTS))
def test_int8_gemm_is_the_decode_integer_sums(backend, layout, monkeypatch):
    """gemm at "int8" on Q8_0 (GGUF and packed), Q4_K (GGUF and pairx), Q6_K (GGUF and tiled), Q4_0 and IQ4_XS
    (session 22), IQ2_XXS, IQ3_XXS, IQ2_XS and IQ1_S (session 23): x's Q8_0 / Q8_K blocks times W's in exact integer
    sums, scaled per block (the K-quants and the i-quants: their scales (and mins) in integers, a float step per 256
    values): within float32 rounding of the float64 product
    of the same quantized values, and of igemv's rows (the decode's GEMV on each token; the scaled blocks added in
    another order); a repacked layout gives its GGUF blocks' bits (the engine's logits the same on both resident
    layouts), and session 11's loop and tiles (prefill_gemm.IGEMM_TILES) give session 10's bits
    (prefill_gemm.S10_IGEMM)."""
    qtype, ltype, pack = INT8_LAYOUTS[layout]
    (rows, cols), counts = INT8_SHAPES_OF.get(qtype, INT8_SHAPES_K)[backend]
    raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
    W = reference(raw, qtype, (rows, cols))
    w = (raw if pack is None else pack(raw, (rows, cols))).to(backend)
    fmt = dispatch.FAMILIES[qtype].act_fmt
    for n_tok in counts:
        x = torch.randn(n_tok, cols, device=backend)
        y = gemm(w, ltype, (rows, cols), x, "int8")
        if pack is not None and (backend == "cuda" or n_tok == counts[0]):  # the interpreter: one GEMM more
            assert torch.equal(y, gemm(raw.to(backend), qtype, (rows, cols), x, "int8")), f"int8 {layout}"
        if backend == "cuda":  # the interpreter: test_igemm_steps_give_session_10s_bits, every layout at 8 rows
            with monkeypatch.context() as mp:
                mp.setattr(prefill_gemm, "igemm_tile", lambda fam, grouped: prefill_gemm.S10_IGEMM)
                assert torch.equal(y, gemm(w, ltype, (rows, cols), x, "int8")), f"int8 {layout} s10"
        xq = act_quant.quantize(x, fmt).dequantize().double().cpu()
        scale = xq.abs() @ W.abs().T
        err = rel_err(y, xq @ W.T, scale)
        assert err < BOUNDS["fp32"], f"int8 {layout} [{rows}, {cols}] x {n_tok}: relative error {err:.2e}"
        some = range(n_tok) if backend == "cuda" else (0, n_tok - 1)  # the interpreter's GEMV is slow
        decode = torch.stack([gemv(w, ltype, (rows, cols), x[t]) for t in some]).cpu().double()
        apart = float(((y.cpu().double()[list(some)] - decode).abs() / scale[list(some)]).max())
        print(f"int8 GEMM vs igemv ({layout}, {n_tok} tokens): err {err:.2e}, "
              f"{apart:.2e} of |x||W| at most, {float((y.cpu()[list(some)] == decode.float()).float().mean()):.3f} equal")
        assert apart < BOUNDS["fp32"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_igemm_steps_give_session_10s_bits(backend, monkeypatch):
    """Session 11's loop (prefill_gemm._igemm_steps) on every layout, with the family's word loader (kblock), with
    iblock and (pairx) with session 12's word unpack (wblock), 2 Q8_0 blocks a step: the bits of session 10's
    loop, dense and grouped (two experts, rows in tiles); the grouped rows of expert 0 the bits of its dense GEMM
    (dense is checked against the reference in test_int8_gemm_is_the_decode_integer_sums)."""
    rows, cols, n_tok, n = 8, 256, 3, 2
    ids = torch.tensor([1, 0, 1, 1, 0, 1]).to(backend)  # the 3 tokens' 2 experts
    keys, order = torch.sort(ids, stable=True)
    src, tiles = (order // 2).to(torch.int32), expert_tiles(keys, n, 16)
    for layout, (qtype, ltype, pack) in INT8_LAYOUTS.items():
        raw = random_blocks(qtype, n * rows * cols // dispatch.FAMILIES[qtype].block_values)
        w = torch.cat([m if pack is None else pack(m, (rows, cols)) for m in raw.chunk(n)]).to(backend)
        offsets = torch.arange(n, dtype=torch.int64, device=backend) * (w.numel() // n)
        x = torch.randn(n_tok, cols, device=backend)
        got = []
        tiles_ = [prefill_gemm.S10_IGEMM, prefill_gemm.IgemmTile(16, 16, 4, 2, 2),
                  prefill_gemm.IgemmTile(16, 16, 4, 2, 2, kblock=False)]
        if dispatch.family(ltype).wblock is not None:  # pairx's 32-bit word unpack (session 12)
            tiles_.append(prefill_gemm.IgemmTile(16, 16, 4, 2, 2, words=True, maxnreg=168))
        for tile in tiles_:
            monkeypatch.setattr(prefill_gemm, "igemm_tile", lambda fam, grouped: tile)
            got.append((gemm(w[:w.numel() // n], ltype, (rows, cols), x, "int8"),
                        grouped_gemm(w, offsets, ltype, (rows, cols), x, src, tiles, "int8", block_t=16)))
        for dense, grouped in got[1:]:
            assert torch.equal(dense, got[0][0]) and torch.equal(grouped, got[0][1]), layout
        first = keys == 0
        assert torch.equal(got[0][1][first], got[0][0][src[first].long()]), layout


# the interpreter: the grid i-quants (their grouped GEMM's only check against float64 there); the GPU: every layout
@pytest.mark.parametrize("backend, layout", backend_cases(GRID_LAYOUTS, INT8_LAYOUTS))
def test_int8_grouped_gemm_matches_reference(backend, layout):
    """grouped_gemm at "int8": each routed row of expert e is x's quantized blocks times W_e within float32 rounding
    of the float64 product (random routing: experts of uneven load, most over several tiles)."""
    qtype, ltype, pack = INT8_LAYOUTS[layout]
    rows, cols, n, n_tok, top_k, block_t = (5, 512, 3, 25, 2, 16) if backend == "cpu" else \
        (776, 2048, 8, 300, 4, prefill_gemm.igemm_tile(dispatch.family(ltype), True).expert_rows)
    raw = random_blocks(qtype, n * rows * cols // dispatch.FAMILIES[qtype].block_values)
    w = torch.cat([m if pack is None else pack(m, (rows, cols)) for m in raw.chunk(n)]).to(backend)
    offsets = torch.arange(n, dtype=torch.int64, device=backend) * (w.numel() // n)
    keys, order = torch.sort(torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)]).reshape(-1), stable=True)
    src = (order // top_k).to(torch.int32)
    x = torch.randn(n_tok, cols, device=backend)
    y = grouped_gemm(w, offsets, ltype, (rows, cols), x, src.to(backend), expert_tiles(keys.to(backend), n, block_t),
                     "int8", block_t=block_t).cpu().double()
    xq = act_quant.quantize(x, dispatch.FAMILIES[qtype].act_fmt).dequantize().double().cpu()[src.long()]
    ref, scale = torch.zeros_like(y), torch.zeros_like(y)
    for e, m in enumerate(raw.chunk(n)):
        W, rows_e = reference(m, qtype, (rows, cols)), keys == e
        ref[rows_e], scale[rows_e] = xq[rows_e] @ W.T, xq[rows_e].abs() @ W.abs().T
    err = rel_err(y, ref, scale)
    assert err < BOUNDS["fp32"], f"grouped int8 {layout}: relative error {err:.2e}"


# Q4_K integer GEMM launches that ran on the H200 (session 13, prefill28): (layout, grouped, launch, expert tile
# height): s13's GGUF grouped launch, and the 64-row expert tiles its down would gain at 2048 tokens (M = 64 on 4
# warps: Triton's wgmma there, mma.sync at 32 rows); the call's other launches in bench/results/prefill28_h200_s13*
Q4K_LAUNCHES = [("q4_k", True, prefill_gemm.IgemmTile(64, 32, 4, 1, 2, kblock=False, maxnreg=168), 32),
                ("q4_k", True, prefill_gemm.IgemmTile(32, 64, 4, 1, 2, kblock=False, maxnreg=168), 64),
                ("q4_k_pairx", True, prefill_gemm.IgemmTile(32, 64, 4, 1, 2, words=True, maxnreg=168), 64)]


def _launch_id(case) -> str:
    layout, grouped, t, height = case
    return (f"{layout}-{'g' if grouped else 'd'}{t.block_n}x{height if grouped else t.block_t}w{t.num_warps}"
            f"s{t.stages}r{t.maxnreg}{'w' if t.words else ''}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", Q4K_LAUNCHES, ids=_launch_id)
def test_q4k_gemm_launches_keep_the_bits(case, monkeypatch):
    """A Q4_K layout's dense or grouped integer GEMM on a launch (grouped: at its expert tile height): the bits of
    session 12's launch (grouped: at 32-row tiles), the sums exact integers and the float steps per element in the
    same order, at a shape with several row tiles, token tiles and experts of uneven load."""
    layout, grouped, tile, height = case
    rows, cols, n, n_tok, top_k = 256, 512, 16, 200, 4
    qtype, ltype, pack = INT8_LAYOUTS[layout]
    raw = random_blocks(qtype, n * rows * cols // 256)
    w = torch.cat([m if pack is None else pack(m, (rows, cols)) for m in raw.chunk(n)]).cuda()
    x = torch.randn(n_tok, cols, device="cuda")
    if grouped:
        offsets = torch.arange(n, dtype=torch.int64, device="cuda") * (w.numel() // n)
        keys, order = torch.sort(torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)]).reshape(-1).cuda())
        src = (order // top_k).to(torch.int32)
        run = lambda t: grouped_gemm(w, offsets, ltype, (rows, cols), x, src, expert_tiles(keys, n, t), "int8",  # noqa: E731
                                     block_t=t)
    else:
        run = lambda t: gemm(w[:w.numel() // n], ltype, (rows, cols), x, "int8")  # noqa: E731
    monkeypatch.setattr(prefill_gemm, "IGEMM_WAY", "s12")
    want = run(32)
    monkeypatch.setattr(prefill_gemm, "igemm_tile", lambda fam, grouped: tile)
    assert torch.equal(run(height), want)


def test_igemm_ways_pick_their_tables(monkeypatch):
    """$SPARKD_IGEMM: s13 runs GGUF Q4_K's grouped GEMM at 168 registers (prefill28); s12 runs pairx's dense GEMM at
    168 registers (q4k21) and its grouped one with wblock (prefill26); s11 keeps session 11's launches; a layout
    without a row (packed Q8_0) session 10's."""
    pairx, gguf = q4_k_tiled.FAMILIES["pairx"], dispatch.FAMILIES[T.Q4_K]
    s12 = (prefill_gemm.IgemmTile(64, 32, 4, 1, 2, kblock=False, maxnreg=168),
           prefill_gemm.IgemmTile(64, 32, 4, 1, 2, words=True, maxnreg=168))
    s11_gguf = prefill_gemm.IgemmTile(64, 32, 4, 1, 2, kblock=False)
    want = {"s13": (*s12, prefill_gemm.IgemmTile(64, 32, 4, 1, 2, kblock=False, maxnreg=168)),
            "s12": (*s12, s11_gguf),
            "s11": (prefill_gemm.IgemmTile(64, 32, 4, 1, 2, kblock=False), prefill_gemm.IgemmTile(64, 32, 4, 1, 2),
                    s11_gguf)}
    for way, tiles in want.items():
        monkeypatch.setattr(prefill_gemm, "IGEMM_WAY", way)
        got = (prefill_gemm.igemm_tile(pairx, False), prefill_gemm.igemm_tile(pairx, True),
               prefill_gemm.igemm_tile(gguf, True))
        assert got == tiles, way


def test_q4_0_and_i_quant_integer_gemms_compile_for_sm_90():
    """Session 22's and 23's integer GEMMs offline for sm_90 (igemm_compile.py; the interpreter runs no PTX): Q4_0's,
    IQ4_XS's and the grid i-quants' dense and grouped launches compile; the i-quants' keep every register (no stack:
    their dense tiles were picked so, not timed, prefill_gemm.IGEMM_TILES); none reads x's per-32 sums (the
    i-quants' zero mins fold away; IQ1_S's delta is in its quants), as Q4_K's min term does."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # (and MXFP4: no min either, session 24; its resident tiled layout's grouped launch since session 42)
    i_quants = ("IQ4_XS", "MXFP4", "MXFP4_TILED", *(t.name for t in GRID_TYPES))
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "igemm_compile.py"), "Q4_0", *i_quants, "Q4_K"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    print(out.stdout)
    rows = {(name, kind): (int(stack), int(reads)) for name, kind, stack, reads in
            re.findall(r"^(\w+) (dense|grouped) regs=\d+ stack=(\d+) xs_reads=(\d+)$", out.stdout, re.M)}
    assert len(rows) == 2 * (len(i_quants) + 2), out.stdout
    for kind in ("dense", "grouped"):
        for name in i_quants:
            assert rows[name, kind] == (0, 0), (name, out.stdout)
        assert rows["Q4_0", kind][1] == 0 < rows["Q4_K", kind][1], out.stdout


def test_half_weights_load_as_128_bit_words_for_sm_90():
    """The F16 / BF16 GEMV and prompt GEMM offline for sm_90 (half_compile.py; the interpreter runs no PTX): every
    global load is 128 bits wide. Indexed in bytes (w_ptr + 2 k, before session 41) the weights were one 16-bit load a
    value: the GEMV at 0.63-0.81 of copy bandwidth, 0.95-1.04 as 128-bit loads (H100, half_gemv_sweep.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "half_compile.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^(F16|BF16) (gemv|gemm) (.+)$", out.stdout, re.M)
    assert len(rows) == 4, out.stdout
    for name, kind, ops in rows:
        assert all(op.split("=")[0].endswith(".128") for op in ops.split()), (name, kind, ops)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_gemm_runs_other_types_at_ieee_and_checks_qx(backend):
    """A family without an integer GEMM (Q5_K) runs "int8" as "ieee" (the same bits); a qx of the
    wrong shape is a clear error."""
    rows, cols = 40, 256
    raw = random_blocks(T.Q5_K, rows * cols // 256).to(backend)
    x = torch.randn(3, cols, device=backend)
    assert torch.equal(gemm(raw, T.Q5_K, (rows, cols), x, "int8"), gemm(raw, T.Q5_K, (rows, cols), x, "ieee"))
    raw8 = random_blocks(T.Q8_0, rows * cols // 32).to(backend)
    qx = act_quant.quantize(x[:2].contiguous(), act_quant.Q8_0)
    with pytest.raises(dispatch.KernelArgumentError, match="need 3 rows of 256 values in q8_0's blocks"):
        gemm(raw8, T.Q8_0, (rows, cols), x, "int8", qx=qx)


@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_gemm_runs_exact_tf32_products(backend, qtype):
    """F16 and BF16 at the default precision ("int8": they have no integer GEMM) run tl.dot at tf32 (session 36): their
    values, and x rounded to their type as the layers round it, are tf32 values, so every product is exact and the
    error float32's summation alone (BOUNDS["fp32"]; the interpreter computes float32 whatever the precision: the GPU
    variant is the check). Rows of 288 end inside a group."""
    assert prefill_gemm.float_precision("int8", dispatch.FAMILIES[qtype]) == "tf32"
    assert prefill_gemm.float_precision("int8", dispatch.FAMILIES[T.Q5_K]) == "ieee"
    rows, cols = (777, 2080) if backend == "cuda" else (37, 288)
    raw = random_blocks(qtype, rows * cols // 32)
    x = round_activations(torch.randn(19, cols), qtype.name.lower())
    W = reference(raw, qtype, (rows, cols))
    got = gemm(raw.to(backend), qtype, (rows, cols), x.to(backend), "int8")
    err = rel_err(got, x.double() @ W.T, x.double().abs() @ W.abs().T)
    assert err < BOUNDS["fp32"], f"{qtype.name} [{rows}, {cols}]: relative error {err:.2e}"


# Q4_K, Q4_0 and the i-quants on the GPU only (the interpreter runs Q4_K's loop GEMM in test_moe_tiled's prefill case,
# and Q4_0's and the i-quants' grouped GEMM in test_igemm_steps_give_session_10s_bits and (the grid i-quants)
# test_int8_grouped_gemm_matches_reference; IQ4_XS here took 82 s interpreted)
@pytest.mark.parametrize("backend, qtype", backend_cases([T.Q8_0], [T.Q8_0, T.Q4_K, T.Q4_0, T.MXFP4, T.IQ4_XS, *GRID_TYPES]))
def test_int8_moe_prefill(backend, qtype, monkeypatch):
    """Q8_0 / Q4_K / Q4_0 / the i-quants' experts at "int8": grouped and loop the same bits (per element the same block
    sums in the same order, whatever the tile; Q4_K's gate/up repacked to pairx too), and near the float GEMMs on
    the same rounded inputs (h rounded apart can sit across a rounding step: the engine's 1e-3 bound)."""
    # the interpreter (Q8_0 only): two row tiles of the 64-row integer GEMM launches in gate/up and in down
    dim, width, n, n_tok, top_k = (2048, 768, 8, 40, 4) if backend == "cuda" else (128, 128, 2, GEMM_BLOCK_T + 5, 2)
    table, *_ = arena_table(qtype, qtype, dim, width, n, backend)
    x = torch.randn(n_tok, dim)
    slots = torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)])
    w = torch.rand(n_tok, top_k)
    args = (slots.to(backend), w.to(backend), "silu")
    rnd = lambda h: round_activations(h, dispatch.FAMILIES[qtype].act_fmt)  # noqa: E731
    got = {}
    # the interpreter: tiles of 16 rows (more rows an expert than a tile holds) and the default height
    heights = GROUPED_BLOCK_TS if backend == "cuda" else (16, 32)
    for mode, t, tile in [("loop", table, 16)] + [("grouped", prepare(table, backend), h) for h in heights]:
        monkeypatch.setattr(prefill_moe, "PREFILL", mode)
        monkeypatch.setattr(prefill_moe, "PREFILL_TILE", str(tile))
        got[mode, tile] = moe_prefill(t, x.to(backend), *args, precision="int8", round_h=rnd)
    for h in heights:
        assert torch.equal(got["grouped", h], got["loop", 16]), h
    if backend == "cuda":  # session 10's integer GEMM loop and tiles: the same bits
        with monkeypatch.context() as mp:
            mp.setattr(prefill_gemm, "igemm_tile", lambda fam, grouped: prefill_gemm.S10_IGEMM)
            assert torch.equal(moe_prefill(prepare(table, backend), x.to(backend), *args, precision="int8",
                                           round_h=rnd), got["grouped", heights[-1]])
    got["grouped"] = got["grouped", heights[-1]]
    ieee = moe_prefill(prepare(table, backend), rnd(x).to(backend), *args, precision="ieee", round_h=rnd)
    if qtype == T.Q4_K:  # the gate/up repacked as the engine keeps resident experts (pairx, moe20): the same bits
        monkeypatch.setattr(prefill_moe, "PREFILL", "grouped")
        tiled = prepare(moe.tiled_gate_up(table), backend)
        assert torch.equal(moe_prefill(tiled, x.to(backend), *args, precision="int8", round_h=rnd), got["grouped"])
    err = rel_err(got["grouped"], ieee.cpu().double())
    print(f"int8 MoE prefill vs ieee on rounded inputs: {err:.2e}")
    assert err < 1e-3


def arena_table(gu_type: T, d_type: T, dim: int, width: int, n: int, device: str, pin: bool = False):
    """n experts scattered over the slots of one arena, each slot gate | up | down with odd
    padding between the parts (as bracketed O_DIRECT reads leave them), slots in shuffled order."""
    gu_bytes = width * dispatch.FAMILIES[gu_type].row_bytes(dim)
    d_bytes = dim * dispatch.FAMILIES[d_type].row_bytes(width)
    slot_bytes = -(-(2 * gu_bytes + d_bytes + 3 * 512) // 4096) * 4096
    rng = numpy_rng()
    arena = torch.from_numpy(rng.integers(0, 256, (n + 2) * slot_bytes, dtype=np.uint8))
    parts, offsets = [], ([], [], [])
    for e, slot in enumerate(rng.permutation(n + 2)[:n].tolist()):
        at = slot * slot_bytes
        for k, (qt, nbytes, shape) in enumerate(((gu_type, gu_bytes, (width, dim)), (gu_type, gu_bytes, (width, dim)),
                                                  (d_type, d_bytes, (dim, width)))):
            at += 4 * int(rng.integers(1, 128))  # Q4_K/Q5_K rows need 4-byte alignment
            blocks = random_blocks(qt, nbytes // dispatch.FAMILIES[qt].block_bytes)
            arena[at:at + nbytes] = blocks
            offsets[k].append(at)
            parts.append(reference(blocks, qt, shape))
            at += nbytes
    arena = arena.pin_memory() if pin else arena.to(device)
    table = ExpertTable(arena, arena, arena, *offsets, gu_type, d_type, dim, width)
    return table, parts[0::3], parts[1::3], parts[2::3]


def moe_reference(x, w, gates, ups, downs, act, gu_type=None, d_type=None, h=None, bias=None):
    """Integer families' inputs rounded as the kernels (and llama.cpp) round them. h [n, F]: the
    down's input as the engine has it (moe.down_input), instead of act(gate x, up x) rounded here
    from float64: an h computed apart can sit across a rounding boundary from the kernel's. bias: moe_decode's
    [n, 2F + D] (gate | up before the activation, down after)."""
    xr = act_in(gu_type, x)
    gb, ub, db = _bias_parts(bias, len(gates), gates[0].shape[0], downs[0].shape[0])
    if h is None:
        h = [act_in(d_type, act_fn(act)(gates[i] @ xr + gb[i], ups[i] @ xr + ub[i])) for i in range(len(gates))]
    return sum(w[i].double() * (downs[i] @ h[i].cpu().double() + db[i]) for i in range(len(gates)))


def act_fn(act):
    """The layers' torch function of a kernel activation: a name, or (name, a, b) as ffn.kernel_act gives it."""
    if isinstance(act, str):
        return ACTIVATIONS[act]
    name, a, b = act
    return swiglu_limited(a) if name == "swiglu_clamp" else situ(a, b)


def _bias_parts(bias, n: int, F: int, D: int) -> tuple[torch.Tensor, ...]:
    """(gate, up, down) biases float64 [n, F], [n, F], [n, D] of moe_decode's bias (zeros for None)."""
    b = torch.zeros(n, 2 * F + D, dtype=torch.float64) if bias is None else bias.cpu().double()
    return b[:, :F], b[:, F:2 * F], b[:, 2 * F:]


def moe_error(y, p, x, w, gates, ups, downs, act, gu_type, d_type, gate_up=None, kernels=None, bias=None) -> float:
    """moe_decode's y for (p, x, w) at gate_up against float64, with no rounding boundary between
    them: the larger of y against the down over the engine's own down input, and that input
    before rounding against float64 gate/up (kernels_bench.moe_err's check, for the tests' tables)."""
    xr = act_in(gu_type, x.cpu())
    gb, ub, _ = _bias_parts(bias, len(gates), gates[0].shape[0], downs[0].shape[0])
    h64 = torch.stack([act_fn(act)(gates[i] @ xr + gb[i], ups[i] @ xr + ub[i]) for i in range(len(gates))])
    on = None if bias is None else bias.to(x.device)
    h32 = down_input(p, x, act, gate_up, kernels, rounded=False, bias=on)
    want = moe_reference(x.cpu(), w.cpu(), gates, ups, downs, act, h=down_input(p, x, act, gate_up, kernels, bias=on),
                         bias=bias)
    return max(rel_err(y, want), rel_err(h32, h64))


# the interpreter runs programs one by one: few, wide tiles keep it fast
TILES = {"cuda": {}, "cpu": dict(gate_up=GemvConfig(block_n=64, num_warps=1, unroll=1),
                                 down=GemvConfig(block_n=64, num_warps=1, unroll=2))}
# (gate/up type, down type, activation): every family in some position, both activations. Not an IQ4_XS
# gate/up before a Q8_0-rounded down: random IQ4_XS blocks (scale up to 0.1 * 32 * 127 a weight) make h ~3e7
# at 2048x768, past Q8_0's f16 block scale (65504 * 127; inf, then NaN: H200, session 21)
MOE_TYPES = [(T.Q4_K, T.Q6_K, "silu"), (T.Q8_0, T.Q8_0, "swiglu_oai"), (T.Q5_K, T.Q3_K, "silu"),
             (T.Q2_K, T.Q4_K, "swiglu_oai"), (T.Q4_0, T.IQ4_XS, "silu"), (T.IQ1_S, T.IQ2_XXS, "silu"),
             (T.IQ2_XS, T.IQ3_XXS, "swiglu_oai"), (T.MXFP4, T.MXFP4, "swiglu_oai"), (T.IQ1_M, T.IQ1_M, "silu"),
             (T.Q5_0, T.IQ4_NL, "silu"), (T.Q5_1, T.Q5_0, "swiglu_oai"),  # session 35: llama-quantize's fallbacks
             (T.BF16, T.F16, "silu")]  # session 36: a BF16 or F16 file's experts


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("gu_type,d_type", [(T.MXFP4, T.MXFP4), (T.Q8_0, T.Q4_K)], ids=lambda v: v.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_adds_expert_biases(backend, gu_type, d_type):
    """gpt-oss's expert biases (session 24): gate and up biases before the clamped swiglu, the down's weighted after,
    against float64 over the engine's own down input; an integer and a float down (Q4_K's 4-byte rows: its own step).
    A wrong-shaped bias is refused before any launch."""
    # gpt-oss-20b's width for MXFP4 (rows of 90 blocks); Q4_K's rows are whole 256s
    dim, width, n = ((2880, 2880, 4) if gu_type == T.MXFP4 else (2048, 768, 4)) if backend == "cuda" else (256, 256, 3)
    table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, n, backend)
    x, w = torch.randn(dim), torch.rand(n)
    bias = torch.randn(n, 2 * width + dim)
    p = prepare(table, backend)
    y = moe_decode(p, x.to(backend), w.to(backend), "swiglu_oai", bias=bias.to(backend), **TILES[backend])
    err = moe_error(y, p, x.to(backend), w, gates, ups, downs, "swiglu_oai", gu_type, d_type,
                    TILES[backend].get("gate_up"), bias=bias)
    assert err < BOUNDS["fp32"], f"{gu_type.name}/{d_type.name}: relative error {err:.2e}"
    plain = moe_decode(p, x.to(backend), w.to(backend), "swiglu_oai", **TILES[backend])
    assert rel_err(plain, y.cpu().double()) > 1e-3  # the biases did something
    with pytest.raises(dispatch.KernelArgumentError, match=r"expert biases must be contiguous float32"):
        moe_decode(p, x.to(backend), w.to(backend), "swiglu_oai", bias=bias[:, 1:].to(backend))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("gu_type,d_type,act", MOE_TYPES, ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_matches_reference(backend, gu_type, d_type, act):
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    for _ in range(2 if backend == "cuda" else 1):
        table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, n, backend)
        x, w = torch.randn(dim), torch.rand(n)
        out = torch.full((dim,), float("nan"), device=backend)
        p = prepare(table, backend)
        moe_decode(p, x.to(backend), w.to(backend), act, out=out, **TILES[backend])
        # over the engine's own h: one computed apart can round to another int8 step (H200, Q2_K/Q4_K)
        err = moe_error(out, p, x.to(backend), w, gates, ups, downs, act, gu_type, d_type, TILES[backend].get("gate_up"))
        assert err < BOUNDS["fp32"], f"{gu_type.name}/{d_type.name} {act}: relative error {err:.2e}"


MODEL_ACTS = ["swiglu_clamp", "situ", "situ_plain_up"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("kind", MODEL_ACTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_kernels_fuse_the_models_activations(backend, kind, monkeypatch):
    """DeepSeek V4's clamped SwiGLU and Kimi K3's SiTU (its up branch capped, or not: linear beta 0) in the decode's
    gate/up launch and the prompt's grouped GEMMs, against float64 through the layers' own functions. The constants
    are set from the data (the median |gate| and |up|) so that both sides of each cap are met; a float gate/up
    (Q8_0) and an integer one with h quantized in the launch (Q4_K before a Q6_K down). Each differs from plain
    SwiGLU; an activation the kernels do not know is refused before any launch."""
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    for gu_type, d_type in ((T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0)):
        table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, n, backend)
        x, w = torch.randn(dim), torch.rand(n)
        xr = act_in(gu_type, x)
        g_med = float(torch.stack([g @ xr for g in gates]).abs().median())
        u_med = float(torch.stack([u @ xr for u in ups]).abs().median())
        act = {"swiglu_clamp": ("swiglu_clamp", g_med, 0.0), "situ": ("situ", g_med, u_med),
               "situ_plain_up": ("situ", g_med, 0.0)}[kind]
        assert kernel_act(act_fn(act)) == act  # the layer's function carries the constants the kernels take
        p = prepare(table, backend)
        y = moe_decode(p, x.to(backend), w.to(backend), act, **TILES[backend])
        err = moe_error(y, p, x.to(backend), w, gates, ups, downs, act, gu_type, d_type, TILES[backend].get("gate_up"))
        assert err < BOUNDS["fp32"], f"{gu_type.name}/{d_type.name} {act}: relative error {err:.2e}"
        assert rel_err(moe_decode(p, x.to(backend), w.to(backend), "silu", **TILES[backend]), y.cpu().double()) > 1e-3
    # the prompt's way: many tokens grouped by expert (the last table), both ways the same bits
    n_tok, top_k = (40, 4) if backend == "cuda" else (GEMM_BLOCK_T + 5, 2)
    xs, ws = torch.randn(n_tok, dim), torch.rand(n_tok, top_k)
    slots = torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)])
    got = {}
    for mode, t in (("grouped", prepare(table, backend)), ("loop", table)):
        monkeypatch.setattr(prefill_moe, "PREFILL", mode)
        got[mode] = moe_prefill(t, xs.to(backend), slots.to(backend), ws.to(backend), act, "ieee")
    assert torch.equal(got["grouped"], got["loop"])
    ref = torch.stack([moe_reference(xs[t], ws[t], [gates[i] for i in slots[t]], [ups[i] for i in slots[t]],
                                     [downs[i] for i in slots[t]], act) for t in range(n_tok)])
    assert rel_err(got["grouped"], ref) < BOUNDS["fp32"]
    for call in (lambda: moe_decode(p, x.to(backend), w.to(backend), ("gelu", 0.0, 0.0)),
                 lambda: moe_prefill(p, xs.to(backend), slots.to(backend), ws.to(backend), ("gelu", 0.0, 0.0))):
        with pytest.raises(dispatch.KernelArgumentError, match=r"activation \('gelu', 0.0, 0.0\) is not one of"):
            call()


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_prefill_groups_tokens_by_expert(backend, monkeypatch):
    """Both ways (prefill_moe.PREFILL), the same bits; the interpreter's case gives each expert more rows
    than a tile holds."""
    dim, width, n, n_tok, top_k = (2048, 768, 8, 40, 4) if backend == "cuda" else (256, 256, 2, GEMM_BLOCK_T + 5, 2)
    table, gates, ups, downs = arena_table(T.Q4_K, T.Q6_K, dim, width, n, backend)
    x = torch.randn(n_tok, dim)
    slots = torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)])
    w = torch.rand(n_tok, top_k)
    got = {}
    for mode, t in (("grouped", prepare(table, backend)), ("loop", table)):
        monkeypatch.setattr(prefill_moe, "PREFILL", mode)
        got[mode] = moe_prefill(t, x.to(backend), slots.to(backend), w.to(backend), precision="ieee")
    assert torch.equal(got["grouped"], got["loop"])
    y = got["grouped"]
    ref = torch.stack([moe_reference(x[t], w[t], [gates[i] for i in slots[t]], [ups[i] for i in slots[t]],
                                     [downs[i] for i in slots[t]], "silu") for t in range(n_tok)])
    err = rel_err(y, ref)
    assert err < BOUNDS["fp32"], f"relative error {err:.2e}"


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_prefill_adds_expert_biases(backend, monkeypatch):
    """gpt-oss's expert biases in the prompt's grouped GEMMs (session 24): both ways the same bits, against float64
    with the biases (MXFP4 experts, the clamped swiglu), unlike the result without them; a bad bias refused."""
    dim, width, n, n_tok, top_k = (2880, 2880, 8, 40, 4) if backend == "cuda" else (256, 256, 2, GEMM_BLOCK_T + 5, 2)
    table, gates, ups, downs = arena_table(T.MXFP4, T.MXFP4, dim, width, n, backend)
    x, w = torch.randn(n_tok, dim), torch.rand(n_tok, top_k)
    slots = torch.stack([torch.randperm(n)[:top_k] for _ in range(n_tok)])
    bias = torch.randn(n, 2 * width + dim)
    args = (x.to(backend), slots.to(backend), w.to(backend), "swiglu_oai", "ieee")
    got = {}
    for mode, t in (("grouped", prepare(table, backend)), ("loop", table)):
        monkeypatch.setattr(prefill_moe, "PREFILL", mode)
        got[mode] = moe_prefill(t, *args, bias=bias.to(backend))
    assert torch.equal(got["grouped"], got["loop"])
    ref = torch.stack([moe_reference(x[t], w[t], [gates[i] for i in slots[t]], [ups[i] for i in slots[t]],
                                     [downs[i] for i in slots[t]], "swiglu_oai", bias=bias[slots[t]])
                       for t in range(n_tok)])
    err = rel_err(got["grouped"], ref)
    assert err < BOUNDS["fp32"], f"relative error {err:.2e}"
    assert rel_err(moe_prefill(prepare(table, backend), *args), ref) > 1e-3  # the biases did something
    with pytest.raises(dispatch.KernelArgumentError, match="expert biases must be float32"):
        moe_prefill(prepare(table, backend), *args, bias=bias[:1].to(backend))


@pytest.mark.parametrize("block_t", [16, 64])
@pytest.mark.parametrize("counts", [[5, 0, 16, 33], [0, 0, 1], [16], [64, 65, 3]])
def test_expert_tiles_cover_each_experts_rows_once(counts, block_t):
    keys = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    tiles = expert_tiles(keys, len(counts), block_t)
    assert torch.equal(tiles, prefill_moe.expert_tiles_torch(keys, len(counts), block_t))  # PREFILL_GLUE's two ways
    outside = torch.cat([torch.tensor([-1]), keys, torch.tensor([len(counts)] * 2)])  # ids outside: no tile
    assert torch.equal(expert_tiles(outside, len(counts), block_t), prefill_moe.expert_tiles_torch(outside, len(counts), block_t))
    rows = keys.numel()
    assert tiles.dtype == torch.int32 and tiles.shape == (-(-rows // block_t) + min(len(counts), rows), 3)
    used = [t for t in tiles.tolist() if t[1] < t[2]]
    assert all(t == [0, 0, 0] for t in tiles.tolist()[len(used):])  # the empty ones at the end
    assert [r for _, a, b in used for r in range(a, b)] == list(range(rows))
    assert all(b - a <= block_t and set(keys[a:b].tolist()) == {e} for e, a, b in used)
    assert [sum(b - a for e2, a, b in used if e2 == e) for e in range(len(counts))] == counts


@pytest.mark.parametrize("case", ["tiles_dtype", "tiles_shape", "src_device", "precision", "x_cols", "block_t"])
def test_grouped_gemm_rejects_bad_arguments(case):
    dev = _dev()
    raw = random_blocks(T.Q8_0, 8 * 8).to(dev)
    off, x = torch.zeros(1, dtype=torch.int64, device=dev), torch.randn(3, 256, device=dev)
    src, tiles = torch.arange(3, device=dev), torch.tensor([[0, 0, 3]], dtype=torch.int32, device=dev)
    args = {"tiles_dtype": dict(tiles=tiles.long()), "tiles_shape": dict(tiles=tiles[:, :2].contiguous()),
            "src_device": dict(src=src.cpu() if dev != "cpu" else src.float()), "precision": dict(precision="bf16"),
            "x_cols": dict(x=x[:, :128].contiguous()), "block_t": dict(block_t=48)}[case]
    call = dict(x=x, src=src, tiles=tiles, precision="ieee", block_t=16) | args
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q8_0 grouped GEMM"):
        grouped_gemm(raw, off, T.Q8_0, (8, 256), call["x"], call["src"], call["tiles"], call["precision"],
                     block_t=call["block_t"])


def test_moe_prefill_rejects_slots_outside_the_table_and_selections():
    dev = _dev()
    table, *_ = arena_table(T.Q8_0, T.Q8_0, 256, 256, 2, dev)
    slots = torch.tensor([[0, 2]], device=dev)
    with pytest.raises(dispatch.KernelArgumentError, match=r"slots must lie in \[0, 2\)"):
        moe_prefill(table, torch.randn(1, 256, device=dev), slots, torch.rand(1, 2, device=dev))
    # unchecked (a router's top-k): an outside slot gets no tile, the other tokens' rows keep their bits
    p, x, w = prepare(table, dev), torch.randn(2, 256, device=dev), torch.rand(2, 1, device=dev)
    ok = moe_prefill(p, x, torch.tensor([[0], [1]], device=dev), w, precision="int8", check_slots=False)
    with warnings.catch_warnings():
        # the outside slot's gate/up rows are never written (torch.empty's leftover bytes: inf, NaN or huge
        # at times); the down quantizes its h row anyway (a CI run: inf * 1/inf, numpy's "invalid value
        # encountered in multiply" under the interpreter). Not the data: random_blocks' scales are finite
        # and the arena's padding is not read; the test reads token 0's row only
        warnings.simplefilter("ignore", RuntimeWarning)
        bad = moe_prefill(p, x, torch.tensor([[0], [2]], device=dev), w, precision="int8", check_slots=False)
    assert torch.equal(bad[0], ok[0])
    selection = prepare(table, dev).select(torch.tensor([1], device=dev))
    with pytest.raises(dispatch.KernelArgumentError, match="the whole table, not a selection"):
        moe_prefill(selection, torch.randn(1, 256, device=dev), slots[:, :1], torch.rand(1, 1, device=dev))


@pytest.mark.gpu
def test_zero_copy_from_pinned_host_arena():
    """--unified on: the kernel reads expert blocks from pinned host memory, no copy to VRAM."""
    table, gates, ups, downs = arena_table(T.Q4_K, T.Q6_K, 2048, 768, 8, "cuda", pin=True)
    assert table.gate.device.type == "cpu" and table.gate.is_pinned()
    x, w = torch.randn(2048), torch.rand(8)
    y = moe_decode(table, x.cuda(), w.cuda())
    assert rel_err(y, moe_reference(x, w, gates, ups, downs, "silu", T.Q4_K, T.Q6_K)) < BOUNDS["fp32"]


# --- bad inputs: a clear error, and the output left as it was ------------------------------------
def _dev() -> str:
    return "cuda" if ON_GPU else "cpu"


def test_type_without_a_kernel_is_a_clear_error():
    raw = torch.zeros(20, dtype=torch.uint8)  # one Q4_1 block (no kernel: no fallback writes it)
    with pytest.raises(UnsupportedTypeError, match="could not multiply Q4_1 blocks on the GPU.*IQ1_S"):
        gemv(raw, T.Q4_1, (1, 32), torch.randn(32))
    assert dispatch.REMAINING == () and {T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ1_M, T.IQ2_S, T.IQ3_S,
                                         T.MXFP4, T.Q5_0, T.Q5_1, T.IQ4_NL, T.F16, T.BF16} <= set(dispatch.FAMILIES)


@pytest.mark.parametrize("case", ["cols", "dtype", "bytes", "x_dtype", "out_shape", "odd_address"])
def test_gemv_rejects_bad_arguments(case):
    dev = _dev()
    raw = random_blocks(T.Q4_K, 4).to(dev)
    rows, cols, x = 4, 256, torch.randn(256, device=dev)
    out = torch.full((rows,), float("nan"), device=dev)
    args = {"cols": (raw, (2, 512 - 256 // 2), x, out), "dtype": (raw.view(torch.int8), (rows, cols), x, out),
            "bytes": (raw[:-144], (rows, cols), x, out), "x_dtype": (raw, (rows, cols), x.double(), out),
            "out_shape": (raw, (rows, cols), x, out[:3]),
            "odd_address": (torch.empty(raw.numel() + 1, dtype=torch.uint8, device=dev)[1:], (rows, cols), x, out)}[case]
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q4_K GEMV"):
        gemv(args[0], T.Q4_K, args[1], args[2], out=args[3])
    assert torch.isnan(out).all()


def test_moe_decode_rejects_offsets_outside_the_arena():
    dev = _dev()
    table, *_ = arena_table(T.Q4_K, T.Q6_K, 256, 256, 2, dev)
    bad = ExpertTable(table.gate, table.up, table.down, [table.gate_offsets[0], table.gate.numel() - 100],
                      table.up_offsets, table.down_offsets, T.Q4_K, T.Q6_K, 256, 256)
    out = torch.full((256,), float("nan"), device=dev)
    with pytest.raises(dispatch.KernelArgumentError, match="leave 36864 bytes inside"):
        moe_decode(bad, torch.randn(256, device=dev), torch.rand(2, device=dev), out=out)
    with pytest.raises(dispatch.KernelArgumentError, match="activation 'gelu'"):
        moe_decode(table, torch.randn(256, device=dev), torch.rand(2, device=dev), "gelu", out=out)
    assert torch.isnan(out).all()


@pytest.mark.gpu
def test_unpinned_host_weight_is_refused():
    raw = random_blocks(T.Q8_0, 2)
    with pytest.raises(dispatch.KernelArgumentError, match="move it or pin it"):
        gemv(raw, T.Q8_0, (2, 32), torch.randn(32, device="cuda"))
