"""IQ4_XS's integer step (kernels/iq4_xs.py idot): the byte-permute table lookup against the table
for every index, the per-block integer sums exactly llama.cpp's (checked against an unpacking of
the blocks written here, value by value), the GEMV and the MoE decode against the float64
reference and the float path it replaces, and the switch back (SPARKD_IQ4_XS_INT=0).

Interpreter (TRITON_INTERPRET=1: prmt and dp4a by their arithmetic twins) where there is no GPU;
marker gpu for the PTX, checked there against the twins bit for bit.
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")
import triton.language as tl  # noqa: E402

from test_kernels import (BACKENDS, BOUNDS, TILES, act_in, arena_table, moe_error, numpy_rng,  # noqa: E402
                          random_blocks, reference, rel_err)

from sparkd.engine.kernels import act_quant, dispatch, iq4_xs  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.kernels.moe import moe_decode, prepare  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

# one float per super-block and row, groups in order: the arithmetic the check below repeats
ROWS_TILE = GemvConfig(block_n=4, num_warps=1, unroll=2, split=1, elementwise=False)
# the default tile, tiles overrunning the row's groups (unroll 3 over 3 groups split in 2), wide
CONFIGS = [None, GemvConfig(block_n=2, num_warps=1, unroll=3, split=2, elementwise=True),
           GemvConfig(block_n=16, num_warps=2, unroll=1, elementwise=True), ROWS_TILE]
KVALUES = np.array(gq.IQ4_NL.kvalues, dtype=np.int64)


@triton.jit
def _lookup_kernel(q_ptr, lo_ptr, hi_ptr, n, EMU: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo, hi = iq4_xs.lookup(tl.load(q_ptr + i, mask=i < n, other=0), EMU)
    tl.store(lo_ptr + i, lo, mask=i < n)
    tl.store(hi_ptr + i, hi, mask=i < n)


def lookup(q: torch.Tensor, emulate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = torch.empty_like(q), torch.empty_like(q)
    _lookup_kernel[(triton.cdiv(q.numel(), 256),)](q, lo, hi, q.numel(), EMU=emulate, BLOCK=256)
    return lo.cpu(), hi.cpu()


def table_of(words: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The table values of the low and the high nibbles of each byte of words (int8 [n, 4] each)."""
    b = words.cpu().numpy().view(np.uint8).reshape(-1, 4).astype(np.int64)
    return KVALUES[b & 0xF], KVALUES[b >> 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_lookup_gives_the_table_for_every_index(backend):
    """Every byte value in every byte position (each index as a low and as a high nibble, either
    half of the table, next to every other byte), and random words; compiled, prmt against its twin."""
    b = np.arange(256, dtype=np.uint8)
    words = np.stack([np.roll(b, k) for k in range(4)], 1).copy().view(np.int32)[:, 0]  # byte k = (i - k) % 256
    words = np.concatenate([words, numpy_rng().integers(-2 ** 31, 2 ** 31, 4096).astype(np.int32)])
    q = torch.from_numpy(words).to(backend)
    got = lookup(q, emulate=backend == "cpu")
    want = table_of(q)
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy().view(np.int8).reshape(-1, 4).astype(np.int64), w)
    if backend == "cuda":
        assert all(torch.equal(a, b) for a, b in zip(got, lookup(q, emulate=True)))


