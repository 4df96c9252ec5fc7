"""y = x @ W.T for a long prompt on CUDA through cuBLAS (session 46): W's GGUF blocks dequantized a slab of rows at a
time into 16-bit values (dequantize.py), x rounded to the same type, the tensor cores' exact products summed in float32
into a float32 result (torch.mm's out_dtype), as KernelLinear already multiplies F16 / BF16 files (linear.HALF_PROMPT).

Why: the integer GEMM (prefill_gemm) scales every 32-value block's int32 sums in float, and at thousands of rows that
bookkeeping, not the tensor cores, sets its pace: session 32's 5-layer DeepSeek-V3-shaped 8000-token prompt spent
499 of its 1036 ms in it, ~70 TOPS on a card that multiplies int8 at ~2000. Dequantizing costs a copy of the weight's
bytes, paid once per prompt and matrix, so from some hundreds of rows on it is small beside the product.

The scratch: at most SLAB_BYTES of 16-bit values at a time (a slab of whole row tiles; one slab where the matrix fits),
beside the float32 output the caller keeps anyway. bfloat16 (the default) keeps float32's range: activations past
float16's 65504 (a down projection's input can reach it) round instead of overflowing; its 8 bits of mantissa are
finer than x's int8 blocks (a 32-value block's step is its largest value / 127). float16's 11 bits are finer still,
for weights and activations known to fit.

The CPU (tests, under TRITON_INTERPRET=1) has no 16-bit mm with a float32 result: it widens the rounded values and
multiplies in float32, the same products summed in another order.
"""

from __future__ import annotations

import math

import torch

from sparkd.engine.kernels import SLAB_TYPES, dispatch
from sparkd.engine.kernels.dequantize import dequantize

SLAB_BYTES = 64 << 20
# a slab's rows a multiple of this: cuBLAS takes other widths on slower kernels (session 46, H100: slabs of 4681 and
# 1820 rows 2.7x and 2.4x slower than one slab of the whole matrix, 4608-row slabs as fast)
SLAB_ALIGN = 128


def slab_rows(fam: dispatch.Family, rows: int, cols: int, slab_bytes: int = SLAB_BYTES) -> int:
    """W's rows per slab: all of them where slab_bytes of 16-bit values hold them, else the most a multiple of
    SLAB_ALIGN rows (and of the layout's row tile) that fit, at least one such step."""
    if rows * cols * 2 <= slab_bytes:
        return rows
    step = math.lcm(SLAB_ALIGN, fam.row_tile)
    return min(rows, max(1, slab_bytes // (2 * cols * step)) * step)


def slab_gemm(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
              slab_bytes: int = SLAB_BYTES) -> torch.Tensor:
    """y float32 [T, rows] = x [T, cols] @ W.T with W (raw GGUF blocks of a kernel layout, [rows, cols]) and x rounded
    to dtype (SLAB_TYPES' values) a slab of W's rows at a time."""
    what = f"the {qtype.name} slab GEMM"
    if dtype not in SLAB_TYPES.values():
        raise dispatch.KernelArgumentError(f"could not run {what}: dtype {dtype} is not one of "
                                           f"{', '.join(map(str, SLAB_TYPES.values()))}")
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_matrix(weight, fam, shape, what)
    dispatch.check_activations(x, cols, what)
    if x.dim() != 2:
        raise dispatch.KernelArgumentError(f"could not run {what}: need x [T, {cols}], got {list(x.shape)}")
    if rows == 0:
        return torch.empty(x.shape[0], 0, dtype=torch.float32, device=x.device)
    xh = x.to(dtype)
    step = slab_rows(fam, rows, cols, slab_bytes)
    y = None if step == rows else torch.empty(x.shape[0], rows, dtype=torch.float32, device=x.device)
    for first in range(0, rows, step):
        n = min(step, rows - first)
        w = dequantize(weight[first * row_bytes:(first + n) * row_bytes], qtype, (n, cols), dtype=dtype)
        part = torch.mm(xh, w.T, out_dtype=torch.float32) if x.is_cuda else torch.mm(xh.float(), w.float().T)
        if y is None:
            return part
        y[:, first:first + n] = part
    return y
