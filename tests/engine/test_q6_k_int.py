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

from test_int_steps import ROWS_TILE, awkward_x, integer_result  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """The kernel's per-block integer sums are exact: under the interpreter (no FMA contraction) the
    same bits as the float32 steps on the exact sums; compiled, within float32 rounding of them."""
    rows, cols = (1031, 2048 + 768) if backend == "cuda" else (7, 768)
    raw = random_blocks(T.Q6_K, rows * cols // 256)
    x = awkward_x(cols)
    y = gemv(raw.to(backend), T.Q6_K, (rows, cols), x.to(backend), config=ROWS_TILE).cpu()
    acc, exact, size = integer_result(*unpack(raw, rows, cols), x, backend)
    if backend == "cpu":
        assert torch.equal(y, acc)
    # float32 steps on exact integer sums: <= 3 roundings per super-block (11 here) plus the adds
    err = ((y.double() - exact).abs() / size).max().item()
    assert err < 2e-6, err
