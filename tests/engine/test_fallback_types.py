"""The 32-value types llama-quantize falls back to where a file's rows are not whole 256-value groups (session 35:
kernels/q5_0.py, iq4_nl.py, q5_1.py; MLA's 128-wide attn_k_b): Q5_0's and IQ4_NL's integer steps give llama.cpp's
per-block integer sums, against an unpacking of the blocks written here value by value. The GEMV and GEMM of all
three against the float64 reference: test_kernels.py (TYPES and INT8_LAYOUTS take them).

Interpreter (TRITON_INTERPRET=1, emulated dp4a and prmt) where there is no GPU; marker gpu for the asm. The blocks'
18 and 22 bytes put rows and blocks 2 bytes off 4-byte alignment (the 16-bit loads the words are built from).
"""

import os

import gguf.quants as gq
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

KVALUES = np.array(gq.IQ4_NL.kvalues, dtype=np.int64)  # ggml's kvalues_iq4nl


def _d(b: np.ndarray) -> np.ndarray:
    return b[:, :, 0:2].copy().view(np.float16).astype(np.float64)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    i = np.arange(32)
    return (qs[:, :, i % 16].astype(np.int64) >> (4 * (i // 16))) & 0xF


def q5_0_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q - 16 int64 [rows, blocks, 32], d float64 [rows, blocks]) of Q5_0 blocks b (uint8 [rows, blocks, 22])."""
    qh = b[:, :, 2:6].copy().view(np.uint32).astype(np.int64)  # [rows, blocks, 1]
    return (_nibbles(b[:, :, 6:]) | (((qh >> np.arange(32)) & 1) << 4)) - 16, _d(b)


def iq4_nl_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table values int64 [rows, blocks, 32], d float64 [rows, blocks]) of IQ4_NL blocks b (uint8 [.., 18])."""
    return KVALUES[_nibbles(b[:, :, 2:])], _d(b)


@pytest.mark.parametrize("qtype, block_bytes, values", [(T.Q5_0, 22, q5_0_values), (T.IQ4_NL, 18, iq4_nl_values)],
                         ids=["Q5_0", "IQ4_NL"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend, qtype, block_bytes, values):
    """Per block the exact integer sum, one float step each: within float32 rounding of the exact result."""
    err = integer_sums_error(backend, qtype, block_bytes, values)
    assert err < 2e-6, err
