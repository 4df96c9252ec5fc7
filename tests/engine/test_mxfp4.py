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

from test_int_steps import ROWS_TILE  # noqa: E402
from test_iq_kernels import dequant_rows  # noqa: E402
from test_kernels import BACKENDS, numpy_rng, random_blocks  # noqa: E402

from sparkd.engine import quants  # noqa: E402
from sparkd.engine.kernels import act_quant  # noqa: E402
from sparkd.engine.kernels.matmul import gemv  # noqa: E402

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


def exact_sums(raw: torch.Tensor, rows: int, cols: int, x: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """(float64 of the exact per-block sums scale * d_x * sum kv[q] * xq, the sum of their magnitudes) per row, from
    the bytes by the format's definition (scale 2^(e - 128), kv the doubled values) and the kernel's own x."""
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_0)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0].reshape(-1, 32)
    dx = qx.scales.cpu().numpy()[0].astype(np.float64)
    b = raw.cpu().numpy().reshape(rows, cols // 32, 17).astype(np.int64)
    i = np.arange(32)
    q = DOUBLED[(b[:, :, 1 + i % 16] >> (4 * (i // 16))) & 0xF]
    scale = np.ldexp(1.0, b[:, :, 0] - 128)
    terms = (q * xq).sum(-1) * scale * dx  # [rows, blocks]
    return torch.from_numpy(terms.sum(1)), torch.from_numpy(np.abs(terms).sum(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """Per block the exact integer sum of the doubled values times x's quants, one float step each: within float32
    rounding of the exact result. Rows of 800 values (25 blocks: rows start at every byte alignment, the last group
    ends after one block)."""
    rows, cols = (1031, 4096 + 800) if backend == "cuda" else (7, 800)
    raw = random_blocks(T.MXFP4, rows * cols // 32)
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // 32).uniform_(-3, 2).repeat_interleave(32)
    x[64:96] = 0.0  # a zero block: scale 0
    for cfg in (ROWS_TILE, None):
        y = gemv(raw.to(backend), T.MXFP4, (rows, cols), x.to(backend), config=cfg).cpu()
        exact, size = exact_sums(raw, rows, cols, x, backend)
        err = ((y.double() - exact).abs() / size).max().item()
        assert err < 2e-6, err
