"""A matrix's blocks, or some of its rows, as float32 values on the device in one launch: for products the kernels do
not run (MLA's prompt contracts its per-head k matrices along their rows: KernelLinear.dense) and for the token
embedding's lookups (layers/embedding.py). Each program writes BLOCK_N rows of one 256-value group through the
family's dequant, the GEMM's tile (so every layout the kernels read works).

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
def _dequantize_kernel(w_ptr, aux_ptr, ids_ptr, y_ptr, N, M, K, row_bytes, DEQ: tl.constexpr, NSUB: tl.constexpr,
                       SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr):
    out = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None, None]  # [BN, 1, 1]: y's rows
    omask = out < M
    if GATHER:  # y's row i is W's row ids[i]; ids outside W read nothing and come back as zeros
        rows = tl.load(ids_ptr + out, mask=omask, other=-1).to(tl.int64)
    else:
        rows = out
    g = tl.program_id(1)
    first = g * (NSUB * SUBLEN) + tl.arange(0, NSUB)[None, :, None] * SUBLEN  # [1, NSUB, 1]: each sub-block's column
    values = DEQ(w_ptr, aux_ptr, rows * row_bytes, g, omask & (rows >= 0) & (rows < N) & (first < K))
    if y_ptr.dtype.element_ty == tl.bfloat16:  # to nearest, ties to even, by hand: the interpreter's cast truncates
        bits = values.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        values = bits.to(tl.float32, bitcast=True)  # now a bfloat16 value: the store's cast is exact
    tl.store(y_ptr + out * K + first + tl.arange(0, SUBLEN)[None, None, :], values, mask=omask & (first < K))


def dequantize(weight: torch.Tensor, qtype, shape: tuple[int, int], ids: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [rows, cols] as float32 on weight's device (a new tensor): weight the raw blocks of a kernel layout. ids
    (integers [n] on that device): W's rows ids only, [n, cols] (an embedding lookup; an id outside W gives zeros:
    callers check token ids first). dtype: the values rounded to a 16-bit float type instead (slab_gemm's)."""
    what = f"the {qtype.name} dequantization"
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_matrix(weight, fam, shape, what)
    if ids is not None and (ids.dim() != 1 or ids.dtype.is_floating_point or ids.is_complex()
                            or ids.device != weight.device):
        raise dispatch.KernelArgumentError(f"could not run {what}: row ids must be integers [n] on {weight.device}, "
                                           f"got {ids.dtype} of shape {list(ids.shape)} on {ids.device}")
    n = rows if ids is None else ids.numel()
    y = torch.empty(n, cols, dtype=dtype, device=weight.device)
    if n == 0:
        return y
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(cols, fam.nsub * fam.sublen))
    _dequantize_kernel[grid](weight, aux_arg(fam, cols, weight.device), y if ids is None else ids.contiguous(), y,
                             rows, n, cols, row_bytes, DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
                             BLOCK_N=BLOCK_N, GATHER=ids is not None, num_warps=4)
    return y
