"""A matrix's blocks as float32 values on the device in one launch: for products the kernels do not run (MLA's prompt
contracts its per-head k matrices along their rows: KernelLinear.dense). Each program writes BLOCK_N rows of one
256-value group through the family's dequant, the GEMM's tile (so every layout the kernels read works).

Session 35: the float GEMM times the identity did the same at ~1 and ~15 ms for DeepSeek V3's attn_k_b (Q5_0) and
attn_v_b (Q4_K) on the H200, a layer's prompt; this is a copy's time (bench/gpu_box/mla_heads_bench.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import dispatch
from sparkd.engine.kernels.matmul import aux_arg

BLOCK_N = 16


@triton.jit
def _dequantize_kernel(w_ptr, aux_ptr, y_ptr, N, K, row_bytes, DEQ: tl.constexpr, NSUB: tl.constexpr,
                       SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None, None]  # [BN, 1, 1]
    g = tl.program_id(1)
    first = g * (NSUB * SUBLEN) + tl.arange(0, NSUB)[None, :, None] * SUBLEN  # [1, NSUB, 1]: each sub-block's column
    smask = (rows < N) & (first < K)
    values = DEQ(w_ptr, aux_ptr, rows * row_bytes, g, smask)  # [BN, NSUB, SUBLEN]
    tl.store(y_ptr + rows * K + first + tl.arange(0, SUBLEN)[None, None, :], values, mask=smask)


def dequantize(weight: torch.Tensor, qtype, shape: tuple[int, int]) -> torch.Tensor:
    """W [rows, cols] as float32 on weight's device (a new tensor): weight the raw blocks of a kernel layout."""
    what = f"the {qtype.name} dequantization"
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(weight, what, fam.align)
    if weight.numel() != rows * row_bytes or rows % fam.row_tile:
        raise dispatch.KernelArgumentError(f"could not run {what}: need {rows * row_bytes} weight bytes in whole "
                                           f"tiles of {fam.row_tile} rows for [{rows}, {cols}], got "
                                           f"{weight.numel()} bytes")
    y = torch.empty(rows, cols, dtype=torch.float32, device=weight.device)
    group = fam.nsub * fam.sublen
    grid = (triton.cdiv(rows, BLOCK_N), triton.cdiv(cols, group))
    _dequantize_kernel[grid](weight, aux_arg(fam, cols, weight.device), y, rows, cols, row_bytes, DEQ=fam.dequant,
                             NSUB=fam.nsub, SUBLEN=fam.sublen, BLOCK_N=BLOCK_N, num_warps=4)
    return y
