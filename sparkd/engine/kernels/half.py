"""F16 and BF16 weights as kernel families: the file's 16-bit values multiplied where they lie, in float32.

Files keep weights 16-bit where they are not quantized: a converter's F16 or BF16 output (gpt-oss's "F16" files,
whose experts stay MXFP4 and whose attention, embedding and output head are F16), and make-model's fallback for rows a
K-quant block does not divide. Held as float32 on the GPU these cost twice their bytes in memory and in every
token's reads; here they stay as they are.

The generic kernels see a 32-value run (64 bytes) as a block: a row must be whole runs (dispatch.multiplies), and a
row ending inside a 256-value group is masked as Q8_0's is. BF16 is float32's top half: its bits shifted up.

A prompt's GEMM runs tl.dot at tf32 (Family.tf32_exact): both types' values are tf32 values, and x comes rounded to the
weight's type (llama.cpp's vec_dot type for F16 and BF16 is the type itself), so every product is exact and the sums
float32's, at the tensor cores' rate where "ieee" runs float32 FMAs.
"""

import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType as T

from sparkd.engine.kernels.family import Family


@triton.jit
def _values_at(w_ptr, row_off, g):
    """[BN, 8, 32] addresses of group g's values (runs of 32, 2 bytes each)."""
    k = (g * 8 + tl.arange(0, 8)[None, :, None]) * 32 + tl.arange(0, 32)[None, None, :]
    return w_ptr + row_off + k * 2


@triton.jit
def dequant_f16(w_ptr, aux_ptr, row_off, g, smask):
    at = _values_at(w_ptr, row_off, g).to(tl.pointer_type(tl.float16))
    return tl.load(at, mask=smask, other=0.0).to(tl.float32)


@triton.jit
def dequant_bf16(w_ptr, aux_ptr, row_off, g, smask):
    bits = tl.load(_values_at(w_ptr, row_off, g).to(tl.pointer_type(tl.uint16)), mask=smask, other=0)
    return (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)


F16 = Family(T.F16, 32, 64, 8, 32, dequant_f16, tf32_exact=True)
BF16 = Family(T.BF16, 32, 64, 8, 32, dequant_bf16, tf32_exact=True)
