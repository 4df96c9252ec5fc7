"""F16 and BF16 weights as kernel families: the file's 16-bit values multiplied where they lie, in float32.

Files keep weights 16-bit where they are not quantized: a converter's F16 or BF16 output (gpt-oss's "F16" files,
whose experts stay MXFP4 and whose attention, embedding and output head are F16), and make-model's fallback for rows a
K-quant block does not divide. Held as float32 on the GPU these cost twice their bytes in memory and in every
token's reads; here they stay as they are.

The generic kernels see a 32-value run (64 bytes) as a block: a row must be whole runs (dispatch.multiplies), and a
row ending inside a 256-value group is masked as Q8_0's is. BF16 is float32's top half: its bits shifted up.

The GEMV's step (`dot`) takes a group's 256 values a row as one [BN, 256] tile into an elementwise accumulator, one
row a warp (matmul.GEMV_TILES), each thread's 8 values one 128-bit load (_load). bench/gpu_box/half_gemv_sweep.py, H100
(session 41): 0.95-1.04 of copy bandwidth at 14336x4096, 4096x14336 and gpt-oss's head, where cuBLAS's torch.mv on the
16-bit matrix reaches 0.88-0.96 and rounds x and the output to 16 bits (session 36's 0.63-0.71 on the H200 loaded 16
bits at a time; the dequant path's [BN, 8, 32] tile reduced every group took 0.18).

A prompt's GEMM runs tl.dot at tf32 (Family.tf32_exact): both types' values are tf32 values, and x comes rounded to the
weight's type (llama.cpp's vec_dot type for F16 and BF16 is the type itself), so every product is exact and the sums
float32's, at the tensor cores' rate where "ieee" runs float32 FMAs.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def _load(w_ptr, row_off, k, mask, BF: tl.constexpr):
    """float32 values of columns k of the rows at byte offsets row_off. The pointer takes the 16-bit type before the
    columns are added, so a thread's 8 neighbouring values are one 128-bit load; indexed in bytes (w_ptr + 2 k) they
    were 8 loads of 16 bits (session 41, bench/gpu_box/half_gemv_sweep.py)."""
    if BF:
        bits = tl.load((w_ptr + row_off).to(tl.pointer_type(tl.uint16)) + k, mask=mask, other=0)
        v = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        v = tl.load((w_ptr + row_off).to(tl.pointer_type(tl.float16)) + k, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def _group_cols(g):
    """[1, 8, 32] columns of group g's values (runs of 32)."""
    return (g * 8 + tl.arange(0, 8)[None, :, None]) * 32 + tl.arange(0, 32)[None, None, :]


@triton.jit
def dequant_f16(w_ptr, aux_ptr, row_off, g, smask):
    return _load(w_ptr, row_off, _group_cols(g), smask, False)


@triton.jit
def dequant_bf16(w_ptr, aux_ptr, row_off, g, smask):
    return _load(w_ptr, row_off, _group_cols(g), smask, True)


@triton.jit
def acc0(rmask, EW: tl.constexpr):
    if EW:
        acc = tl.zeros((rmask.shape[0], 256), tl.float32)
    else:
        acc = tl.zeros(rmask.shape, tl.float32)
    return acc


@triton.jit
def total(acc, EW: tl.constexpr):
    if EW:
        acc = tl.sum(acc, 1)
    return acc


@triton.jit
def _dot(w_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr, BF: tl.constexpr):
    """The GEMV step: group g's 256 values a row as one contiguous [BN, 256] tile, its products added to the
    elementwise tile (EW, reduced once after the loop) or to the row sums (the dequant path's [BN, 8, 32] tile
    reduced every group: 0.18 of copy bandwidth on the H200, session 36)."""
    k = g * 256 + tl.arange(0, 256)[None, :]  # [1, 256] columns (runs end inside a group: masked as Q8_0's)
    kmask = k < K
    w = _load(w_ptr, row_off[:, None], k, rmask[:, None] & kmask, BF)
    wx = w * tl.load(x_ptr + k, mask=kmask, other=0.0)
    if EW:
        acc += wx
    else:
        acc += tl.sum(wx, 1)
    return acc


@triton.jit
def dot_f16(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    return _dot(w_ptr, row_off, rmask, x_ptr, g, K, acc, EW, False)


@triton.jit
def dot_bf16(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW: tl.constexpr):
    return _dot(w_ptr, row_off, rmask, x_ptr, g, K, acc, EW, True)


F16 = Family(T.F16, 32, 64, 8, 32, dequant_f16, dot_f16, acc0, total, tf32_exact=True)
BF16 = Family(T.BF16, 32, 64, 8, 32, dequant_bf16, dot_bf16, acc0, total, tf32_exact=True)
