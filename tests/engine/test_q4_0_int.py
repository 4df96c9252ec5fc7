"""Q4_0's integer step (kernels/q4_0.py idot): the per-block integer sums llama.cpp's (against an
unpacking of the blocks written here, value by value), the GEMV and the MoE decode against the
float64 reference and the float path it replaces, and the switch back (SPARKD_Q4_0_INT=0).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
Rows of 800 values end 1 block into their last group (the masked blocks), and odd block counts put
every other row 2 bytes off 4-byte alignment (the 16-bit loads the words are built from).
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

from test_kernels import (BACKENDS, BOUNDS, TILES, act_in, arena_table, moe_error, random_blocks,  # noqa: E402
                          reference, rel_err)

from sparkd.engine.kernels import act_quant, dispatch, q4_0  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.kernels.moe import moe_decode, prepare  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

ROWS_TILE = GemvConfig(block_n=4, num_warps=1, unroll=2, split=1, elementwise=False)
CONFIGS = [None, GemvConfig(block_n=2, num_warps=1, unroll=3, split=2, elementwise=True),
           GemvConfig(block_n=16, num_warps=2, unroll=1, elementwise=True), ROWS_TILE]


def exact_sums(raw: torch.Tensor, rows: int, cols: int, x: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """(float64 of the exact per-block sums d * d_x * sum (q - 8) * xq, the sum of their magnitudes)
    per row, from the bytes by the format's definition and the kernel's own x (act_quant: exact)."""
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_0)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0].reshape(-1, 32)
    dx = qx.scales.cpu().numpy()[0].astype(np.float64)
    b = raw.cpu().numpy().reshape(rows, cols // 32, 18)
    i = np.arange(32)
    q = ((b[:, :, 2 + i % 16].astype(np.int64) >> (4 * (i // 16))) & 0xF) - 8
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float64)[..., 0]
    terms = (q * xq).sum(-1) * d * dx  # [rows, blocks]: exact integer sums times the two scales
    return torch.from_numpy(terms.sum(1)), torch.from_numpy(np.abs(terms).sum(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """Per block the exact integer sum, one float step each: within float32 rounding of the exact
    result (the float path's error is against the float values, not these sums)."""
    rows, cols = (1031, 4096 + 800) if backend == "cuda" else (7, 800)
    raw = random_blocks(T.Q4_0, rows * cols // 32)
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // 32).uniform_(-3, 2).repeat_interleave(32)
    x[64:96] = 0.0  # a zero block: scale 0
    for cfg in (ROWS_TILE, None):
        y = gemv(raw.to(backend), T.Q4_0, (rows, cols), x.to(backend), config=cfg).cpu()
        exact, size = exact_sums(raw, rows, cols, x, backend)
        err = ((y.double() - exact).abs() / size).max().item()
        assert err < 2e-6, err


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "split-overrun", "wide", "rows"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_gemv_matches_reference_and_float_path(backend, config, monkeypatch):
    """Against the float64 reference (x rounded to Q8_0 as llama.cpp does) and against the float
    path it replaced (SPARKD_Q4_0_INT=0's family, same rounded x), odd row counts, a row ending
    inside its last group, a single block."""
    shapes = [(4099, 4096), (777, 800), (1, 32)] if backend == "cuda" else [(5, 800), (1, 32)]
    for rows, cols in shapes:
        raw, x = random_blocks(T.Q4_0, rows * cols // 32).to(backend), torch.randn(cols)
        out = torch.full((rows,), float("nan"), device=backend)
        gemv(raw, T.Q4_0, (rows, cols), x.to(backend), out=out, config=config)
        W, xr = reference(raw, T.Q4_0, (rows, cols)), act_in(T.Q4_0, x)
        scale = W.abs() @ xr.abs()
        err = rel_err(out, W @ xr, scale)
        assert err < BOUNDS["fp32"], f"[{rows}, {cols}]: relative error {err:.2e}"
        with monkeypatch.context() as m:
            m.setitem(dispatch.FAMILIES, T.Q4_0, q4_0.FLOAT_FAMILY)
            flt = gemv(raw, T.Q4_0, (rows, cols), x.to(backend), config=config,
                       round_x=lambda v: round_activations(v, act_quant.Q8_0))
        assert rel_err(out, flt.cpu().double(), scale) < BOUNDS["fp32"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_on_q4_0_experts(backend):
    """Gate/up and down both Q4_0 (h quantized to Q8_0 for the down's integer step), against float64."""
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    table, gates, ups, downs = arena_table(T.Q4_0, T.Q4_0, dim, width, n, backend)
    x, w = torch.randn(dim), torch.rand(n)
    out = torch.full((dim,), float("nan"), device=backend)
    p = prepare(table, backend)
    assert p.gate_up.idot is q4_0.idot and p.down.idot is q4_0.idot
    moe_decode(p, x.to(backend), w.to(backend), "silu", out=out, **TILES[backend])
    err = moe_error(out, p, x.to(backend), w, gates, ups, downs, "silu", T.Q4_0, T.Q4_0, TILES[backend].get("gate_up"))
    assert err < BOUNDS["fp32"], f"relative error {err:.2e}"


def test_switch_back_to_the_float_path():
    """SPARKD_Q4_0_INT=0 at import (tests/engine/test_switches.py) makes FLOAT_FAMILY dispatch's Q4_0 family."""
    assert dispatch.family(T.Q4_0) is q4_0.FAMILY is q4_0.INT_FAMILY  # this process: the default
    assert q4_0.INT_FAMILY.act_fmt == act_quant.Q8_0 and q4_0.FLOAT_FAMILY.idot is None


@pytest.mark.gpu
def test_dp4a_matches_its_emulation():
    """The PTX dp4a and the interpreter's emulation give the same bits (no split-K)."""
    rows, cols = 1031, 4096 + 800
    raw = random_blocks(T.Q4_0, rows * cols // 32).cuda()
    x = torch.randn(cols, device="cuda")
    for cfg in (GemvConfig(split=1), ROWS_TILE):
        got = [gemv(raw, T.Q4_0, (rows, cols), x, config=GemvConfig(**{**cfg.__dict__, "dp4a": asm}))
               for asm in (True, False)]
        assert torch.equal(*got)
