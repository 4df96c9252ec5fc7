"""Q4_0's integer step (kernels/q4_0.py idot): the per-block integer sums llama.cpp's (against an
unpacking of the blocks written here, value by value). The GEMV and the MoE decode against the
float64 reference and the float path it replaces, the switch back and the PTX: test_int_steps.py.

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

from test_int_steps import ROWS_TILE  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import act_quant  # noqa: E402
from sparkd.engine.kernels.matmul import gemv  # noqa: E402


def q4_0_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q - 8 int64 [rows, blocks, 32], d float64 [rows, blocks]) of Q4_0 blocks b (uint8 [rows, blocks, 18])."""
    i = np.arange(32)
    q = ((b[:, :, 2 + i % 16].astype(np.int64) >> (4 * (i // 16))) & 0xF) - 8
    return q, b[:, :, 0:2].copy().view(np.float16).astype(np.float64)[..., 0]


def exact_sums(raw: torch.Tensor, rows: int, cols: int, x: torch.Tensor, backend: str, block_bytes: int = 18,
               values=q4_0_values) -> tuple[torch.Tensor, ...]:
    """(float64 of the exact per-block sums d * d_x * sum q * xq, the sum of their magnitudes) per row, from the
    bytes by the format's definition (values: a block's integers and scale) and the kernel's own x (act_quant:
    exact)."""
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_0)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0].reshape(-1, 32)
    dx = qx.scales.cpu().numpy()[0].astype(np.float64)
    q, d = values(raw.cpu().numpy().reshape(rows, cols // 32, block_bytes))
    terms = (q * xq).sum(-1) * d * dx  # [rows, blocks]: exact integer sums times the two scales
    return torch.from_numpy(terms.sum(1)), torch.from_numpy(np.abs(terms).sum(1))


def integer_sums_error(backend: str, qtype: T, block_bytes: int, values) -> float:
    """The GEMV (ROWS_TILE and the default tile) against exact_sums: the largest error relative to the terms'
    magnitudes. Rows of 800 values end 1 block into their last group; x with a zero block (scale 0)."""
    rows, cols = (1031, 4096 + 800) if backend == "cuda" else (7, 800)
    raw = random_blocks(qtype, rows * cols // 32)
    x = torch.randn(cols) * 10.0 ** torch.empty(cols // 32).uniform_(-3, 2).repeat_interleave(32)
    x[64:96] = 0.0  # a zero block: scale 0
    err = 0.0
    for cfg in (ROWS_TILE, None):
        y = gemv(raw.to(backend), qtype, (rows, cols), x.to(backend), config=cfg).cpu()
        exact, size = exact_sums(raw, rows, cols, x, backend, block_bytes, values)
        err = max(err, ((y.double() - exact).abs() / size).max().item())
    return err


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend):
    """Per block the exact integer sum, one float step each: within float32 rounding of the exact
    result (the float path's error is against the float values, not these sums)."""
    err = integer_sums_error(backend, T.Q4_0, 18, q4_0_values)
    assert err < 2e-6, err
