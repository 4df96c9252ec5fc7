"""MXFP4 (kernels/mxfp4.py, gpt-oss's experts): the Triton dequant bit for bit against the CPU reference for every
e8m0 scale byte and every nibble, and the integer step's per-block sums llama.cpp's (against an unpacking of the
blocks written here). The GEMV and the MoE decode against the float64 reference and the float path, the switch back
and the PTX: test_int_steps.py; the GEMMs and the MoE pair: test_kernels.py.

Interpreter (TRITON_INTERPRET=1, emulated dp4a and prmt) where there is no GPU. 17-byte blocks: odd block counts put
rows at every byte alignment.
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

from test_iq_kernels import dequant_rows  # noqa: E402
from test_kernels import BACKENDS, numpy_rng, random_blocks  # noqa: E402
from test_q4_0_int import integer_sums_error  # noqa: E402

from sparkd.engine import quants  # noqa: E402

# ggml's kvalues_mxfp4: the e2m1 values doubled, as int8
DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequant_is_the_reference_for_every_scale_and_nibble(backend):
    """Blocks with every e8m0 byte 0-254 (0 and 1: the subnormal halves) and every nibble in both halves: the same
    bits as the CPU reference (gguf's arithmetic)."""
    rows = 255 * 16 // 256 * 8 + 8  # 8-block rows of 256 values covering 255 scale bytes, whole rows
    raw = random_blocks(T.MXFP4, rows * 8).reshape(-1, 17)
    raw[:, 0] = torch.from_numpy((np.arange(raw.shape[0]) % 255).astype(np.uint8))
    nib = numpy_rng().permutation(np.arange(raw.shape[0] * 32) % 16).reshape(-1, 32)
    raw[:, 1:] = torch.from_numpy((nib[:, :16] | (nib[:, 16:] << 4)).astype(np.uint8))
    raw = raw.reshape(-1).contiguous()
    got = dequant_rows(raw.to(backend), T.MXFP4, rows, 256, block_n=4)
    want = quants.dequantize(raw, T.MXFP4, (rows, 256))
    assert torch.equal(got[:rows], want), int((got[:rows] != want).sum())


def mxfp4_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the doubled e2m1 values int64 [rows, blocks, 32], the halved scale 2^(e - 128) float64 [rows, blocks]) of
    MXFP4 blocks b (uint8 [rows, blocks, 17]), by the format's definition."""
    b = b.astype(np.int64)
    i = np.arange(32)
    return DOUBLED[(b[:, :, 1 + i % 16] >> (4 * (i // 16))) & 0xF], np.ldexp(1.0, b[:, :, 0] - 128)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """Per block the exact integer sum of the doubled values times x's quants, one float step each: within float32
    rounding of the exact result (test_q4_0_int's check; rows of 25 blocks start at every byte alignment)."""
    err = integer_sums_error(backend, T.MXFP4, 17, mxfp4_values)
    assert err < 2e-6, err
