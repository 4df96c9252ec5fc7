"""Q8_0 expert matrices with each 256-value group's 68 words reordered at load (session 18, moe41), so that
q8_0_words' step reads its lanes' words as 128-bit loads instead of 32-bit ones.

In GGUF bytes a group is 4 pairs of 34-byte blocks, 17 words a pair on 4-byte rows (q8_0_words): lane l of the
even block reads pair word l + 1 (plus word 0, its head: scale and quants 0-1, in lane 0), lane l of the odd block
pair word 9 + l (its scale is in the even block's lane-7 word). A lane's 8 words start on 16 bytes only in one pair
of four, so the step loads 32 bits a lane. Here a group is the 64 lane words in (block, lane) order, then the 4
even heads: the same 272 bytes, rows and offsets unchanged, every block's lane words one 32-byte run. The step
(q8_0_words.idot_perm) computes on the very same words, so the same integer sums and floats: the same bits.
Only the MoE decode's integer launches take it (moe.perm_experts); dequant serves a reference and tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import q8_0_words
from sparkd.engine.kernels.act_quant import Q8_0
from sparkd.engine.kernels.family import Family, KernelArgumentError, LayoutType

PERM = LayoutType("Q8_0_PERM")
GROUP_WORDS = 68
# permuted word i of a group holds GGUF word ORDER[i]: block s lane l (s even: pair word l + 1, odd: 9 + l), heads
ORDER = [17 * (s // 2) + (1 + lane if s % 2 == 0 else 9 + lane) for s in range(8) for lane in range(8)] + \
    [17 * p for p in range(4)]


def packable(shape: tuple[int, int]) -> bool:
    """Whether a [rows, cols] Q8_0 matrix has whole groups (cols a multiple of 256)."""
    return shape[1] % 256 == 0


def pack_raw(raw: torch.Tensor, shape: tuple[int, int], inverse: bool = False) -> torch.Tensor:
    """GGUF Q8_0 blocks of W [rows, cols] (uint8 1-D, any device) -> the permuted bytes (inverse: back), a new
    tensor on the same device."""
    rows, cols = shape
    if not packable(shape) or raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != rows * cols // 32 * 34:
        raise KernelArgumentError(f"could not permute Q8_0 words: need {rows * cols // 32 * 34} bytes (1-D uint8) of "
                                  f"[{rows}, {cols}] with whole 256-value groups, got {raw.dtype} {list(raw.shape)}")
    order = torch.tensor(ORDER, device=raw.device)
    if inverse:
        order = torch.argsort(order)
    words = raw.view(torch.int32).view(-1, GROUP_WORDS)
    return words[:, order].reshape(-1).view(torch.uint8)


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """q8_0.dequant on permuted rows: byte k of the GGUF group is byte k % 4 of GGUF word k // 4, found in ORDER."""
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    grp = w_ptr + row_off + g * 272  # [BN, 1, 1]
    d = tl.load((grp + _where(34 * s) + 34 * s % 4).to(tl.pointer_type(tl.float16)), mask=smask,
                other=0.0).to(tl.float32)
    k = 34 * s + 2 + i
    q = tl.load((grp + _where(k) + k % 4).to(tl.pointer_type(tl.int8)), mask=smask, other=0)
    return q.to(tl.float32) * d


@triton.jit
def _where(k):
    """Byte offset in a permuted group of the word that holds GGUF group byte k."""
    w = k // 4
    p = w // 17
    r = w % 17
    return tl.where(r == 0, 64 + p, 16 * p + r - 1) * 4  # a head, else block 2p's lane r - 1 (r > 8: 2p + 1's)


FAMILY = Family(PERM, 32, 34, 8, 32, dequant, align=16, idot=q8_0_words.idot_perm, act_fmt=Q8_0, iacc=(8, 8))
