"""Q6_K's integer step (kernels/q6_k.py idot): the per-block integer sums exactly llama.cpp's
(checked against an unpacking of the blocks written here, value by value), the result against
the float64 reference and the float path it replaces, and the switch back (SPARKD_Q6_K_INT=0).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
Rows of 768 values hold an odd number of 210-byte blocks, so every other row starts 2 bytes past a
4-byte boundary: the 16-bit loads the kernel builds words from are checked on both alignments.
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

from sparkd.engine.kernels import act_quant, dispatch, q6_k  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

# one float per super-block and row, groups in order: the arithmetic the check below repeats
ROWS_TILE = GemvConfig(block_n=4, num_warps=1, unroll=2, split=1, elementwise=False)
# the default tile, tiles overrunning the row's groups (unroll 3 over 3 groups split in 2), wide
CONFIGS = [None, GemvConfig(block_n=2, num_warps=1, unroll=3, split=2, elementwise=True),
           GemvConfig(block_n=16, num_warps=2, unroll=1, elementwise=True), ROWS_TILE]


def unpack(raw: torch.Tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q - 32 int64 [rows, cols], scales int64 [rows, cols/16], d float32 [rows, cols/256]) from
    the bytes, by the format's definition (gguf's quants layout, value by value)."""
    b = raw.cpu().numpy().reshape(rows, cols // 256, 210)
    v = np.arange(256)
    half, low = v // 128, v % 128
    ql = b[:, :, 64 * half + low % 64].astype(np.int64)
    qh = b[:, :, 128 + 32 * half + low % 32].astype(np.int64)
    q = ((ql >> (4 * (low // 64))) & 0xF) | (((qh >> (2 * (low // 32))) & 3) << 4)
    scales = b[:, :, 192:208].view(np.int8).astype(np.int64)
    d = b[:, :, 208:210].copy().view(np.float16).astype(np.float32)[..., 0]
    return (q - 32).reshape(rows, cols), scales.reshape(rows, -1), d


def integer_result(raw: torch.Tensor, rows: int, cols: int, x: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """(ROWS_TILE's result recomputed in float32, float64 of the exact sums, the sum of their
    terms' magnitudes): per super-block the exact sum_s sc_s * sum_i (q_i - 32) * xq_i, then
    acc += float32(isum) * (d * d_x) in order."""
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_K)  # the kernel's own x (act_quant tests: exact)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0]
    dx = qx.scales.cpu().numpy()[0]
    q, sc, d = unpack(raw, rows, cols)
    isum = ((q * xq).reshape(rows, -1, 16).sum(-1) * sc).reshape(rows, cols // 256, 16).sum(-1)  # exact
    assert np.abs(isum).max() < 2 ** 31
    acc = torch.zeros(rows, dtype=torch.float32)
    for g in range(cols // 256):
        acc += torch.from_numpy(isum[:, g].astype(np.float32)) * torch.from_numpy(d[:, g] * dx[g])
    terms = torch.from_numpy(isum).double() * torch.from_numpy(d).double() * torch.from_numpy(dx).double()
    return acc, terms.sum(1), terms.abs().sum(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """The kernel's per-block integer sums are exact: under the interpreter (no FMA contraction) the
    same bits as the float32 steps on the exact sums; compiled, within float32 rounding of them."""
    rows, cols = (1031, 2048 + 768) if backend == "cuda" else (7, 768)
    raw = random_blocks(T.Q6_K, rows * cols // 256)
    x = act_quant_awkward(cols)
    y = gemv(raw.to(backend), T.Q6_K, (rows, cols), x.to(backend), config=ROWS_TILE).cpu()
    acc, exact, size = integer_result(raw, rows, cols, x, backend)
    if backend == "cpu":
        assert torch.equal(y, acc)
    # float32 steps on exact integer sums: <= 3 roundings per super-block (11 here) plus the adds
    err = ((y.double() - exact).abs() / size).max().item()
    assert err < 2e-6, err


def act_quant_awkward(cols: int) -> torch.Tensor:
    """x with a zero block (scale 0: that block contributes nothing) and mixed magnitudes."""
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // 256).uniform_(-3, 2).repeat_interleave(256)
    x[256:512] = 0.0
    return x


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "split-overrun", "wide", "rows"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_gemv_matches_reference_and_float_path(backend, config, monkeypatch):
    """Against the float64 reference (x rounded to Q8_K as llama.cpp does) and against the float
    path it replaced (SPARKD_Q6_K_INT=0's family, same rounded x), odd row counts (not a multiple
    of any tile) and both row alignments."""
    shapes = [(4099, 2048), (777, 768), (1, 768)] if backend == "cuda" else [(5, 768), (1, 512)]
    for rows, cols in shapes:
        raw, x = random_blocks(T.Q6_K, rows * cols // 256).to(backend), torch.randn(cols)
        out = torch.full((rows,), float("nan"), device=backend)
        gemv(raw, T.Q6_K, (rows, cols), x.to(backend), out=out, config=config)
        W, xr = reference(raw, T.Q6_K, (rows, cols)), act_in(T.Q6_K, x)
        scale = W.abs() @ xr.abs()
        err = rel_err(out, W @ xr, scale)
        assert err < BOUNDS["fp32"], f"[{rows}, {cols}]: relative error {err:.2e}"
        with monkeypatch.context() as m:
            m.setitem(dispatch.FAMILIES, T.Q6_K, q6_k.FLOAT_FAMILY)
            flt = gemv(raw, T.Q6_K, (rows, cols), x.to(backend), config=config,
                       round_x=lambda v: round_activations(v, act_quant.Q8_K))
        assert rel_err(out, flt.cpu().double(), scale) < BOUNDS["fp32"]


def test_switch_back_to_the_float_path():
    """SPARKD_Q6_K_INT=0 at import (tests/engine/test_switches.py) makes FLOAT_FAMILY dispatch's Q6_K family:
    no integer step (the caller rounds x, floats multiply)."""
    assert dispatch.family(T.Q6_K) is q6_k.FAMILY is q6_k.INT_FAMILY  # this process: the default
    assert q6_k.INT_FAMILY.act_fmt == act_quant.Q8_K and q6_k.FLOAT_FAMILY.idot is None


@pytest.mark.gpu
def test_dp4a_matches_its_emulation():
    """The PTX dp4a and the interpreter's emulation give the same bits (no split-K)."""
    rows, cols = 1031, 4096 + 768
    raw = random_blocks(T.Q6_K, rows * cols // 256).cuda()
    x = torch.randn(cols, device="cuda")
    for cfg in (GemvConfig(split=1), ROWS_TILE):
        got = [gemv(raw, T.Q6_K, (rows, cols), x, config=GemvConfig(**{**cfg.__dict__, "dp4a": asm}))
               for asm in (True, False)]
        assert torch.equal(*got)
