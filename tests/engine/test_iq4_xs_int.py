"""IQ4_XS's integer step (kernels/iq4_xs.py idot): the byte-permute table lookup against the table
for every index, the per-block integer sums exactly llama.cpp's (checked against an unpacking of
the blocks written here, value by value). The GEMV and the MoE decode against the float64
reference and the float path it replaces, the switch back and the PTX: test_int_steps.py.

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

from test_int_steps import ROWS_TILE, awkward_x, integer_result  # noqa: E402
from test_kernels import BACKENDS, numpy_rng, random_blocks  # noqa: E402

from sparkd.engine.kernels import iq4_xs  # noqa: E402
from sparkd.engine.kernels.matmul import gemv  # noqa: E402

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """The kernel's per-block integer sums are exact: under the interpreter (no FMA contraction) the
    same bits as the float32 steps on the exact sums; compiled, within float32 rounding of them."""
    rows, cols = (1031, 4096 + 768) if backend == "cuda" else (7, 768)
    raw = random_blocks(T.IQ4_XS, rows * cols // 256)
    x = awkward_x(cols)
    y = gemv(raw.to(backend), T.IQ4_XS, (rows, cols), x.to(backend), config=ROWS_TILE).cpu()
    acc, exact, size = integer_result(*unpack(raw, rows, cols), x, backend)
    if backend == "cpu":
        assert torch.equal(y, acc)
    # float32 steps on exact integer sums: <= 3 roundings per super-block (19 here) plus the adds
    err = ((y.double() - exact).abs() / size).max().item()
    assert err < 2e-6, err
