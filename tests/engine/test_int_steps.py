"""The integer steps added after Q8_0's and Q4_K's (Family.idot of Q6_K, IQ4_XS and Q4_0; IQ2_XXS, IQ3_XXS, IQ2_XS
and IQ1_S, the grid i-quants; x quantized on the device, dp4a, one float step a block): the GEMV against the float64 reference and against the
float path each replaced (its FLOAT_FAMILY, the same rounded x), the MoE decode on experts of the type,
the switch back, and on the GPU the PTX against the interpreter's twins bit for bit. Each type's exact
integer sums (and IQ4_XS's table lookup) are in test_<type>_int.py (the grid i-quants': test_iq_grid_int.py).

Interpreter (TRITON_INTERPRET=1, dp4a and prmt by their arithmetic twins) where there is no GPU.
Shapes: odd row counts (not a multiple of any tile), rows ending inside their last group (Q4_0's
800), rows of an odd block count (every other row off 4-byte alignment: Q6_K's 210-byte and Q4_0's
18-byte blocks, whose words are built from 16-bit loads), a single block.
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import (BACKENDS, BOUNDS, TILES, act_in, arena_table, moe_error, random_blocks,  # noqa: E402
                          reference, rel_err)

from sparkd.engine.kernels import (act_quant, dispatch, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_xs,  # noqa: E402
                                   mxfp4, prefill_gemm, q4_0, q6_k)
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.kernels.moe import moe_decode, prepare  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

# one float per super-block and row, groups in order: the arithmetic integer_result recomputes (test_<type>_int.py)
ROWS_TILE = GemvConfig(block_n=4, num_warps=1, unroll=2, split=1, elementwise=False)
# the default tile, tiles overrunning the row's groups (unroll 3 over 3 groups split in 2), wide
CONFIGS = [None, GemvConfig(block_n=2, num_warps=1, unroll=3, split=2, elementwise=True),
           GemvConfig(block_n=16, num_warps=2, unroll=1, elementwise=True), ROWS_TILE]
# (type, its kernel module, the x format llama.cpp multiplies it with, GEMV shapes on the GPU / the interpreter)
STEPS = {T.Q6_K: (q6_k, act_quant.Q8_K, [(4099, 2048), (777, 768), (1, 768)], [(5, 768), (1, 512)]),
         T.IQ4_XS: (iq4_xs, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.Q4_0: (q4_0, act_quant.Q8_0, [(4099, 4096), (777, 800), (1, 32)], [(5, 800), (1, 32)]),
         T.MXFP4: (mxfp4, act_quant.Q8_0, [(4099, 2880), (777, 800), (1, 32)], [(5, 800), (1, 32)]),
         T.IQ2_XXS: (iq2_xxs, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ3_XXS: (iq3_xxs, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ2_XS: (iq2_xs, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ1_S: (iq1_s, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ1_M: (iq1_m, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ2_S: (iq2_s, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)]),
         T.IQ3_S: (iq3_s, act_quant.Q8_K, [(4099, 4096), (777, 768), (1, 256)], [(5, 768), (1, 256)])}
TYPES = [pytest.param(t, id=t.name) for t in STEPS]
# the grid i-quants (iq50, session 22; their steps on by default since session 23)
GRID = (T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ1_S, T.IQ1_M, T.IQ2_S, T.IQ3_S)


def awkward_x(cols: int, block: int = 256) -> torch.Tensor:
    """x with a zero block (scale 0: that block contributes nothing) and magnitudes mixed by block."""
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // block).uniform_(-3, 2).repeat_interleave(block)
    x[block:2 * block] = 0.0
    return x


def integer_result(q: np.ndarray, sc: np.ndarray, d: np.ndarray, x: torch.Tensor, backend: str,
                   c: float = 1.0) -> tuple[torch.Tensor, ...]:
    """What ROWS_TILE computes for a Q8_K x, from a type's unpacked values (test_<type>_int.py's unpack: q the
    integer values [rows, cols], sc the integer scale of each sub-block [rows, cols / sub-block], d the float32
    scale of each super-block [rows, cols / 256]): (the result recomputed in float32, the float64 of the exact
    sums, the sum of their terms' magnitudes). Per super-block the exact sum_s sc_s * sum_i q_i * xq_i, then
    acc += float32(isum) * (d * (d_x * c)) in order (c: the type's power of two, llama.cpp's constant on the
    product, exact)."""
    rows, cols = q.shape
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_K)  # the kernel's own x (act_quant tests: exact)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0]
    dx = qx.scales.cpu().numpy()[0]
    isum = ((q * xq).reshape(rows, sc.shape[1], -1).sum(-1) * sc).reshape(rows, cols // 256, -1).sum(-1)  # exact
    assert np.abs(isum).max() < 2 ** 31
    acc = torch.zeros(rows, dtype=torch.float32)
    for g in range(cols // 256):
        acc += torch.from_numpy(isum[:, g].astype(np.float32)) * torch.from_numpy(d[:, g] * (dx[g] * np.float32(c)))
    terms = torch.from_numpy(isum).double() * torch.from_numpy(d).double() * torch.from_numpy(dx).double() * c
    return acc, terms.sum(1), terms.abs().sum(1)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=["default", "split-overrun", "wide", "rows"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_gemv_matches_reference_and_float_path(backend, config, qtype, monkeypatch):
    """Against the float64 reference (x rounded as llama.cpp does) and against the float path it
    replaced ($SPARKD_<type>_INT=0's family, the same rounded x)."""
    module, fmt, gpu_shapes, cpu_shapes = STEPS[qtype]
    qk = GGML_QUANT_SIZES[qtype][0]
    for rows, cols in gpu_shapes if backend == "cuda" else cpu_shapes:
        raw, x = random_blocks(qtype, rows * cols // qk).to(backend), torch.randn(cols)
        out = torch.full((rows,), float("nan"), device=backend)
        gemv(raw, qtype, (rows, cols), x.to(backend), out=out, config=config)
        W, xr = reference(raw, qtype, (rows, cols)), act_in(qtype, x)
        scale = W.abs() @ xr.abs()
        err = rel_err(out, W @ xr, scale)
        assert err < BOUNDS["fp32"], f"[{rows}, {cols}]: relative error {err:.2e}"
        with monkeypatch.context() as m:
            m.setitem(dispatch.FAMILIES, qtype, module.FLOAT_FAMILY)
            flt = gemv(raw, qtype, (rows, cols), x.to(backend), config=config,
                       round_x=lambda v: round_activations(v, fmt))
        assert rel_err(out, flt.cpu().double(), scale) < BOUNDS["fp32"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("qtype", [pytest.param(t, id=t.name) for t in (T.IQ4_XS, T.Q4_0, *GRID)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_on_experts_of_the_type(backend, qtype):
    """Gate/up and down both of the type (h quantized for the down's integer step), against float64: the
    MoE kernels take the family's step as they take Q4_K's (Q6_K's: test_kernels' MoE type pairs)."""
    module = STEPS[qtype][0]
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    table, gates, ups, downs = arena_table(qtype, qtype, dim, width, n, backend)
    x, w = torch.randn(dim), torch.rand(n)
    out = torch.full((dim,), float("nan"), device=backend)
    p = prepare(table, backend)
    assert p.gate_up.idot is module.idot and p.down.idot is module.idot
    moe_decode(p, x.to(backend), w.to(backend), "silu", out=out, **TILES[backend])
    err = moe_error(out, p, x.to(backend), w, gates, ups, downs, "silu", qtype, qtype, TILES[backend].get("gate_up"))
    assert err < BOUNDS["fp32"], f"relative error {err:.2e}"


@pytest.mark.parametrize("qtype", TYPES)
def test_switch_back_to_the_float_path(qtype):
    """$SPARKD_<type>_INT=0 at import (tests/engine/test_switches.py) makes FLOAT_FAMILY dispatch's family: no
    integer step (the caller rounds x, floats multiply) and no integer prefill GEMM (the float GEMM at "ieee"; IQ4_XS's
    and Q4_0's since session 22, the grid i-quants' since session 23). The default: on."""
    module, fmt, *_ = STEPS[qtype]
    assert module.FAMILY is module.INT_FAMILY
    assert module.INT_FAMILY.act_fmt == fmt and module.FLOAT_FAMILY.idot is None
    assert prefill_gemm.int_gemm(module.INT_FAMILY, "int8")
    assert not prefill_gemm.int_gemm(module.FLOAT_FAMILY, "int8")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", TYPES)
def test_the_ptx_matches_its_emulation(qtype):
    """The PTX dp4a (and IQ4_XS's prmt) and the interpreter's twins give the same bits (no split-K)."""
    qk = GGML_QUANT_SIZES[qtype][0]
    rows, cols = 1031, 4096 + STEPS[qtype][2][1][1]  # a row ending as the second GPU shape's does
    raw = random_blocks(qtype, rows * cols // qk).cuda()
    x = torch.randn(cols, device="cuda")
    for cfg in (GemvConfig(split=1), ROWS_TILE):
        got = [gemv(raw, qtype, (rows, cols), x, config=GemvConfig(**{**cfg.__dict__, "dp4a": asm}))
               for asm in (True, False)]
        assert torch.equal(*got)
