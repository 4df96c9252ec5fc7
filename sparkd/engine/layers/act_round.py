"""Activations rounded the way llama.cpp's CPU matmuls see them.

ggml multiplies a quantized weight by activations it first converts to the weight's "vec_dot"
type: Q8_0 blocks of 32 (f16 scale) for the Q4_0/Q5_0/Q8_0 family, Q8_K blocks of 256 (f32
scale) for the K- and most IQ quants, f16 or bf16 for those float weights. The dot product is
then exact integer work per block, so fake-quantizing x (quantize, dequantize) and multiplying
in f32 lands within float rounding of llama.cpp, where plain f32 activations differ by ~1e-3 and
flip close greedy picks. `None` means f32 activations (F32 weights, or rows that fit no block).
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType as Q

Q8_0, Q8_1, Q8_K, F16, BF16 = "q8_0", "q8_1", "q8_k", "f16", "bf16"

# ggml-cpu's type_traits_cpu[...].vec_dot_type, for the weight types a GGUF may carry
_VEC_DOT = {
    Q.F16: F16, Q.BF16: BF16,
    Q.Q4_0: Q8_0, Q.Q5_0: Q8_0, Q.Q8_0: Q8_0, Q.IQ4_NL: Q8_0, Q.MXFP4: Q8_0,
    Q.Q4_1: Q8_1, Q.Q5_1: Q8_1,
    Q.Q2_K: Q8_K, Q.Q3_K: Q8_K, Q.Q4_K: Q8_K, Q.Q5_K: Q8_K, Q.Q6_K: Q8_K,
    Q.IQ2_XXS: Q8_K, Q.IQ2_XS: Q8_K, Q.IQ2_S: Q8_K, Q.IQ3_XXS: Q8_K, Q.IQ3_S: Q8_K,
    Q.IQ1_S: Q8_K, Q.IQ1_M: Q8_K, Q.IQ4_XS: Q8_K, Q.TQ1_0: Q8_K, Q.TQ2_0: Q8_K,
}
_BLOCK = {Q8_0: 32, Q8_1: 32, Q8_K: 256}


def vec_dot_format(weight_type: Q) -> str | None:
    return _VEC_DOT.get(weight_type)


def round_activations(x: torch.Tensor, fmt: str | None) -> torch.Tensor:
    """x [..., K] as ggml would feed it to a matmul against a weight whose vec_dot type is fmt."""
    if fmt is None:
        return x
    if fmt == F16:
        return x.half().to(x.dtype)
    if fmt == BF16:
        return x.bfloat16().to(x.dtype)
    block = _BLOCK[fmt]
    if x.shape[-1] % block:
        return x  # ggml refuses such a matmul; the loader never builds one
    xb = x.float().reshape(*x.shape[:-1], -1, block)  # [..., K/B, B]
    out = _q8_k(xb) if fmt == Q8_K else _q8_0(xb)
    return out.reshape(x.shape).to(x.dtype)


def _q8_0(xb: torch.Tensor) -> torch.Tensor:
    # quantize_row_q8_0 (x86): d = amax/127 stored as f16, q = round-half-even(x * 127/amax)
    amax = xb.abs().amax(-1, keepdim=True)
    d = (amax / 127.0).half().float()
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(xb * inv) * d


def _q8_k(xb: torch.Tensor) -> torch.Tensor:
    # quantize_row_q8_K_ref: the signed value of largest magnitude maps to -127, d = 1/iscale (f32)
    idx = xb.abs().argmax(-1, keepdim=True)
    mx = xb.gather(-1, idx)
    safe = torch.where(mx != 0, mx, torch.ones_like(mx))
    iscale = -127.0 / safe
    q = torch.round(iscale * xb).clamp(max=127)
    return torch.where(mx != 0, q * (1.0 / iscale), torch.zeros_like(xb))
