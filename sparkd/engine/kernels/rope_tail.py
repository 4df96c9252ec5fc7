"""DeepSeek V4's rope on the last n_rot dims of each head (layers/kv_compressor.py rope_tail, its torch code the
reference) in one launch: a program per (token, head) row, the leading dims copied, each interleaved pair
(2i, 2i + 1) of the tail rotated by the row's angle i. The torch code is ~9 launches a call and a decode step
makes ~4 calls a layer (q, the key row, the output's inverse, the indexer's q): session 33 measured the
DeepSeek-V4-Flash-shaped graph step at 0.76 of llama.cpp's with them. The products and the difference round one
at a time (no fused multiply-add), as torch's launches do: the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_tail_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, D: tl.constexpr, N_ROT: tl.constexpr,
                      BLOCK: tl.constexpr, SIGN: tl.constexpr):
    row = tl.program_id(0)  # token t = row // H
    t = row // H
    d = tl.arange(0, BLOCK)
    inside = d < D
    rot = inside & (d >= D - N_ROT)
    j = d - (D - N_ROT)  # place in the tail: pair j // 2, its even (a) or odd (b) member
    x = tl.load(x_ptr + row * D + d, mask=inside, other=0.0)
    partner = tl.load(x_ptr + row * D + (D - N_ROT) + (j ^ 1), mask=rot, other=0.0)
    c = tl.load(cos_ptr + t * (N_ROT // 2) + j // 2, mask=rot, other=1.0)
    s = tl.load(sin_ptr + t * (N_ROT // 2) + j // 2, mask=rot, other=0.0) * SIGN
    even = (j % 2) == 0
    out = tl.where(even, x * c - partner * s, partner * s + x * c)  # a c - b s, a s + b c
    tl.store(out_ptr + row * D + d, tl.where(rot, out, x), mask=inside)


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [T, H, D] float32 with its last 2 cos.shape[1] dims rotated in interleaved pairs by the angles of cos, sin
    [T, n_rot / 2] (float32, on x's device); inverse: by minus them. A new tensor."""
    T, H, D = x.shape
    n_rot = 2 * cos.shape[1]
    x = x.contiguous()
    out = torch.empty_like(x)
    _rope_tail_kernel[(T * H,)](x, cos.contiguous(), sin.contiguous(), out, H, D=D, N_ROT=n_rot,
                                BLOCK=triton.next_power_of_2(D), SIGN=-1.0 if inverse else 1.0, num_warps=4,
                                enable_fp_fusion=False)
    return out
