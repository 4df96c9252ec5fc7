"""Q5_0's integer step (kernels/q5_0.py idot, session 35): the per-block integer sums llama.cpp's, against an
unpacking of the blocks written here value by value (q's fifth bit from qh, -16). The GEMV and GEMM against the
float64 reference: test_kernels.py (TYPES and INT8_LAYOUTS take Q5_0).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm. 22-byte blocks put
rows and blocks 2 bytes off 4-byte alignment (the 16-bit loads qh and the qs words are built from).
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

from test_kernels import BACKENDS  # noqa: E402
from test_q4_0_int import integer_sums_error  # noqa: E402


def q5_0_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q - 16 int64 [rows, blocks, 32], d float64 [rows, blocks]) of Q5_0 blocks b (uint8 [rows, blocks, 22])."""
    i = np.arange(32)
    qh = b[:, :, 2:6].copy().view(np.uint32).astype(np.int64)  # [rows, blocks, 1]
    low = (b[:, :, 6 + i % 16].astype(np.int64) >> (4 * (i // 16))) & 0xF
    q = low | (((qh >> i) & 1) << 4)
    return q - 16, b[:, :, 0:2].copy().view(np.float16).astype(np.float64)[..., 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """Per block the exact integer sum, one float step each: within float32 rounding of the exact result."""
    err = integer_sums_error(backend, T.Q5_0, 22, q5_0_values)
    assert err < 2e-6, err
