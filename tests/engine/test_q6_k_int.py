"""Q6_K's integer step (kernels/q6_k.py idot): the per-block integer sums exactly llama.cpp's
(checked against an unpacking of the blocks written here, value by value). The GEMV against the
float64 reference and the float path it replaces, and the switch back: test_int_steps.py.

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

from test_int_steps import ROWS_TILE, awkward_x  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import act_quant  # noqa: E402
from sparkd.engine.kernels.matmul import gemv  # noqa: E402


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
    x = awkward_x(cols)
    y = gemv(raw.to(backend), T.Q6_K, (rows, cols), x.to(backend), config=ROWS_TILE).cpu()
    acc, exact, size = integer_result(raw, rows, cols, x, backend)
    if backend == "cpu":
        assert torch.equal(y, acc)
    # float32 steps on exact integer sums: <= 3 roundings per super-block (11 here) plus the adds
    err = ((y.double() - exact).abs() / size).max().item()
    assert err < 2e-6, err