def unpack(raw: torch.Tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table values int64 [rows, cols], scales - 32 int64 [rows, cols/32], d float32 [rows, cols/256])
    from the bytes, by the format's definition (gguf's quants layout, value by value)."""
    b = raw.cpu().numpy().reshape(rows, cols // 256, 136)
    v = np.arange(256)
    s, i = v // 32, v % 32
    q = (b[:, :, 8 + 16 * s + i % 16].astype(np.int64) >> (4 * (i // 16))) & 0xF
    sh = b[:, :, 2:4].copy().view("<u2").astype(np.int64)  # [rows, groups, 1]
    s8 = np.arange(8)
    sc = ((b[:, :, 4 + s8 // 2].astype(np.int64) >> (4 * (s8 % 2))) & 0xF) | (((sh >> (2 * s8)) & 3) << 4)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float32)[..., 0]
    return KVALUES[q].reshape(rows, cols), (sc - 32).reshape(rows, -1), d


def integer_result(raw: torch.Tensor, rows: int, cols: int, x: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """(ROWS_TILE's result recomputed in float32, float64 of the exact sums, the sum of their
    terms' magnitudes): per super-block the exact sum_s (sc_s - 32) * sum_i kv_i * xq_i, then
    acc += float32(isum) * (d * d_x) in order."""
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_K)  # the kernel's own x (act_quant tests: exact)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0]
    dx = qx.scales.cpu().numpy()[0]
    kv, sc, d = unpack(raw, rows, cols)
    isum = ((kv * xq).reshape(rows, -1, 32).sum(-1) * sc).reshape(rows, cols // 256, 8).sum(-1)  # exact
    assert np.abs(isum).max() < 2 ** 31
    acc = torch.zeros(rows, dtype=torch.float32)
    for g in range(cols // 256):
        acc += torch.from_numpy(isum[:, g].astype(np.float32)) * torch.from_numpy(d[:, g] * dx[g])
    terms = torch.from_numpy(isum).double() * torch.from_numpy(d).double() * torch.from_numpy(dx).double()
    return acc, terms.sum(1), terms.abs().sum(1)


def awkward_x(cols: int) -> torch.Tensor:
    """x with a zero block (scale 0: that block contributes nothing) and mixed magnitudes."""
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // 256).uniform_(-3, 2).repeat_interleave(256)
    x[256:512] = 0.0
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """The kernel's per-block integer sums are exact: under the interpreter (no FMA contraction) the
    same bits as the float32 steps on the exact sums; compiled, within float32 rounding of them."""
    rows, cols = (1031, 4096 + 768) if backend == "cuda" else (7, 768)
    raw = random_blocks(T.IQ4_XS, rows * cols // 256)
    x = awkward_x(cols)
    y = gemv(raw.to(backend), T.IQ4_XS, (rows, cols), x.to(backend), config=ROWS_TILE).cpu()
    acc, exact, size = integer_result(raw, rows, cols, x, backend)
    if backend == "cpu":
        assert torch.equal(y, acc)
    # float32 steps on exact integer sums: <= 3 roundings per super-block (19 here) plus the adds
    err = ((y.double() - exact).abs() / size).max().item()
    assert err < 2e-6, err


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "split-overrun", "wide", "rows"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_gemv_matches_reference_and_float_path(backend, config, monkeypatch):
    """Against the float64 reference (x rounded to Q8_K as llama.cpp does) and against the float
    path it replaced (SPARKD_IQ4_XS_INT=0's family, same rounded x), odd row counts (not a multiple
    of any tile); the decode shapes are the bench's (bench/iq4_xs_bench.py, err against float64)."""
    shapes = [(4099, 4096), (777, 768), (1, 256)] if backend == "cuda" else \
        [(5, 768), (1, 256)]
    for rows, cols in shapes:
        raw, x = random_blocks(T.IQ4_XS, rows * cols // 256).to(backend), torch.randn(cols)
        out = torch.full((rows,), float("nan"), device=backend)
        gemv(raw, T.IQ4_XS, (rows, cols), x.to(backend), out=out, config=config)
        W, xr = reference(raw, T.IQ4_XS, (rows, cols)), act_in(T.IQ4_XS, x)
        scale = W.abs() @ xr.abs()
        err = rel_err(out, W @ xr, scale)
        assert err < BOUNDS["fp32"], f"[{rows}, {cols}]: relative error {err:.2e}"
        with monkeypatch.context() as m:
            m.setitem(dispatch.FAMILIES, T.IQ4_XS, iq4_xs.FLOAT_FAMILY)
            flt = gemv(raw, T.IQ4_XS, (rows, cols), x.to(backend), config=config,
                       round_x=lambda v: round_activations(v, act_quant.Q8_K))
        assert rel_err(out, flt.cpu().double(), scale) < BOUNDS["fp32"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_decode_on_iq4_xs_experts(backend):
    """Gate/up and down both IQ4_XS (h quantized for the down's integer step), against float64:
    the MoE kernels take the family's step as they take Q4_K's and Q6_K's."""
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    table, gates, ups, downs = arena_table(T.IQ4_XS, T.IQ4_XS, dim, width, n, backend)
    x, w = torch.randn(dim), torch.rand(n)
    out = torch.full((dim,), float("nan"), device=backend)
    p = prepare(table, backend)
    assert p.gate_up.idot is iq4_xs.idot and p.down.idot is iq4_xs.idot
    moe_decode(p, x.to(backend), w.to(backend), "silu", out=out, **TILES[backend])
    err = moe_error(out, p, x.to(backend), w, gates, ups, downs, "silu", T.IQ4_XS, T.IQ4_XS,
                    TILES[backend].get("gate_up"))
    assert err < BOUNDS["fp32"], f"relative error {err:.2e}"


def test_switch_back_to_the_float_path():
    """SPARKD_IQ4_XS_INT=0 at import (tests/engine/test_switches.py) makes FLOAT_FAMILY dispatch's IQ4_XS
    family: no integer step (the caller rounds x, floats multiply)."""
    assert dispatch.family(T.IQ4_XS) is iq4_xs.FAMILY is iq4_xs.INT_FAMILY  # this process: the default
    assert iq4_xs.INT_FAMILY.act_fmt == act_quant.Q8_K and iq4_xs.FLOAT_FAMILY.idot is None


@pytest.mark.gpu
def test_prmt_and_dp4a_match_their_emulation():
    """The PTX prmt and dp4a and the interpreter's twins give the same bits (no split-K)."""
    rows, cols = 1031, 4096 + 768
    raw = random_blocks(T.IQ4_XS, rows * cols // 256).cuda()
    x = torch.randn(cols, device="cuda")
    for cfg in (GemvConfig(split=1), ROWS_TILE):
        got = [gemv(raw, T.IQ4_XS, (rows, cols), x, config=GemvConfig(**{**cfg.__dict__, "dp4a": asm}))
               for asm in (True, False)]
        assert torch.equal(*got)
